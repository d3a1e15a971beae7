// Direct shared-memory alltoallv (helpers.h says how the direct collectives move data).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "comm/algorithms/algorithms.h"

namespace chorus::algorithms {

using transport::wire_code;
using transport::shm::NodeGroup;

// Every rank writes a table to its segment buffer: where its data is, then the count
// and displacement of what it sends to each rank and the count it expects from each.
// The data is in the buffer too, packed after the table, when this rank sends at most
// Tuning::alltoallv_segment_bytes; otherwise the table holds the address of its send
// buffer (of a copy, in place), which the peers read with cross-memory attach. After one
// phase every rank reads all tables, so all find the same first disagreement without
// another exchange; when there is none, each copies the blocks it receives. A last
// phase, only when some rank's data is read through the kernel, keeps that rank from
// returning while the others read its buffer. Data in the segment needs none: the
// buffer is written again only after a later operation's phase that every rank must
// reach first (see shm_group.h).
int32_t shm_alltoallv(const Context& ctx, NodeGroup& g, const void* in,
                      const std::vector<size_t>& send_counts, const std::vector<size_t>& send_displs,
                      void* out, const std::vector<size_t>& recv_counts,
                      const std::vector<size_t>& recv_displs, const CountsVerdict& verdict) {
  const size_t e = ctx.elem;
  const int me = g.local_rank(), p = g.local_size();
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  g.expect(wire_code(Collective::kAlltoallv));
  const int b = g.next_buffer();
  // Table of rank r: [0] its send buffer's address, 0 when the data is in the segment;
  // [1 + 3q] count to rank q, [2 + 3q] displacement (in the segment: packed), [3 + 3q]
  // count it expects from rank q.
  auto table = [&](int r) { return reinterpret_cast<uint64_t*>(g.buffer(r, b)); };
  const size_t data_at = ((1 + 3 * static_cast<size_t>(p)) * sizeof(uint64_t) + 63) / 64 * 64;
  size_t total = 0, extent = 0;
  for (int q = 0; q < p; ++q) {
    total += send_counts[q];
    if (send_counts[q] > 0) extent = std::max(extent, send_displs[q] + send_counts[q]);
  }
  const bool in_segment = total * e <= ctx.tuning.alltoallv_segment_bytes &&
                          data_at + total * e <= g.buffer_bytes();
  uint64_t* mine = table(me);
  if (in_segment) {
    mine[0] = 0;
    size_t at = 0;
    for (int q = 0; q < p; ++q) {
      std::memcpy(g.buffer(me, b) + data_at + at * e, src + send_displs[q] * e, send_counts[q] * e);
      mine[2 + 3 * q] = at;
      at += send_counts[q];
    }
  } else {
    // In place, this rank overwrites the blocks its peers are reading: they read a copy.
    if (in == out && extent > 0) {
      uint8_t* copy = ctx.scratch.get(extent * e, 1);
      std::memcpy(copy, src, extent * e);
      src = copy;
    }
    mine[0] = reinterpret_cast<uintptr_t>(src);
    for (int q = 0; q < p; ++q) mine[2 + 3 * q] = send_displs[q];
  }
  for (int q = 0; q < p; ++q) {
    mine[1 + 3 * q] = send_counts[q];
    mine[3 + 3 * q] = recv_counts[q];
  }
  g.arrive();
  g.wait_all();
  // The first rank that expects from some rank other than what that rank sends it.
  int32_t first_bad = INT32_MAX;
  bool through_kernel = false;
  for (int q = 0; q < p && first_bad == INT32_MAX; ++q) {
    for (int r = 0; r < p; ++r) {
      if (table(r)[1 + 3 * q] != table(q)[3 + 3 * r]) {
        first_bad = q;
        break;
      }
    }
  }
  if (first_bad != INT32_MAX) {
    // This rank's own view, for its message (INT32_MAX unless it is the one).
    std::vector<uint64_t> announced(p);
    for (int r = 0; r < p; ++r) announced[r] = table(r)[1 + 3 * me];
    const int32_t own = verdict(announced);
    return own == INT32_MAX ? first_bad : own;
  }
  for (int r = 0; r < p; ++r) {
    const uint64_t* t = table(r);
    through_kernel |= t[0] != 0;
    if (recv_counts[r] == 0) continue;
    uint8_t* to = dst + recv_displs[r] * e;
    const size_t bytes = recv_counts[r] * e;
    if (t[0] == 0) std::memcpy(to, g.buffer(r, b) + data_at + t[2 + 3 * me] * e, bytes);
    else if (r != me) g.read_peer(r, t[0] + t[2 + 3 * me] * e, to, bytes);
    else if (to != src + send_displs[me] * e) std::memmove(to, src + send_displs[me] * e, bytes);
  }
  if (through_kernel) {
    g.arrive();
    g.wait_all();
  }
  return INT32_MAX;
}

}  // namespace chorus::algorithms
