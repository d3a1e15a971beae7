// Direct shared-memory allgather of nearly equal blocks (helpers.h says how the direct
// collectives move data): every rank copies its block's chunk in and the others' out;
// through cross-memory attach, every rank reads the peers' blocks directly.
#include <algorithm>
#include <cstring>
#include <vector>

#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/shm/helpers.h"

namespace chorus::algorithms {

using transport::wire_code;
using transport::shm::NodeGroup;
using shm::read_blocks;
using shm::with_published_buffers;

namespace {

// Allgather through cross-memory attach: every rank reads each peer's block from the
// peer's input straight into its place in its own output, all ranks at once, instead
// of every block being copied into the segment and out again one after the other.
void cma_allgather(const Context& ctx, NodeGroup& g, const uint8_t* in, uint8_t* out,
                   size_t total) {
  const int p = g.local_size();
  std::vector<size_t> counts(p), displs(p);
  for (int r = 0; r < p; ++r) {
    counts[r] = block_count(total, p, r);
    displs[r] = block_begin(total, p, r);
  }
  with_published_buffers(g, in, out, [&] { read_blocks(ctx, g, in, out, counts, displs); });
}

}  // namespace

void shm_allgather_blocks(const Context& ctx, NodeGroup& g, const void* in, void* out,
                          size_t total) {
  if (total == 0) return;
  const size_t e = ctx.elem, chunk = g.buffer_bytes() / e;
  const int me = g.local_rank(), p = g.local_size();
  const size_t largest = block_count(total, p, 0);
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  g.expect(wire_code(Collective::kAllgather));
  if (g.cma() && total * e >= ctx.tuning.cma_allgather_min_bytes) {
    return cma_allgather(ctx, g, src, dst, total);
  }
  for (size_t at = 0; at < largest; at += chunk) {
    const int b = g.next_buffer();
    const size_t my_n = std::min(chunk, block_count(total, p, me) - std::min(at, block_count(total, p, me)));
    std::memcpy(g.buffer(me, b), src + at * e, my_n * e);
    g.arrive();
    g.wait_all();
    for (int r = 0; r < p; ++r) {
      if (r == me) continue;
      const size_t have = block_count(total, p, r);
      const size_t n = std::min(chunk, have - std::min(at, have));
      std::memcpy(dst + (block_begin(total, p, r) + at) * e, g.buffer(r, b), n * e);
    }
  }
  // `in` may already be out's own block; otherwise place it.
  uint8_t* own = dst + block_begin(total, p, me) * e;
  if (own != src) std::memmove(own, src, block_count(total, p, me) * e);
}

}  // namespace chorus::algorithms
