// Every flat algorithm of src/comm/algorithms/algorithms.h, and the hierarchical ones
// over topologies built here, run over the in-memory FakeTransport (fake_transport.h):
// no communicator, no sockets, no shared memory, so that a wrong result is the
// algorithm's. Ranks are threads; every rank builds its Context as the communicator
// does (rank_context.h).
//
// Swept on world sizes 1..8 (one TEST_P instance per collective and size), over every
// dtype and reduction, counts 0, 1, 7, 1000 and 65537 (odd, and not divisible by any
// size > 1), out of place and in place where the algorithm allows it, every root, and
// for the ring and chain algorithms a segment of 64 bytes besides the default (the
// pipeline with many segments per chunk). Results are checked exactly against the
// closed forms of tests/util/expected.h; out-of-place inputs must be left unchanged,
// and bytes outside the results untouched.
//
// CHORUS_SWEEP=quick (scripts/sanitize.sh, 2 cores under a sanitizer): two reductions
// of five (avg: the adding path and the division; max: the comparing one), the
// count 65537 in f32 (sum or no reduction) only, and the roots 0 and size - 1.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "comm/algorithms/algorithms.h"
#include "comm/communicator/plan.h"
#include "comm/transport/topology.h"
#include "rank_context.h"
#include "util/expected.h"

