#include <cstring>

#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/fold.h"

namespace chorus::algorithms {

// Rabenseifner's allreduce: reduce-scatter by recursive halving, then allgather by
// recursive doubling, over the power-of-two ranks left after the fold. Moves
// 2*(p-1)/p of the data in 2*log2(p) steps.
void allreduce_halving_doubling(const Context& ctx, const void* in, void* out, size_t count) {
  const size_t bytes = count * ctx.elem, elem = ctx.elem;
  auto* buf = static_cast<uint8_t*>(out);
  // This rank's current values: the input until the first reduction writes to `out`
  // (out of place, no copy of the whole input is made first).
  const auto* src = static_cast<const uint8_t*>(in);
  const int r = ctx.rank;
  transport::Transport& t = ctx.transport;
  Fold fold(ctx.size, r);
  const int p = fold.pow2;
  uint8_t* tmp = ctx.scratch.get(bytes, 0);
  if (fold.folded(r)) {
    if (fold.vrank < 0) t.wait(t.isend(r + 1, src, bytes));
    else {
      t.wait(t.irecv(r - 1, tmp, bytes));
      ctx.reduce(buf, tmp, src, count);
      src = buf;
    }
  }
  auto offset = [&](int block) { return block_begin(count, p, block) * elem; };
  if (fold.vrank >= 0) {
    int lo = 0, hi = p;  // blocks this rank is responsible for
    for (int mask = p / 2; mask >= 1; mask >>= 1) {
      int peer = fold.real(fold.vrank ^ mask);
      int mid = (lo + hi) / 2;
      bool keep_low = (fold.vrank & mask) == 0;
      int keep_lo = keep_low ? lo : mid, keep_hi = keep_low ? mid : hi;
      int give_lo = keep_low ? mid : lo, give_hi = keep_low ? hi : mid;
      size_t keep_bytes = offset(keep_hi) - offset(keep_lo);
      t.isend(peer, src + offset(give_lo), offset(give_hi) - offset(give_lo));
      t.irecv(peer, tmp, keep_bytes);
      t.wait_all();
      uint8_t* mine = buf + offset(keep_lo);
      const uint8_t* mine_src = src + offset(keep_lo);
      if (peer < r) ctx.reduce(mine, tmp, mine_src, keep_bytes / elem);
      else ctx.reduce(mine, mine_src, tmp, keep_bytes / elem);
      src = buf;
      lo = keep_lo;
      hi = keep_hi;
    }
    if (src != buf && bytes > 0) std::memcpy(buf, src, bytes);  // one rank: nothing reduced
    finish_average(ctx, buf + offset(lo), (offset(hi) - offset(lo)) / elem);
    for (int mask = 1; mask < p; mask <<= 1) {
      int peer = fold.real(fold.vrank ^ mask);
      int width = hi - lo;
      bool low_half = (fold.vrank & mask) == 0;
      int other_lo = low_half ? hi : lo - width, other_hi = other_lo + width;
      t.isend(peer, buf + offset(lo), offset(hi) - offset(lo));
      t.irecv(peer, buf + offset(other_lo), offset(other_hi) - offset(other_lo));
      t.wait_all();
      lo = std::min(lo, other_lo);
      hi = std::max(hi, other_hi);
    }
  }
  if (fold.folded(r)) {
    if (fold.vrank < 0) t.wait(t.irecv(r + 1, buf, bytes));
    else t.wait(t.isend(r - 1, buf, bytes));
  }
}

}  // namespace chorus::algorithms
