// Direct shared-memory alltoall, through cross-memory attach only (helpers.h): every
// rank reads its block from each peer's input.
#include <cstring>

#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/shm/helpers.h"

namespace chorus::algorithms {

using transport::wire_code;
using transport::shm::NodeGroup;
using shm::with_published_buffers;

void shm_alltoall(const Context& ctx, NodeGroup& g, const void* in, void* out, size_t count) {
  const size_t bytes = count * ctx.elem;
  const int me = g.local_rank(), p = g.local_size();
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  g.expect(wire_code(Collective::kAlltoall));
  // In place, this rank overwrites the blocks its peers are reading: they read a copy.
  if (in == out && bytes > 0) {
    uint8_t* copy = ctx.scratch.get(bytes * p, 1);
    std::memcpy(copy, src, bytes * p);
    src = copy;
  }
  with_published_buffers(g, src, out, [&] {
    if (bytes == 0) return;
    for (int r = 0; r < p; ++r) {
      if (r != me) g.read_peer(r, g.peer_in(r) + me * bytes, dst + r * bytes, bytes);
    }
    if (src != dst) std::memmove(dst + me * bytes, src + me * bytes, bytes);
  });
}

}  // namespace chorus::algorithms
