#include <cstring>

#include "comm/algorithms/algorithms.h"

namespace chorus::algorithms {

// Binomial tree towards `root`: in each round half of the remaining ranks send their
// partial result to a partner that combines it (the partner's data first, so the order
// is fixed). Latency-optimal for small messages.
void reduce_binomial(const Context& ctx, const void* in, void* out, size_t count, int root) {
  const int n = ctx.size;
  const int vr = mod(ctx.rank - root, n);
  const size_t bytes = count * ctx.elem;
  transport::Transport& t = ctx.transport;
  uint8_t* acc = vr == 0 ? static_cast<uint8_t*>(out) : ctx.scratch.get(bytes, 1);
  if (acc != in && bytes > 0) std::memcpy(acc, in, bytes);
  uint8_t* tmp = ctx.scratch.get(bytes, 2);
  for (int mask = 1; mask < n; mask <<= 1) {
    if (vr & mask) {
      t.wait(t.isend(mod(vr - mask + root, n), acc, bytes));
      return;
    }
    if (vr + mask < n) {
      t.wait(t.irecv(mod(vr + mask + root, n), tmp, bytes));
      ctx.reduce(acc, acc, tmp, count);
    }
  }
  finish_average(ctx, acc, count);
}

}  // namespace chorus::algorithms
