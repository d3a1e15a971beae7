#include <cstring>

#include "comm/algorithms/algorithms.h"

namespace chorus::algorithms {

// Bruck's alltoall (the "index" algorithm). The working buffer (scratch area 0) holds
// this rank's blocks rotated: block i is the one for rank (rank + i) mod size. In round
// k (d = 2^k) every block whose index has bit k set goes to rank + d, keeping its index,
// and as many come from rank - d: after ceil(log2 size) rounds a block has travelled its
// index, so that block i here is rank (rank - i)'s for this rank, and a last rotation
// puts it at out's block (rank - i) mod size. ceil(log2 size) messages a rank, against
// the pairwise exchange's size - 1, for about log2(size) / 2 times the bytes: for small
// blocks. Each round packs its blocks into scratch area 1 and receives into area 2.
void alltoall_bruck(const Context& ctx, const void* in, void* out, size_t count) {
  const int size = ctx.size, r = ctx.rank;
  const size_t block = count * ctx.elem;
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  auto at = [block](auto* base, int i) { return base + static_cast<size_t>(i) * block; };
  if (size == 1) {
    if (in != out && block > 0) std::memmove(out, in, block);
    return;
  }
  uint8_t* work = ctx.scratch.get(static_cast<size_t>(size) * block, 0);
  // Blocks r .. size - 1 of `in` are indices 0 .. size - r - 1, then 0 .. r - 1.
  const size_t head = static_cast<size_t>(size - r) * block;
  if (block > 0) {
    std::memcpy(work, at(src, r), head);
    std::memcpy(work + head, src, static_cast<size_t>(r) * block);
  }
  const size_t half = static_cast<size_t>(size / 2 + 1) * block;  // the most blocks a round moves
  uint8_t* outgoing = ctx.scratch.get(half, 1);
  uint8_t* incoming = ctx.scratch.get(half, 2);
  transport::Transport& t = ctx.transport;
  // Empty blocks still make every round (empty messages), so that a rank whose count
  // disagrees is found as in every other call.
  for (int d = 1; d < size; d <<= 1) {
    size_t packed = 0;
    for (int i = d; i < size; ++i) {
      if ((i & d) == 0) continue;
      if (block > 0) std::memcpy(outgoing + packed, at(work, i), block);
      packed += block;
    }
    t.isend(mod(r + d, size), outgoing, packed);
    t.irecv(mod(r - d, size), incoming, packed);
    t.wait_all();
    size_t unpacked = 0;
    for (int i = d; i < size; ++i) {
      if ((i & d) == 0) continue;
      if (block > 0) std::memcpy(at(work, i), incoming + unpacked, block);
      unpacked += block;
    }
  }
  if (block == 0) return;
  // Index i is rank (r - i) mod size's block: indices 0 .. r are ranks r .. 0, the rest
  // ranks size - 1 .. r + 1.
  for (int i = 0; i < size; ++i) std::memcpy(at(dst, mod(r - i, size)), at(work, i), block);
}

}  // namespace chorus::algorithms
