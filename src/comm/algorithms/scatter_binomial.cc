#include <algorithm>
#include <cstring>

#include "comm/algorithms/algorithms.h"

namespace chorus::algorithms {

// Binomial tree from the root, over ranks renumbered from it (v = rank - root mod
// size), the gather's tree run backwards (gather_binomial.cc): v receives the blocks of
// its subtree, ranks v .. v + subtree(v) - 1 in order, from its parent and hands each
// child v + 2^j its subtree's, the largest first. ceil(log2 size) rounds on the
// critical path, against the direct scatter's size - 1 messages at the root. The root
// sends from `in` where it is rank 0, from a copy in renumbered order otherwise.
void scatter_binomial(const Context& ctx, const void* in, void* out, size_t count, int root) {
  const int size = ctx.size, v = mod(ctx.rank - root, size);
  const size_t block = count * ctx.elem;
  const int subtree = binomial_subtree(v, size);
  transport::Transport& t = ctx.transport;
  const uint8_t* buf = static_cast<const uint8_t*>(in);
  if (v == 0 && root != 0) {
    uint8_t* rotated = ctx.scratch.get(static_cast<size_t>(size) * block, 0);
    const size_t head = static_cast<size_t>(size - root) * block;
    if (block > 0) {
      std::memcpy(rotated, buf + static_cast<size_t>(root) * block, head);
      std::memcpy(rotated + head, buf, static_cast<size_t>(root) * block);
    }
    buf = rotated;
  } else if (v != 0) {
    // A leaf receives its block straight into `out`.
    uint8_t* mine = subtree == 1 ? static_cast<uint8_t*>(out)
                                 : ctx.scratch.get(static_cast<size_t>(subtree) * block, 0);
    t.wait(t.irecv(mod(v - (v & -v) + root, size), mine, static_cast<size_t>(subtree) * block));
    buf = mine;
  }
  // Empty blocks still make every message (empty ones), so that a rank whose count
  // disagrees is found as in every other call.
  int top = 1;
  while (top * 2 < subtree) top *= 2;
  for (int d = top; d >= 1; d >>= 1) {
    const int child = v + d;
    if (d >= subtree || child >= size) continue;
    t.isend(mod(child + root, size), buf + static_cast<size_t>(d) * block,
            static_cast<size_t>(binomial_subtree(child, size)) * block);
  }
  if (buf != out && block > 0) std::memmove(out, buf, block);
  t.wait_all();
}

}  // namespace chorus::algorithms
