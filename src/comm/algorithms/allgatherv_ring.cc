#include <cstring>

#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/ring_pipeline.h"

namespace chorus::algorithms {

void allgatherv_ring(const Context& ctx, const void* in, void* out,
                     std::span<const size_t> counts, std::span<const size_t> displs) {
  auto* dst = static_cast<uint8_t*>(out);
  uint8_t* own = dst + displs[ctx.rank] * ctx.elem;
  size_t own_bytes = counts[ctx.rank] * ctx.elem;
  if (own != in && own_bytes > 0) std::memmove(own, in, own_bytes);
  if (ctx.size == 1) return;
  RingPlan plan;
  for (int c = 0; c < ctx.size; ++c) {
    plan.len.push_back(counts[c] * ctx.elem);
    plan.in_off.push_back(0);
    plan.out_off.push_back(displs[c] * ctx.elem);
  }
  plan.out = dst;
  plan.own_src = own;
  plan.ag_steps = ctx.size - 1;
  run_ring(ctx, plan);
}

}  // namespace chorus::algorithms
