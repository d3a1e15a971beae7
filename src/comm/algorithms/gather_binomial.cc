#include <algorithm>
#include <cstring>

#include "comm/algorithms/algorithms.h"

namespace chorus::algorithms {

// Binomial tree towards the root, over ranks renumbered from it (v = rank - root mod
// size): v collects the blocks of its subtree, the ranks v .. v + subtree(v) - 1 in
// order, from its children v + 2^j (2^j below the lowest set bit of v; every power of
// two below size for the root), and sends them to its parent, v less its lowest set
// bit. ceil(log2 size) rounds on the critical path, against the direct gather's
// size - 1 messages at the root; the root receives the same bytes (half of them from
// its first child). The root collects in renumbered order (straight into `out` when it
// is rank 0) and rotates the blocks into rank order at the end.
void gather_binomial(const Context& ctx, const void* in, void* out, size_t count, int root) {
  const int size = ctx.size, v = mod(ctx.rank - root, size);
  const size_t block = count * ctx.elem;
  const int subtree = binomial_subtree(v, size);
  uint8_t* dst = static_cast<uint8_t*>(out);
  // The subtree's blocks in renumbered order (scratch off the root, or at a root that
  // is not rank 0: out's blocks are in rank order there).
  uint8_t* buf = v == 0 && root == 0 ? dst : ctx.scratch.get(static_cast<size_t>(subtree) * block, 0);
  if (buf != in && block > 0) std::memmove(buf, in, block);
  transport::Transport& t = ctx.transport;
  // Empty blocks still make every message (empty ones), so that a rank whose count
  // disagrees is found as in every other call.
  for (int d = 1; d < size && (v == 0 || d < (v & -v)); d <<= 1) {
    const int child = v + d;
    if (child >= size) break;
    t.irecv(mod(child + root, size), buf + static_cast<size_t>(d) * block,
            static_cast<size_t>(binomial_subtree(child, size)) * block);
  }
  t.wait_all();
  if (v != 0) {
    t.wait(t.isend(mod(v - (v & -v) + root, size), buf, static_cast<size_t>(subtree) * block));
    return;
  }
  if (buf == dst || block == 0) return;
  // Renumbered block u is rank (u + root) mod size's: ranks root .. size - 1, then 0 .. root - 1.
  const size_t head = static_cast<size_t>(size - root) * block;
  std::memcpy(dst + static_cast<size_t>(root) * block, buf, head);
  std::memcpy(dst, buf + head, static_cast<size_t>(root) * block);
}

}  // namespace chorus::algorithms
