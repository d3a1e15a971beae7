// Direct shared-memory allgatherv, through cross-memory attach only (helpers.h): every
// rank reads each peer's block.
#include <vector>

#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/shm/helpers.h"

namespace chorus::algorithms {

using transport::wire_code;
using transport::shm::NodeGroup;
using shm::read_blocks;
using shm::with_published_buffers;

void shm_allgatherv(const Context& ctx, NodeGroup& g, const void* in, void* out,
                    const std::vector<size_t>& counts, const std::vector<size_t>& displs) {
  const int p = g.local_size();
  // The ranks compare their calls' digests of the counts (Signature::count): a rank
  // that expects more from a peer than the peer sends must not read past it.
  uint64_t total = 0;
  for (int r = 0; r < p; ++r) total += counts[r];
  if (total == 0) return;
  g.expect(wire_code(Collective::kAllgatherv));
  with_published_buffers(g, in, out, [&] {
    read_blocks(ctx, g, static_cast<const uint8_t*>(in), static_cast<uint8_t*>(out), counts, displs);
  });
}

}  // namespace chorus::algorithms
