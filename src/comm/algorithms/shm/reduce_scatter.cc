// Direct shared-memory reduce-scatter of nearly equal blocks (helpers.h says how the
// direct collectives move data): every rank copies its pieces of every block in and
// reduces its own block's; through cross-memory attach, from the peers' inputs.
#include <algorithm>
#include <cstring>

#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/shm/helpers.h"

namespace chorus::algorithms {

using transport::wire_code;
using transport::shm::NodeGroup;
using shm::average;
using shm::cma_reduce_slice;
using shm::reduce_all;
using shm::with_published_buffers;

namespace {

// Reduce-scatter through cross-memory attach: this rank reduces its block from every
// rank's input into `out`; the second phase keeps the peers' inputs unchanged until
// every rank is done reading them.
void cma_reduce_scatter(const Context& ctx, NodeGroup& g, const uint8_t* in, uint8_t* out,
                        size_t total, bool avg) {
  const int me = g.local_rank(), p = g.local_size();
  with_published_buffers(g, in, out, [&] {
    cma_reduce_slice(ctx, g, in, out, block_begin(total, p, me), block_count(total, p, me), avg);
  });
}

}  // namespace

void shm_reduce_scatter_blocks(const Context& ctx, NodeGroup& g, const void* in, void* out,
                               size_t total, bool avg) {
  if (total == 0) return;
  const int me = g.local_rank(), p = g.local_size();
  const size_t e = ctx.elem, chunk = std::max<size_t>(1, g.buffer_bytes() / (e * p));
  const size_t largest = block_count(total, p, 0);
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  g.expect(wire_code(Collective::kReduceScatter));
  if (g.cma() && total * e >= ctx.tuning.cma_reduce_scatter_min_bytes) {
    return cma_reduce_scatter(ctx, g, src, dst, total, avg);
  }
  for (size_t at = 0; at < largest; at += chunk) {
    const int b = g.next_buffer();
    // Pieces of every block go to slots of `chunk` elements in this rank's buffer.
    for (int r = 0; r < p; ++r) {
      const size_t have = block_count(total, p, r);
      const size_t n = std::min(chunk, have - std::min(at, have));
      std::memcpy(g.buffer(me, b) + r * chunk * e, src + (block_begin(total, p, r) + at) * e, n * e);
    }
    g.arrive();
    g.wait_all();
    const size_t have = block_count(total, p, me);
    const size_t n = std::min(chunk, have - std::min(at, have));
    if (n == 0) continue;
    reduce_all(ctx, g, b, me * chunk, n, dst + at * e);
    average(ctx, dst + at * e, n, avg);
  }
}

}  // namespace chorus::algorithms
