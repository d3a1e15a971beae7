#include <cstring>

#include "comm/algorithms/algorithms.h"

namespace chorus::algorithms {

// Step k pairs rank r with r+k (send) and r-k (receive); all steps are posted at once
// and the transport drives every stream together.
void alltoallv_pairwise(const Context& ctx, const void* in, std::span<const size_t> send_counts,
                        std::span<const size_t> send_displs, void* out,
                        std::span<const size_t> recv_counts, std::span<const size_t> recv_displs) {
  const int n = ctx.size, r = ctx.rank;
  const size_t elem = ctx.elem;
  auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  transport::Transport& t = ctx.transport;
  if (recv_counts[r] > 0) {
    std::memmove(dst + recv_displs[r] * elem, src + send_displs[r] * elem, recv_counts[r] * elem);
  }
  for (int k = 1; k < n; ++k) {
    int to = mod(r + k, n), from = mod(r - k, n);
    t.isend(to, src + send_displs[to] * elem, send_counts[to] * elem);
    t.irecv(from, dst + recv_displs[from] * elem, recv_counts[from] * elem);
  }
  t.wait_all();
}

}  // namespace chorus::algorithms
