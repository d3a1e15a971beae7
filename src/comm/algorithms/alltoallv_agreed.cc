// alltoallv with its counts agreed first: every rank learns what each peer will send it
// and checks it against what it expects, then all agree on the verdict, so that a
// mismatch fails on every rank before any data moves. Through the node's segment
// (shm_alltoallv, which reads the peers' announcements there) or over the transport:
// a pairwise exchange of the counts, an allreduce (min) of the verdicts, then the
// pairwise exchange of the data.
#include <algorithm>
#include <climits>
#include <cstring>
#include <numeric>
#include <string>

#include "chorus/error.h"
#include "comm/algorithms/algorithms.h"

namespace chorus::algorithms {

namespace {

// The counts over the transport: the lowest rank that found a disagreement, INT32_MAX
// where none did, agreed by every rank.
int32_t agree_counts_pairwise(const Context& ctx, const std::vector<size_t>& send_counts,
                              const CountsVerdict& verdict) {
  const int p = ctx.size;
  std::vector<size_t> ones(p, 1), iota(p);
  std::iota(iota.begin(), iota.end(), 0);
  std::vector<uint64_t> announced(p);
  Context meta = ctx;
  meta.elem = sizeof(uint64_t);
  alltoallv_pairwise(meta, send_counts.data(), ones, iota, announced.data(), ones, iota);
  int32_t first_bad = verdict(announced);
  Context agree = ctx;
  agree.dtype = DataType::kInt32;
  agree.elem = 4;
  agree.reduce = reduce_function(DataType::kInt32, ReduceOp::kMin);
  agree.reduce_many = nullptr;
  agree.average = false;
  allreduce_recursive_doubling(agree, &first_bad, &first_bad, 1);
  return first_bad;
}

// Elements from the start of a buffer to the end of its last block.
size_t extent(const std::vector<size_t>& counts, const std::vector<size_t>& displs) {
  size_t end = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    end = std::max(end, displs[r] + counts[r]);
  }
  return end;
}

// What the rank that found a disagreement saw, sent to every rank once all agree that
// one did (only on that path: a call whose counts agree pays nothing for it), so that
// each names both sides.
struct Disagreement {
  uint64_t sender = 0, receiver = 0, announced = 0, expected = 0;
};

std::string describe(const Disagreement& d) {
  return "rank " + std::to_string(d.sender) + " sends " + std::to_string(d.announced) +
         " elements to rank " + std::to_string(d.receiver) + ", which expects " +
         std::to_string(d.expected);
}

}  // namespace

void alltoallv_agreed(const Context& ctx, transport::shm::NodeGroup* g, const void* in,
                      const std::vector<size_t>& send_counts, const std::vector<size_t>& send_displs,
                      void* out, const std::vector<size_t>& recv_counts,
                      const std::vector<size_t>& recv_displs) {
  Disagreement found;
  auto verdict = [&](const std::vector<uint64_t>& announced) -> int32_t {
    for (int p = 0; p < ctx.size; ++p) {
      if (announced[p] == recv_counts[p]) continue;
      found = {static_cast<uint64_t>(p), static_cast<uint64_t>(ctx.rank), announced[p], recv_counts[p]};
      return ctx.rank;
    }
    return INT32_MAX;
  };
  auto fail = [&](int32_t first_bad) {
    Context detail = ctx;
    detail.dtype = DataType::kInt64;
    detail.elem = sizeof(uint64_t);
    broadcast_binomial(detail, &found, sizeof(Disagreement) / sizeof(uint64_t), first_bad);
    throw InvalidArgumentError("alltoallv on rank " + std::to_string(ctx.rank) +
                               ": counts disagree between ranks (" + describe(found) +
                               (first_bad == ctx.rank ? "" : ", found by rank " + std::to_string(first_bad)) +
                               "); no data was sent");
  };
  if (g != nullptr) {
    const int32_t first_bad =
        shm_alltoallv(ctx, *g, in, send_counts, send_displs, out, recv_counts, recv_displs, verdict);
    if (first_bad != INT32_MAX) fail(first_bad);
    return;
  }
  const int32_t first_bad = agree_counts_pairwise(ctx, send_counts, verdict);
  if (first_bad != INT32_MAX) fail(first_bad);
  // In place: keep a copy of what goes out.
  const size_t send_bytes = extent(send_counts, send_displs) * ctx.elem;
  const void* src = in;
  if (in == out && send_bytes > 0) {
    uint8_t* copy = ctx.scratch.get(send_bytes, 1);
    std::memcpy(copy, in, send_bytes);
    src = copy;
  }
  alltoallv_pairwise(ctx, src, send_counts, send_displs, out, recv_counts, recv_displs);
}

}  // namespace chorus::algorithms
