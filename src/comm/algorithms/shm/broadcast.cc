// Direct shared-memory broadcast (helpers.h says how the direct collectives move data):
// the root copies each chunk into its buffer, the others copy it out; through
// cross-memory attach, the others read the root's data directly.
#include <algorithm>
#include <cstring>

#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/shm/helpers.h"

namespace chorus::algorithms {

using transport::wire_code;
using transport::shm::NodeGroup;
using shm::with_published_buffers;

namespace {

// Broadcast through cross-memory attach: the other ranks read the root's `send`
// straight into their buffers while the root copies it to its own (out of place). The
// second phase keeps the root from returning, and changing `send`, while they read.
void cma_broadcast(NodeGroup& g, const uint8_t* send, uint8_t* data, size_t bytes, int root) {
  const bool is_root = g.local_rank() == root;
  with_published_buffers(g, is_root ? send : data, data, [&] {
    if (!is_root) g.read_peer(root, g.peer_in(root), data, bytes);
    else if (send != data) std::memcpy(data, send, bytes);
  });
}

}  // namespace

void shm_broadcast(const Context& ctx, NodeGroup& g, const void* send, void* buf, size_t count,
                   int root) {
  if (count == 0) return;
  const size_t e = ctx.elem, chunk = g.buffer_bytes() / e;
  const bool is_root = g.local_rank() == root;
  const auto* from = static_cast<const uint8_t*>(send);
  auto* data = static_cast<uint8_t*>(buf);
  g.expect(wire_code(Collective::kBroadcast));
  if (g.cma() && count * e >= ctx.tuning.cma_broadcast_min_bytes) {
    return cma_broadcast(g, from, data, count * e, root);
  }
  for (size_t at = 0; at < count; at += chunk) {
    const size_t n = std::min(chunk, count - at);
    const int b = g.next_buffer();
    if (is_root) std::memcpy(g.buffer(root, b), from + at * e, n * e);
    g.arrive();
    g.wait_all();
    if (!is_root) std::memcpy(data + at * e, g.buffer(root, b), n * e);
    else if (from != data) std::memcpy(data + at * e, from + at * e, n * e);  // while they copy
  }
}

}  // namespace chorus::algorithms
