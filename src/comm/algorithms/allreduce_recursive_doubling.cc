#include <cstring>

#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/fold.h"

namespace chorus::algorithms {

// Combines two partial results in a fixed order (lower rank's data first), so that
// every rank computes bitwise the same value even for min/max of -0.0 and 0.0.
static void combine(const Context& ctx, uint8_t* mine, const uint8_t* theirs, size_t count,
                    bool theirs_first) {
  if (theirs_first) ctx.reduce(mine, theirs, mine, count);
  else ctx.reduce(mine, mine, theirs, count);
}

void allreduce_recursive_doubling(const Context& ctx, const void* in, void* out, size_t count) {
  const size_t bytes = count * ctx.elem;
  auto* buf = static_cast<uint8_t*>(out);
  if (in != out && bytes > 0) std::memcpy(buf, in, bytes);
  const int r = ctx.rank;
  transport::Transport& t = ctx.transport;
  Fold fold(ctx.size, r);
  uint8_t* tmp = ctx.scratch.get(bytes, 0);
  if (fold.folded(r)) {
    if (fold.vrank < 0) t.wait(t.isend(r + 1, buf, bytes));
    else {
      t.wait(t.irecv(r - 1, tmp, bytes));
      combine(ctx, buf, tmp, count, true);
    }
  }
  if (fold.vrank >= 0) {
    for (int mask = 1; mask < fold.pow2; mask <<= 1) {
      int peer = fold.real(fold.vrank ^ mask);
      t.isend(peer, buf, bytes);
      t.irecv(peer, tmp, bytes);
      t.wait_all();
      combine(ctx, buf, tmp, count, peer < r);
    }
  }
  if (fold.folded(r)) {
    if (fold.vrank < 0) t.wait(t.irecv(r + 1, buf, bytes));
    else t.wait(t.isend(r - 1, buf, bytes));
  }
  finish_average(ctx, buf, count);
}

}  // namespace chorus::algorithms