namespace chorus {
namespace {

namespace alg = algorithms;
using test::check_move;
using test::check_reduce_input;
using test::check_sentinel;
using test::FakeHub;
using test::FakeTransport;
using test::fill_move;
using test::fill_reduce_input;
using test::kSentinelByte;
using test::quick_sweep;
using test::RankContext;
using test::ReduceExpectation;
using test::run_ranks;
using Bytes = std::vector<uint8_t>;

constexpr size_t kLarge = 65537;
constexpr size_t kSmallSegment = 64;

std::vector<ReduceOp> sweep_ops() {
  if (quick_sweep()) return {ReduceOp::kAvg, ReduceOp::kMax};
  return {std::begin(kAllReduceOps), std::end(kAllReduceOps)};
}

// The counts of (dtype, op); `reduces` false for data movement.
std::vector<size_t> sweep_counts(DataType dtype, bool reduces, ReduceOp op) {
  std::vector<size_t> counts = {0, 1, 7, 1000};
  bool large = !quick_sweep() ||
               (dtype == DataType::kFloat32 && (!reduces || op == ReduceOp::kSum));
  if (large) counts.push_back(kLarge);
  return counts;
}

// The segment sizes a ring or chain algorithm runs with at `count` elements: the
// default, and 64 bytes where the number of messages stays small.
std::vector<size_t> segments(bool pipelined, size_t count) {
  std::vector<size_t> s = {kDefaultSegmentBytes};
  if (pipelined && count > 1 && count <= 1000) s.push_back(kSmallSegment);
  return s;
}

std::vector<int> sweep_roots(int size) {
  std::vector<int> roots;
  for (int r = 0; r < size; ++r) {
    if (!quick_sweep() || r == 0 || r == size - 1) roots.push_back(r);
  }
  return roots;
}

std::string label(const char* algo, DataType dtype, const char* op, size_t count, int rank,
                  size_t segment, const char* extra = "") {
  std::ostringstream m;
  m << algo << " " << dtype_name(dtype) << " " << op << " count " << count << " segment "
    << segment << extra << ", rank " << rank;
  return m.str();
}

// Each rank's view of one case, for messages: "allreduce_ring f32 sum count 7 segment
// 64 in place, rank 3" (`shape`: the hierarchical layout, or empty).
std::string where(const char* algo, const RankContext& rc, DataType dtype, const char* op,
                  size_t count, size_t segment, bool in_place, const std::string& shape) {
  return label(algo, dtype, op, count, rc.rank(), segment,
               (std::string(in_place ? " in place" : "") + (shape.empty() ? "" : ", ") + shape)
                   .c_str());
}

// Runs body(rc) on every rank of a hub of `size` ranks; `node_ids` (one per rank, or
// empty: one node) gives the ranks' topology.
void on_ranks(int size, const std::function<void(RankContext&)>& body,
              const std::vector<std::string>& node_ids = {}) {
  FakeHub hub(size);
  run_ranks(hub, [&](FakeTransport& t) {
    if (node_ids.empty()) {
      RankContext rc(t);
      return body(rc);
    }
    RankContext rc(t, transport::topology_from_ids(node_ids, t.rank()));
    body(rc);
  });
}

// The sweep's cases, in the same order on every rank: body(dtype, op, expectation,
// count) for reductions, body(dtype, count) for data movement.
void sweep_reductions(
    const RankContext& rc,
    const std::function<void(DataType, ReduceOp, const ReduceExpectation&, size_t)>& body) {
  for (DataType d : kAllDataTypes) {
    for (ReduceOp op : sweep_ops()) {
      ReduceExpectation expect(d, op, rc.size());
      for (size_t n : sweep_counts(d, true, op)) body(d, op, expect, n);
    }
  }
}
void sweep_moves(const std::function<void(DataType, size_t)>& body) {
  for (DataType d : kAllDataTypes) {
    for (size_t n : sweep_counts(d, false, ReduceOp::kSum)) body(d, n);
  }
}

// The roots of a case: every root of the sweep, one for the large count.
std::vector<int> roots_for(int size, size_t count) {
  return count == kLarge ? std::vector<int>{size / 2} : sweep_roots(size);
}

class AlgorithmsTest : public testing::TestWithParam<int> {};

// ---- allreduce: flat, and hierarchical (below) through the same cases.

using AllreduceFn = void (*)(const alg::Context&, const void*, void*, size_t);

void allreduce_cases(RankContext& rc, const char* name, AllreduceFn fn, bool pipelined,
                     const std::string& shape = "") {
  const int rank = rc.rank();
  sweep_reductions(rc, [&](DataType d, ReduceOp op, const ReduceExpectation& expect, size_t n) {
    const size_t elem = dtype_size(d);
    for (size_t segment : segments(pipelined, n)) {
      for (bool in_place : {false, true}) {
        Bytes in(n * elem), out(n * elem + elem, kSentinelByte);
        fill_reduce_input(d, op, rank, in.data(), 0, n);
        if (in_place && n > 0) std::memcpy(out.data(), in.data(), n * elem);
        fn(rc.begin("allreduce", d, true, op, n, -1, segment), in_place ? out.data() : in.data(),
           out.data(), n);
        std::string at = where(name, rc, d, op_name(op), n, segment, in_place, shape);
        EXPECT_EQ(expect.check(out.data(), 0, n), "") << at;
        EXPECT_EQ(check_sentinel(out.data() + n * elem, elem), "") << at;
        if (!in_place) {
          EXPECT_EQ(check_reduce_input(d, op, rank, in.data(), 0, n), "") << at;
        }
      }
    }
  });
}

TEST_P(AlgorithmsTest, Allreduce) {
  on_ranks(GetParam(), [](RankContext& rc) {
    allreduce_cases(rc, "allreduce_ring", alg::allreduce_ring, true);
    allreduce_cases(rc, "allreduce_recursive_doubling", alg::allreduce_recursive_doubling, false);
    allreduce_cases(rc, "allreduce_halving_doubling", alg::allreduce_halving_doubling, false);
  });
}

// ---- reduce_scatter (ring, recursive halving): block `rank` of the reduction of size *
// count elements.

using ReduceScatterFn = void (*)(const alg::Context&, const void*, void*, size_t);

void reduce_scatter_cases(RankContext& rc, const char* name, ReduceScatterFn fn, bool pipelined) {
  const int rank = rc.rank(), size = rc.size();
  sweep_reductions(rc, [&](DataType d, ReduceOp op, const ReduceExpectation& expect, size_t n) {
    const size_t elem = dtype_size(d);
    for (size_t segment : segments(pipelined, n)) {
      for (bool in_place : {false, true}) {
        const size_t total = n * size, mine = static_cast<size_t>(rank) * n;
        Bytes in(total * elem), out(n * elem + elem, kSentinelByte);
        fill_reduce_input(d, op, rank, in.data(), 0, total);
        uint8_t* result = in_place ? in.data() + mine * elem : out.data();
        fn(rc.begin("reduce_scatter", d, true, op, n, -1, segment), in.data(), result, n);
        std::string at = where(name, rc, d, op_name(op), n, segment, in_place, "");
        EXPECT_EQ(expect.check(result, mine, n), "") << at;
        if (in_place) continue;
        EXPECT_EQ(check_sentinel(out.data() + n * elem, elem), "") << at;
        EXPECT_EQ(check_reduce_input(d, op, rank, in.data(), 0, total), "") << at;
      }
    }
  });
}

TEST_P(AlgorithmsTest, ReduceScatter) {
  on_ranks(GetParam(), [](RankContext& rc) {
    reduce_scatter_cases(rc, "reduce_scatter_ring", alg::reduce_scatter_ring, true);
    reduce_scatter_cases(rc, "reduce_scatter_halving", alg::reduce_scatter_halving, false);
  });
}

// ---- allgatherv (ring): equal blocks, and uneven ones (some empty) with gaps between
// them that must stay untouched.

TEST_P(AlgorithmsTest, Allgatherv) {
  on_ranks(GetParam(), [](RankContext& rc) {
    const int rank = rc.rank(), size = rc.size();
    sweep_moves([&](DataType d, size_t n) {
      const size_t elem = dtype_size(d);
      for (bool uneven : {false, true}) {
        std::vector<size_t> counts(size), displs(size);
        size_t total = 0;
        for (int r = 0; r < size; ++r) {
          counts[r] = uneven ? (r % 3 == 1 ? 0 : n + static_cast<size_t>(r)) : n;
          displs[r] = total;
          total += counts[r] + (uneven ? 2 : 0);  // a gap of two elements
        }
        const uint64_t digest = transport::counts_digest(counts.data(), counts.size());
        for (size_t segment : segments(true, n)) {
          for (bool in_place : {false, true}) {
            Bytes in(counts[rank] * elem), out(total * elem + elem, kSentinelByte);
            uint8_t* own = out.data() + displs[rank] * elem;
            fill_move(d, rank, in_place ? own : in.data(), 0, counts[rank]);
            alg::allgatherv_ring(
                rc.begin("allgatherv", d, false, ReduceOp::kSum, digest, -1, segment),
                in_place ? own : in.data(), out.data(), counts, displs);
            std::string at = where("allgatherv_ring", rc, d, "-", n, segment, in_place,
                                   uneven ? "uneven" : "");
            for (int r = 0; r < size; ++r) {
              EXPECT_EQ(check_move(d, r, out.data() + displs[r] * elem, 0, counts[r]), "")
                  << at << ", block " << r;
              const size_t end = displs[r] + counts[r];
              const size_t next = r + 1 < size ? displs[r + 1] : total + 1;
              EXPECT_EQ(check_sentinel(out.data() + end * elem, (next - end) * elem), "")
                  << at << ", after block " << r;
            }
            if (!in_place) {
              EXPECT_EQ(check_move(d, rank, in.data(), 0, counts[rank]), "") << at;
            }
          }
        }
      }
    });
  });
}

// ---- broadcast: the root's buffer on every rank; flat, and hierarchical (below).

using BroadcastFn = void (*)(const alg::Context&, void*, size_t, int);

void broadcast_cases(RankContext& rc, const char* name, BroadcastFn fn, bool pipelined,
                     const std::string& shape = "") {
  const int rank = rc.rank();
  sweep_moves([&](DataType d, size_t n) {
    const size_t elem = dtype_size(d);
    for (int root : roots_for(rc.size(), n)) {
      for (size_t segment : segments(pipelined, n)) {
        Bytes buf(n * elem + elem, kSentinelByte);
        if (rank == root) fill_move(d, root, buf.data(), 0, n);
        fn(rc.begin("broadcast", d, false, ReduceOp::kSum, n, root, segment), buf.data(), n, root);
        std::string at = where(name, rc, d, "-", n, segment, false, shape) + ", root " +
                         std::to_string(root);
        EXPECT_EQ(check_move(d, root, buf.data(), 0, n), "") << at;
        EXPECT_EQ(check_sentinel(buf.data() + n * elem, elem), "") << at;
      }
    }
  });
}

TEST_P(AlgorithmsTest, Broadcast) {
  on_ranks(GetParam(), [](RankContext& rc) {
    broadcast_cases(rc, "broadcast_binomial", alg::broadcast_binomial, false);
    broadcast_cases(rc, "broadcast_chain", alg::broadcast_chain, true);
  });
}

// ---- reduce: the reduction on the root only; the other ranks' output untouched.

using ReduceAlgoFn = void (*)(const alg::Context&, const void*, void*, size_t, int);

void reduce_cases(RankContext& rc, const char* name, ReduceAlgoFn fn, bool pipelined) {
  const int rank = rc.rank();
  sweep_reductions(rc, [&](DataType d, ReduceOp op, const ReduceExpectation& expect, size_t n) {
    const size_t elem = dtype_size(d);
    for (int root : roots_for(rc.size(), n)) {
      for (size_t segment : segments(pipelined, n)) {
        Bytes in(n * elem), out(n * elem + elem, kSentinelByte);
        fill_reduce_input(d, op, rank, in.data(), 0, n);
        fn(rc.begin("reduce", d, true, op, n, root, segment), in.data(), out.data(), n, root);
        std::string at = where(name, rc, d, op_name(op), n, segment, false, "") + ", root " +
                         std::to_string(root);
        if (rank == root) {
          EXPECT_EQ(expect.check(out.data(), 0, n), "") << at;
          EXPECT_EQ(check_sentinel(out.data() + n * elem, elem), "") << at;
        } else {
          EXPECT_EQ(check_sentinel(out.data(), out.size()), "") << at;
        }
        EXPECT_EQ(check_reduce_input(d, op, rank, in.data(), 0, n), "") << at;
      }
    }
  });
}

TEST_P(AlgorithmsTest, Reduce) {
  on_ranks(GetParam(), [](RankContext& rc) {
    reduce_cases(rc, "reduce_binomial", alg::reduce_binomial, false);
    reduce_cases(rc, "reduce_ring", alg::reduce_ring, true);
  });
}

// ---- gather and scatter (direct, binomial tree), every root.

using RootedFn = void (*)(const alg::Context&, const void*, void*, size_t, int);

void gather_scatter_cases(RankContext& rc, const char* gather_name, RootedFn gather, const char* scatter_name,
                          RootedFn scatter) {
  const int rank = rc.rank(), size = rc.size();
  sweep_moves([&](DataType d, size_t n) {
    const size_t elem = dtype_size(d), total = n * size;
    for (int root : roots_for(size, n)) {
      for (bool in_place : {false, true}) {
        // In place: the root's own block is already at its place in the result
        // (gather) or taken from it (scatter).
        const bool at_root = in_place && rank == root;
        std::string at = where(gather_name, rc, d, "-", n, 0, in_place, "") + ", root " + std::to_string(root);
        Bytes in(n * elem), out(total * elem + elem, kSentinelByte);
        uint8_t* own = at_root ? out.data() + static_cast<size_t>(root) * n * elem : in.data();
        fill_move(d, rank, own, 0, n);
        gather(rc.begin("gather", d, false, ReduceOp::kSum, n, root), own, out.data(), n, root);
        if (rank == root) {
          for (int r = 0; r < size; ++r) {
            EXPECT_EQ(check_move(d, r, out.data() + r * n * elem, 0, n), "") << at << ", block " << r;
          }
          EXPECT_EQ(check_sentinel(out.data() + total * elem, elem), "") << at;
        } else {
          EXPECT_EQ(check_sentinel(out.data(), out.size()), "") << at;
        }
        if (!at_root) {
          EXPECT_EQ(check_move(d, rank, in.data(), 0, n), "") << at;
        }

        at = where(scatter_name, rc, d, "-", n, 0, in_place, "") + ", root " + std::to_string(root);
        Bytes all(total * elem), mine(n * elem + elem, kSentinelByte);
        if (rank == root) fill_move(d, root, all.data(), 0, total);
        uint8_t* result = at_root ? all.data() + static_cast<size_t>(root) * n * elem : mine.data();
        scatter(rc.begin("scatter", d, false, ReduceOp::kSum, n, root), all.data(), result, n, root);
        EXPECT_EQ(check_move(d, root, result, static_cast<size_t>(rank) * n, n), "") << at;
        if (!at_root) {
          EXPECT_EQ(check_sentinel(mine.data() + n * elem, elem), "") << at;
        }
        if (rank == root) {
          EXPECT_EQ(check_move(d, root, all.data(), 0, total), "") << at;
        }
      }
    }
  });
}

TEST_P(AlgorithmsTest, GatherScatter) {
  on_ranks(GetParam(), [](RankContext& rc) {
    gather_scatter_cases(rc, "gather_direct", alg::gather_direct, "scatter_direct", alg::scatter_direct);
    gather_scatter_cases(rc, "gather_binomial", alg::gather_binomial, "scatter_binomial", alg::scatter_binomial);
  });
}

// ---- alltoallv (pairwise): rank r sends c(r, q) elements to q, from displacements
// with a gap between blocks; q receives them in its own layout.

TEST_P(AlgorithmsTest, Alltoallv) {
  on_ranks(GetParam(), [](RankContext& rc) {
    const int rank = rc.rank(), size = rc.size();
    sweep_moves([&](DataType d, size_t n) {
      const size_t elem = dtype_size(d);
      auto c = [&](int from, int to) {
        return n == 0 ? size_t{0} : n + static_cast<size_t>((from + 2 * to) % 3);
      };
      // Counts and displacements of `r`'s blocks: to (sending) or from every rank.
      auto layout = [&](int r, bool sending) {
        std::vector<size_t> counts(size), displs(size);
        size_t at = 1;  // element 0 is a gap too
        for (int q = 0; q < size; ++q) {
          counts[q] = sending ? c(r, q) : c(q, r);
          displs[q] = at;
          at += counts[q] + 1;
        }
        return std::make_pair(counts, displs);
      };
      auto [send_counts, send_displs] = layout(rank, true);
      auto [recv_counts, recv_displs] = layout(rank, false);
      const size_t in_total = send_displs.back() + send_counts.back() + 1;
      const size_t out_total = recv_displs.back() + recv_counts.back() + 1;
      Bytes in(in_total * elem), out(out_total * elem, kSentinelByte);
      fill_move(d, rank, in.data(), 0, in_total);
      alg::alltoallv_pairwise(rc.begin("alltoallv", d, false, ReduceOp::kSum, 0), in.data(),
                              send_counts, send_displs, out.data(), recv_counts, recv_displs);
      std::string at = where("alltoallv_pairwise", rc, d, "-", n, 0, false, "");
      for (int q = 0; q < size; ++q) {
        const size_t first = layout(q, true).second[rank];  // where q sent it from
        EXPECT_EQ(check_move(d, q, out.data() + recv_displs[q] * elem, first, recv_counts[q]), "")
            << at << ", from rank " << q;
        EXPECT_EQ(check_sentinel(out.data() + (recv_displs[q] - 1) * elem, elem), "")
            << at << ", gap before block " << q;
      }
      EXPECT_EQ(check_move(d, rank, in.data(), 0, in_total), "") << at;
    });
  });
}

// ---- barrier (dissemination): no rank leaves before every rank has arrived.

TEST_P(AlgorithmsTest, Barrier) {
  std::atomic<int> arrived{0};
  on_ranks(GetParam(), [&](RankContext& rc) {
    for (int round = 1; round <= 20; ++round) {
      arrived.fetch_add(1);
      alg::barrier_dissemination(rc.begin("barrier", DataType::kUInt8, false, ReduceOp::kSum, 0));
      EXPECT_GE(arrived.load(), round * rc.size())
          << "rank " << rc.rank() << " left round " << round << " early";
      // A second barrier keeps the next round's arrivals behind every rank's check.
      alg::barrier_dissemination(rc.begin("barrier", DataType::kUInt8, false, ReduceOp::kSum, 0));
    }
  });
}

// ---- hierarchical allreduce, broadcast and allgather on simulated nodes: blocks of
// consecutive ranks and interleaved ranks (node = rank % nodes) of every uniform shape
// of the size, and shapes they cannot run (one node; one rank per node; nodes of
// different sizes), where they must fall back to a flat algorithm.

struct Layout {
  std::string name;
  std::vector<std::string> node_ids;  // per rank
};

std::vector<Layout> layouts(int size) {
  std::vector<Layout> out;
  auto add = [&](std::string name, auto node) {
    Layout l{std::move(name), {}};
    for (int r = 0; r < size; ++r) l.node_ids.push_back("node" + std::to_string(node(r)));
    out.push_back(l);
  };
  for (int nodes = 2; nodes < size; ++nodes) {
    if (size % nodes != 0) continue;
    const int local = size / nodes;
    const std::string shape = std::to_string(nodes) + "x" + std::to_string(local);
    add("blocks " + shape, [&](int r) { return r / local; });
    add("interleaved " + shape, [&](int r) { return r % nodes; });
  }
  add("one node", [](int) { return 0; });
  if (size > 1) add("one rank per node", [](int r) { return r; });
  if (size > 2) {
    add("nodes of 1 and " + std::to_string(size - 1), [](int r) { return r == 0 ? 0 : 1; });
  }
  return out;
}

using AllgatherFn = void (*)(const alg::Context&, const void*, void*, size_t);

// Allgather of equal blocks (hierarchical below, and Bruck's): out's block r = rank r's
// in, the sentinel after the result, in place and out of place.
void allgather_cases(RankContext& rc, const char* name, AllgatherFn fn, const std::string& shape = "") {
  const int rank = rc.rank(), size = rc.size();
  sweep_moves([&](DataType d, size_t n) {
    const size_t elem = dtype_size(d), total = n * size;
    for (bool in_place : {false, true}) {
      Bytes in(n * elem), out(total * elem + elem, kSentinelByte);
      uint8_t* own = out.data() + static_cast<size_t>(rank) * n * elem;
      fill_move(d, rank, in_place ? own : in.data(), 0, n);
      fn(rc.begin("allgather", d, false, ReduceOp::kSum, n), in_place ? own : in.data(), out.data(), n);
      std::string at = where(name, rc, d, "-", n, 0, in_place, shape);
      for (int r = 0; r < size; ++r) {
        EXPECT_EQ(check_move(d, r, out.data() + r * n * elem, 0, n), "") << at << ", block " << r;
      }
      EXPECT_EQ(check_sentinel(out.data() + total * elem, elem), "") << at;
      if (!in_place) {
        EXPECT_EQ(check_move(d, rank, in.data(), 0, n), "") << at;
      }
    }
  });
}

// The hierarchical algorithms as a communicator runs them: with its plan's choice of
// what runs between and inside nodes (communicator/plan.cc), for the call's size, the
// layout and the context's tuning.
using communicator::planned_allreduce_hierarchical;
using communicator::planned_broadcast_hierarchical;

TEST_P(AlgorithmsTest, Hierarchical) {
  for (const Layout& layout : layouts(GetParam())) {
    on_ranks(
        GetParam(),
        [&](RankContext& rc) {
          allreduce_cases(rc, "allreduce_hierarchical", planned_allreduce_hierarchical, false, layout.name);
          broadcast_cases(rc, "broadcast_hierarchical", planned_broadcast_hierarchical, false, layout.name);
          allgather_cases(rc, "allgather_hierarchical", alg::allgather_hierarchical, layout.name);
        },
        layout.node_ids);
  }
}

// ---- allgather (Bruck): ceil(log2 size) rounds, sizes that are not powers of two
// included, and the final rotation.

TEST_P(AlgorithmsTest, AllgatherBruck) {
  on_ranks(GetParam(), [](RankContext& rc) { allgather_cases(rc, "allgather_bruck", alg::allgather_bruck); });
}

// ---- alltoall (Bruck): ceil(log2 size) rounds of the blocks whose index has the
// round's bit set, and the rotations; out's block q = block `rank` of rank q's in, in
// place and out of place.

TEST_P(AlgorithmsTest, AlltoallBruck) {
  on_ranks(GetParam(), [](RankContext& rc) {
    const int rank = rc.rank(), size = rc.size();
    sweep_moves([&](DataType d, size_t n) {
      const size_t elem = dtype_size(d), total = n * size;
      for (bool in_place : {false, true}) {
        // Rank q's block for rank p: elements p * n .. (p + 1) * n - 1 of q's pattern.
        Bytes in(total * elem), out(total * elem + elem, kSentinelByte);
        fill_move(d, rank, in_place ? out.data() : in.data(), 0, total);
        alg::alltoall_bruck(rc.begin("alltoall", d, false, ReduceOp::kSum, n), in_place ? out.data() : in.data(),
                            out.data(), n);
        std::string at = where("alltoall_bruck", rc, d, "-", n, 0, in_place, "");
        for (int q = 0; q < size; ++q) {
          EXPECT_EQ(check_move(d, q, out.data() + q * n * elem, static_cast<size_t>(rank) * n, n), "")
              << at << ", from rank " << q;
        }
        EXPECT_EQ(check_sentinel(out.data() + total * elem, elem), "") << at;
        if (!in_place) {
          EXPECT_EQ(check_move(d, rank, in.data(), 0, total), "") << at;
        }
      }
    });
  });
}

// Every inner choice the plan can make, whatever the size: each allreduce between nodes
// and each broadcast, whole and pipelined, on the layouts of several nodes.
TEST_P(AlgorithmsTest, HierarchicalEveryInnerChoice) {
  const std::pair<const char*, AllreduceFn> crosses[] = {{"rd", alg::allreduce_recursive_doubling},
                                                         {"hd", alg::allreduce_halving_doubling},
                                                         {"ring", alg::allreduce_ring}};
  const std::pair<const char*, BroadcastFn> broadcasts[] = {{"binomial", alg::broadcast_binomial},
                                                            {"chain", alg::broadcast_chain}};
  const int size = GetParam();
  for (const Layout& layout : layouts(size)) {
    on_ranks(
        size,
        [&](RankContext& rc) {
          const DataType d = DataType::kFloat32;
          const size_t elem = dtype_size(d);
          ReduceExpectation expect(d, ReduceOp::kSum, size);
          for (auto [cross_name, cross] : crosses) {
            for (auto [broadcast_name, broadcast] : broadcasts) {
              for (size_t chunk_count : {size_t{0}, size_t{16}}) {
                const alg::HierarchicalChoice how{cross, broadcast, chunk_count};
                const std::string shape = layout.name + ", " + cross_name + ", " + broadcast_name +
                                          ", chunks of " + std::to_string(chunk_count);
                for (size_t n : {size_t{1}, size_t{7}, size_t{1000}}) {
                  Bytes in(n * elem), out(n * elem + elem, kSentinelByte);
                  fill_reduce_input(d, ReduceOp::kSum, rc.rank(), in.data(), 0, n);
                  alg::allreduce_hierarchical(rc.begin("allreduce", d, true, ReduceOp::kSum, n), how,
                                              in.data(), out.data(), n);
                  std::string at = where("allreduce_hierarchical", rc, d, "sum", n, 0, false, shape);
                  EXPECT_EQ(expect.check(out.data(), 0, n), "") << at;
                  EXPECT_EQ(check_sentinel(out.data() + n * elem, elem), "") << at;
                  const int root = static_cast<int>(n % static_cast<size_t>(size));
                  Bytes buf(n * elem + elem, kSentinelByte);
                  if (rc.rank() == root) fill_move(d, root, buf.data(), 0, n);
                  alg::broadcast_hierarchical(rc.begin("broadcast", d, false, ReduceOp::kSum, n, root), how,
                                              buf.data(), n, root);
                  at = where("broadcast_hierarchical", rc, d, "-", n, 0, false, shape) + ", root " +
                       std::to_string(root);
                  EXPECT_EQ(check_move(d, root, buf.data(), 0, n), "") << at;
                  EXPECT_EQ(check_sentinel(buf.data() + n * elem, elem), "") << at;
                }
              }
            }
          }
        },
        layout.node_ids);
  }
}

// The pipelined hierarchical allreduce (chunks of Tuning::hier_chunk_bytes) at its
// chunk boundaries: chunks of 64 and 100 bytes (16 and 25 f32, 12 f64, 50 bf16, 100 i8:
// one element per chunk more or less than a multiple of the element), counts below,
// at and just above one chunk, odd ones that leave a last chunk smaller than the ranks
// of a node (empty blocks), and many chunks; and with at most 3 chunks, which makes
// them larger; every shape of the size.
TEST_P(AlgorithmsTest, HierarchicalChunks) {
  const size_t counts[] = {0, 1, 7, 16, 17, 33, 1000, 4099};
  for (const Layout& layout : layouts(GetParam())) {
    on_ranks(
        GetParam(),
        [&](RankContext& rc) {
          const int rank = rc.rank();
          // {chunk bytes, most chunks}: no cap, and a cap of 3 chunks (larger chunks
          // of count / 3 elements, rounded up) from 4099 down to 33 elements.
          const std::pair<size_t, size_t> chunkings[] = {{64, SIZE_MAX}, {100, SIZE_MAX}, {64, 3}};
          for (auto [chunk, max_chunks] : chunkings) {
            alg::Tuning tuning;
            tuning.hier_chunk_bytes = chunk;
            tuning.hier_max_chunks = max_chunks;
            rc.use_tuning(tuning);
            for (DataType d : {DataType::kFloat32, DataType::kFloat64, DataType::kBFloat16,
                               DataType::kInt8}) {
              const size_t elem = dtype_size(d);
              for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
                ReduceExpectation expect(d, op, rc.size());
                for (size_t n : counts) {
                  for (bool in_place : {false, true}) {
                    Bytes in(n * elem), out(n * elem + elem, kSentinelByte);
                    fill_reduce_input(d, op, rank, in.data(), 0, n);
                    if (in_place && n > 0) std::memcpy(out.data(), in.data(), n * elem);
                    planned_allreduce_hierarchical(rc.begin("allreduce", d, true, op, n),
                                                   in_place ? out.data() : in.data(), out.data(), n);
                    std::string at = where("allreduce_hierarchical", rc, d, op_name(op), n, 0,
                                           in_place, layout.name + ", chunk " + std::to_string(chunk) +
                                               ", at most " + std::to_string(max_chunks));
                    EXPECT_EQ(expect.check(out.data(), 0, n), "") << at;
                    EXPECT_EQ(check_sentinel(out.data() + n * elem, elem), "") << at;
                    if (!in_place) {
                      EXPECT_EQ(check_reduce_input(d, op, rank, in.data(), 0, n), "") << at;
                    }
                  }
                }
              }
            }
          }
          rc.use_tuning(alg::kDefaultTuning);
        },
        layout.node_ids);
  }
}

std::string size_name(const testing::TestParamInfo<int>& info) {
  return "size" + std::to_string(info.param);
}

INSTANTIATE_TEST_SUITE_P(FakeTransport, AlgorithmsTest, testing::Range(1, 9), size_name);

}  // namespace
}  // namespace chorus
