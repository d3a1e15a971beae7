// Direct shared-memory reduce (helpers.h says how the direct collectives move data):
// every rank reduces its slice of each chunk, the root copies the slices out; through
// cross-memory attach, within a range of sizes, the root reduces everything itself.
#include <algorithm>

#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/shm/helpers.h"

namespace chorus::algorithms {

using transport::wire_code;
using transport::shm::NodeGroup;
using shm::cma_reduce_slice;
using shm::copy_slices;
using shm::reduce_own_slice;
using shm::with_published_buffers;

namespace {

// Reduce through cross-memory attach: the root reduces every element from the ranks'
// inputs, as the allreduce reduces its slice; the others only wait until it is done.
void cma_reduce(const Context& ctx, NodeGroup& g, const uint8_t* in, uint8_t* out, size_t count,
                int root) {
  with_published_buffers(g, in, out, [&] {
    if (g.local_rank() == root) cma_reduce_slice(ctx, g, in, out, 0, count, ctx.average);
  });
}

}  // namespace

void shm_reduce(const Context& ctx, NodeGroup& g, const void* in, void* out, size_t count,
                int root) {
  if (count == 0) return;
  const size_t e = ctx.elem, chunk = g.buffer_bytes() / e;
  const auto* src = static_cast<const uint8_t*>(in);
  const bool is_root = g.local_rank() == root;
  g.expect(wire_code(Collective::kReduce));
  if (g.cma() && count * e >= ctx.tuning.cma_reduce_min_bytes &&
      count * e < ctx.tuning.cma_reduce_max_bytes) {
    return cma_reduce(ctx, g, src, static_cast<uint8_t*>(out), count, root);
  }
  for (size_t at = 0; at < count; at += chunk) {
    const size_t n = std::min(chunk, count - at);
    const int b = g.next_buffer();
    // Slices are reduced into their owners' buffers, not into the root's output, which
    // may be the root's input; only the root then reads them.
    reduce_own_slice(ctx, g, b, src + at * e, n, ctx.average);
    // Every rank waits at every phase, also where it has nothing left to read: a rank
    // that went on to its next operation could otherwise publish that operation's
    // descriptor (in the slot of this chunk's first phase, two phases on) before a
    // slower rank had compared the descriptors of this one, which then failed with a
    // false "called a different collective" (issue 6's fault tests found it).
    g.wait_all();
    if (!is_root) continue;
    copy_slices(ctx, g, b, n, static_cast<uint8_t*>(out) + at * e, false);
  }
}

}  // namespace chorus::algorithms
