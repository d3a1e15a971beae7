#include <algorithm>

#include "comm/algorithms/algorithms.h"

namespace chorus::algorithms {

// Pipelined chain root -> root+1 -> ... : the message is cut into segments and every
// rank forwards a segment as soon as it has it, so each link carries the message once.
// Bandwidth-optimal for large messages.
void broadcast_chain(const Context& ctx, void* buf, size_t count, int root) {
  const int n = ctx.size;
  const int vr = mod(ctx.rank - root, n);
  const size_t bytes = count * ctx.elem;
  auto* data = static_cast<uint8_t*>(buf);
  transport::Transport& t = ctx.transport;
  const int prev = mod(ctx.rank - 1, n), next = mod(ctx.rank + 1, n);
  const bool has_next = vr + 1 < n;
  size_t seg = std::max(ctx.elem, ctx.segment_bytes / ctx.elem * ctx.elem);
  for (size_t off = 0; off < bytes || (off == 0 && bytes == 0); off += seg) {
    size_t len = std::min(seg, bytes - off);
    if (vr != 0) t.wait(t.irecv(prev, data + off, len));
    if (has_next) t.isend(next, data + off, len);
    if (bytes == 0) break;
  }
  t.wait_all();
}

}  // namespace chorus::algorithms
