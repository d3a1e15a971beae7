// alltoallv with its counts checked: every rank learns what each peer sends it and checks
// it against what it expects, and all agree on the verdict, so that a mismatch fails on
// every rank, naming both sides. Through the node's segment (shm_alltoallv, which reads
// the peers' announcements there before any data moves) or over the transport, in two
// latencies rather than a round of counts, an allreduce of the verdicts and then the
// data: each rank sends every peer its count and, right behind it on the same stream,
// its data; a receiver takes the count first and posts the data's receive at that size
// (into a discarded buffer where it is not what this rank expects, so that no stream
// breaks), and once every count is in, sends every peer what it found, which travels
// while the data does.
#include <algorithm>
#include <climits>
#include <cstring>
#include <string>

#include "chorus/error.h"
#include "comm/algorithms/algorithms.h"

namespace chorus::algorithms {

namespace {

// Elements from the start of a buffer to the end of its last block.
size_t extent(const std::vector<size_t>& counts, const std::vector<size_t>& displs) {
  size_t end = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    end = std::max(end, displs[r] + counts[r]);
  }
  return end;
}

// What a rank found: the first peer whose count differs from what it expects (bad 1),
// or nothing (bad 0). Sent to every peer over the transport; over the node's segment, only
// the lowest finder's is sent, and only where one exists.
struct Finding {
  uint64_t bad = 0, sender = 0, receiver = 0, announced = 0, expected = 0;
};
static_assert(sizeof(Finding) == 5 * sizeof(uint64_t));
static_assert(sizeof(size_t) == sizeof(uint64_t), "counts travel as 64-bit words");

// This rank's finding: the first peer, in rank order, whose announced count is not the
// one this rank expects (both paths name the same one).
Finding first_disagreement(const std::vector<uint64_t>& announced, const std::vector<size_t>& recv_counts,
                           int rank) {
  for (size_t p = 0; p < announced.size(); ++p) {
    if (announced[p] != recv_counts[p]) {
      return {1, static_cast<uint64_t>(p), static_cast<uint64_t>(rank), announced[p], recv_counts[p]};
    }
  }
  return {};
}

std::string describe(const Finding& f) {
  return "rank " + std::to_string(f.sender) + " sends " + std::to_string(f.announced) +
         " elements to rank " + std::to_string(f.receiver) + ", which expects " +
         std::to_string(f.expected);
}

// Up to this many ranks every rank sends its finding to every peer (one latency, behind
// the data); beyond, the ranks agree with an allreduce (min) and a broadcast of the
// finder's finding after the data (log2 p latencies, p-1 fewer messages per rank).
constexpr int kPairwiseFindings = 64;

// `root`'s finding, into `found` on every rank.
void broadcast_finding(const Context& ctx, Finding& found, int root) {
  Context detail = ctx;
  detail.dtype = DataType::kInt64;
  detail.elem = sizeof(uint64_t);
  broadcast_binomial(detail, &found, sizeof(Finding) / sizeof(uint64_t), root);
}

// The lowest rank whose finding is bad (INT32_MAX: none), agreed by every rank; `found`
// becomes that rank's finding.
int32_t agree_after_data(const Context& ctx, Finding& found) {
  int32_t first_bad = found.bad ? ctx.rank : INT32_MAX;
  Context agree = ctx;
  agree.dtype = DataType::kInt32;
  agree.elem = 4;
  agree.reduce = reduce_function(DataType::kInt32, ReduceOp::kMin);
  agree.reduce_many = nullptr;
  agree.average = false;
  allreduce_recursive_doubling(agree, &first_bad, &first_bad, 1);
  if (first_bad != INT32_MAX) broadcast_finding(ctx, found, first_bad);
  return first_bad;
}

// The transport path (see the top of the file). Returns the agreed lowest finder, as
// agree_after_data().
int32_t alltoallv_checked(const Context& ctx, const void* in, const std::vector<size_t>& send_counts,
                          const std::vector<size_t>& send_displs, void* out,
                          const std::vector<size_t>& recv_counts,
                          const std::vector<size_t>& recv_displs, Finding& found) {
  const int n = ctx.size, r = ctx.rank;
  const size_t elem = ctx.elem;
  transport::Transport& t = ctx.transport;
  // In place: keep a copy of what goes out.
  const size_t send_bytes = extent(send_counts, send_displs) * elem;
  auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  if (in == out && send_bytes > 0) {
    uint8_t* copy = ctx.scratch.get(send_bytes, 1);
    std::memcpy(copy, in, send_bytes);
    src = copy;
  }
  // Step k sends to r+k and receives from r-k, as alltoallv_pairwise.
  std::vector<uint64_t> announced(n);
  announced[r] = send_counts[r];
  std::vector<transport::Request> counts_in(n);
  for (int k = 1; k < n; ++k) {
    const int to = mod(r + k, n), from = mod(r - k, n);
    t.isend(to, &send_counts[to], sizeof(uint64_t));
    if (send_counts[to] > 0) t.isend(to, src + send_displs[to] * elem, send_counts[to] * elem);
    counts_in[from] = t.irecv(from, &announced[from], sizeof(uint64_t));
  }
  if (send_counts[r] == recv_counts[r] && send_counts[r] > 0) {
    std::memmove(dst + recv_displs[r] * elem, src + send_displs[r] * elem, send_counts[r] * elem);
  }
  // Blocks whose size this rank does not expect: received whole, then dropped.
  std::vector<std::vector<uint8_t>> dropped;
  for (int k = 1; k < n; ++k) {
    const int from = mod(r - k, n);
    t.wait(counts_in[from]);
    const uint64_t count = announced[from];
    if (count == 0) continue;
    uint8_t* into;
    if (count == recv_counts[from]) {
      into = dst + recv_displs[from] * elem;
    } else {
      into = dropped.emplace_back(count * elem).data();
    }
    t.irecv(from, into, count * elem);
  }
  found = first_disagreement(announced, recv_counts, r);
  if (n > kPairwiseFindings) {
    t.wait_all();
    return agree_after_data(ctx, found);
  }
  std::vector<Finding> findings(n);
  findings[r] = found;
  for (int k = 1; k < n; ++k) {
    t.isend(mod(r + k, n), &found, sizeof(Finding));
    t.irecv(mod(r - k, n), &findings[mod(r - k, n)], sizeof(Finding));
  }
  t.wait_all();
  for (int p = 0; p < n; ++p) {
    if (findings[p].bad) {
      found = findings[p];
      return p;
    }
  }
  return INT32_MAX;
}

}  // namespace

