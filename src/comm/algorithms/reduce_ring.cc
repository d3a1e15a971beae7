#include <cstring>

#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/ring_pipeline.h"

namespace chorus::algorithms {

// Ring reduce-scatter (each rank ends with one reduced chunk), then every rank sends
// its chunk to the root. Moves about 2x the message per link instead of log2(size)x.
void reduce_ring(const Context& ctx, const void* in, void* out, size_t count, int root) {
  const int n = ctx.size, r = ctx.rank;
  const size_t elem = ctx.elem;
  if (n == 1) {
    if (in != out && count > 0) std::memcpy(out, in, count * elem);
    finish_average(ctx, out, count);
    return;
  }
  RingPlan plan;
  for (int c = 0; c < n; ++c) {
    plan.len.push_back(block_count(count, n, c) * elem);
    plan.in_off.push_back(block_begin(count, n, c) * elem);
    plan.out_off.push_back(0);
  }
  plan.in = static_cast<const uint8_t*>(in);
  auto* result = static_cast<uint8_t*>(out);
  plan.own_dst = r == root ? result + plan.in_off[r] : ctx.scratch.get(plan.len[r], 1);
  plan.own_src = plan.own_dst;
  plan.rs_steps = n - 1;
  run_ring(ctx, plan);
  transport::Transport& t = ctx.transport;
  if (r != root) {
    t.wait(t.isend(root, plan.own_dst, plan.len[r]));
    return;
  }
  for (int c = 0; c < n; ++c) {
    if (c != root) t.irecv(c, result + plan.in_off[c], plan.len[c]);
  }
  t.wait_all();
}

}  // namespace chorus::algorithms
