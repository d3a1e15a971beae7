#include <cstring>

#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/fold.h"

namespace chorus::algorithms {

// Recursive halving over the largest power of two P <= size ("virtual" ranks). Where
// size is not a power of two, the first 2 (size - P) ranks fold in pairs first: the
// even one sends its whole input to the odd one, which reduces it and stands for both;
// virtual rank v is rank 2v + 1 for v < size - P and v + size - P beyond, so that the
// virtual ranks [a, b) own the consecutive blocks [first(a), first(b)). Each of log2 P
// steps halves the range of virtual ranks a rank works for: it sends the half its
// partner (v ^ d) keeps and reduces the half it keeps with what the partner sends (the
// lower rank's data first, as halving-doubling does).
// At the end each virtual rank holds its own blocks reduced (two for a folded pair:
// the even rank's goes back to it). log2 P latencies (two more when folded) against
// the ring's size - 1, for the same bytes on the wire.
void reduce_scatter_halving(const Context& ctx, const void* in, void* out, size_t count) {
  const int size = ctx.size, r = ctx.rank;
  const size_t block = count * ctx.elem, total = block * static_cast<size_t>(size);
  if (size == 1) {
    if (in != out && block > 0) std::memcpy(out, in, block);
    finish_average(ctx, out, count);
    return;
  }
  const Fold fold(size, r);
  transport::Transport& t = ctx.transport;
  // Empty blocks still make every step (empty messages), so that a rank whose count
  // disagrees is found as in every other call.
  if (fold.vrank < 0) {
    t.wait(t.isend(r + 1, in, total));
    t.wait(t.irecv(r + 1, out, block));  // after the send: out may be in's block
    finish_average(ctx, out, count);
    return;
  }
  uint8_t* work = ctx.scratch.get(total, 0);
  uint8_t* incoming = ctx.scratch.get(total, 1);
  if (fold.folded(r)) {
    t.wait(t.irecv(r - 1, incoming, total));
    if (count > 0) ctx.reduce(work, incoming, in, count * static_cast<size_t>(size));
  } else if (total > 0) {
    std::memcpy(work, in, total);
  }
  const int v = fold.vrank;
  // The first block virtual rank u owns (size at u == pow2).
  auto first = [&](int u) { return static_cast<size_t>(u < fold.rem ? 2 * u : u + fold.rem) * block; };
  int lo = 0, hi = fold.pow2;
  for (int d = fold.pow2 / 2; d >= 1; d /= 2) {
    const int mid = lo + d;
    const bool lower = v < mid;
    const int keep_lo = lower ? lo : mid, keep_hi = lower ? mid : hi;
    const int send_lo = lower ? mid : lo, send_hi = lower ? hi : mid;
    const size_t keep = first(keep_lo), keep_bytes = first(keep_hi) - keep;
    const size_t send = first(send_lo), send_bytes = first(send_hi) - send;
    const int partner = fold.real(v ^ d);
    t.isend(partner, work + send, send_bytes);
    t.irecv(partner, incoming + keep, keep_bytes);
    t.wait_all();
    uint8_t* mine = work + keep;
    const size_t n = keep_bytes / ctx.elem;
    if (n > 0 && partner < r) ctx.reduce(mine, incoming + keep, mine, n);
    else if (n > 0) ctx.reduce(mine, mine, incoming + keep, n);
    lo = keep_lo;
    hi = keep_hi;
  }
  if (v < fold.rem) t.wait(t.isend(r - 1, work + static_cast<size_t>(r - 1) * block, block));
  const uint8_t* mine = work + static_cast<size_t>(r) * block;
  if (block > 0) std::memcpy(out, mine, block);
  finish_average(ctx, out, count);
}

}  // namespace chorus::algorithms
