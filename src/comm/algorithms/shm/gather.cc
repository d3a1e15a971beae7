// Direct shared-memory gather, through cross-memory attach only (helpers.h): the root
// reads every rank's input.
#include <vector>

#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/shm/helpers.h"

namespace chorus::algorithms {

using transport::wire_code;
using transport::shm::NodeGroup;
using shm::read_blocks;
using shm::with_published_buffers;

void shm_gather(const Context& ctx, NodeGroup& g, const void* in, void* out, size_t count,
                int root) {
  const int me = g.local_rank(), p = g.local_size();
  g.expect(wire_code(Collective::kGather));
  with_published_buffers(g, in, out, [&] {
    if (me != root || count == 0) return;
    std::vector<size_t> counts(p, count), displs(p);
    for (int r = 0; r < p; ++r) displs[r] = r * count;
    read_blocks(ctx, g, static_cast<const uint8_t*>(in), static_cast<uint8_t*>(out), counts, displs);
  });
}

}  // namespace chorus::algorithms
