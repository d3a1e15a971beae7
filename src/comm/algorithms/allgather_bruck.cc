#include <algorithm>
#include <cstring>

#include "comm/algorithms/algorithms.h"

namespace chorus::algorithms {

// Bruck's allgather. The working buffer (scratch) holds blocks in the order of this
// rank's view: block i is rank (rank + i) mod size's. It starts with this rank's own
// block; in round k (d = 2^k) the rank sends its first min(d, size - d) blocks to rank
// - d and receives as many after its d blocks from rank + d, whose first blocks are
// those of ranks rank + d, rank + d + 1, ...: the gathered run doubles each round, and
// ceil(log2 size) rounds gather every block whatever the size. The final rotation puts
// block i at out's block (rank + i) mod size, in two copies.
void allgather_bruck(const Context& ctx, const void* in, void* out, size_t count) {
  const int size = ctx.size, r = ctx.rank;
  const size_t block = count * ctx.elem;
  auto* dst = static_cast<uint8_t*>(out);
  uint8_t* own = dst + static_cast<size_t>(r) * block;
  if (size == 1) {
    if (own != in && block > 0) std::memmove(own, in, block);
    return;
  }
  // Empty blocks still make the rounds (empty messages), so that a rank whose count
  // disagrees is found as in every other call.
  uint8_t* work = ctx.scratch.get(static_cast<size_t>(size) * block, 0);
  if (block > 0) std::memcpy(work, in, block);
  transport::Transport& t = ctx.transport;
  for (int d = 1; d < size; d <<= 1) {
    const size_t bytes = static_cast<size_t>(std::min(d, size - d)) * block;
    t.isend(mod(r - d, size), work, bytes);
    t.irecv(mod(r + d, size), work + static_cast<size_t>(d) * block, bytes);
    t.wait_all();
  }
  if (block == 0) return;
  // Blocks 0 .. size - r - 1 are ranks r .. size - 1; the rest are ranks 0 .. r - 1.
  const size_t head = static_cast<size_t>(size - r) * block;
  std::memcpy(own, work, head);
  std::memcpy(dst, work + head, static_cast<size_t>(r) * block);
}

}  // namespace chorus::algorithms