void alltoallv_agreed(const Context& ctx, transport::shm::NodeGroup* g, const void* in,
                      const std::vector<size_t>& send_counts, const std::vector<size_t>& send_displs,
                      void* out, const std::vector<size_t>& recv_counts,
                      const std::vector<size_t>& recv_displs) {
  Finding found;
  int32_t first_bad;
  if (g != nullptr) {
    auto verdict = [&](const std::vector<uint64_t>& announced) -> int32_t {
      found = first_disagreement(announced, recv_counts, ctx.rank);
      return found.bad ? ctx.rank : INT32_MAX;
    };
    first_bad = shm_alltoallv(ctx, *g, in, send_counts, send_displs, out, recv_counts, recv_displs, verdict);
    if (first_bad != INT32_MAX) broadcast_finding(ctx, found, first_bad);
  } else {
    first_bad = alltoallv_checked(ctx, in, send_counts, send_displs, out, recv_counts, recv_displs, found);
  }
  if (first_bad == INT32_MAX) return;
  throw InvalidArgumentError("alltoallv on rank " + std::to_string(ctx.rank) +
                             ": counts disagree between ranks (" + describe(found) +
                             (first_bad == ctx.rank ? "" : ", found by rank " + std::to_string(first_bad)) +
                             (g != nullptr ? "); no data was sent"
                                           : "); the blocks of the receive buffer are unspecified"));
}

}  // namespace chorus::algorithms
