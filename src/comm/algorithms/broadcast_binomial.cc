#include "comm/algorithms/algorithms.h"

namespace chorus::algorithms {

// Binomial tree rooted at `root`: log2(size) rounds, each rank receives once and then
// sends to its children. Latency-optimal for small messages.
void broadcast_binomial(const Context& ctx, void* buf, size_t count, int root) {
  const int n = ctx.size;
  const int vr = mod(ctx.rank - root, n);
  const size_t bytes = count * ctx.elem;
  transport::Transport& t = ctx.transport;
  int mask = 1;
  while (mask < n) {
    if (vr & mask) {
      t.wait(t.irecv(mod(vr - mask + root, n), buf, bytes));
      break;
    }
    mask <<= 1;
  }
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (vr + mask < n) t.isend(mod(vr + mask + root, n), buf, bytes);
  }
  t.wait_all();
}

}  // namespace chorus::algorithms
