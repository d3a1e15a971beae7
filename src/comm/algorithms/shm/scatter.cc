// Direct shared-memory scatter, through cross-memory attach only (helpers.h): every
// rank reads its block from the root's input.
#include <cstring>

#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/shm/helpers.h"

namespace chorus::algorithms {

using transport::wire_code;
using transport::shm::NodeGroup;
using shm::with_published_buffers;

void shm_scatter(const Context& ctx, NodeGroup& g, const void* in, void* out, size_t count,
                 int root) {
  const size_t bytes = count * ctx.elem;
  const int me = g.local_rank();
  g.expect(wire_code(Collective::kScatter));
  with_published_buffers(g, in, out, [&] {
    if (bytes == 0) return;
    if (me != root) return g.read_peer(root, g.peer_in(root) + me * bytes, out, bytes);
    const uint8_t* mine = static_cast<const uint8_t*>(in) + me * bytes;
    if (mine != out) std::memmove(out, mine, bytes);  // in place: there
  });
}

}  // namespace chorus::algorithms
