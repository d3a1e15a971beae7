// Hierarchical allreduce, broadcast and allgather on simulated nodes: rank threads of
// this process with different CommOptions::node_id (the environment, CHORUS_NODE_ID,
// is shared by all threads, so it cannot tell them apart).
//
// One TEST_P instance per layout of ranks on nodes: consecutive blocks (2x2, 2x3, 3x2,
// 2x4, 4x2), interleaved (node = rank % nodes) and crossed placements (where the ranks
// with one local rank are not in node order), and shapes the hierarchical algorithms
// cannot run (one node; one rank per node; nodes of different sizes), where the forced
// algorithm must fall back and still give the right results.
//
// Every case checks the result against the closed forms of tests/util/expected.h, that
// an out-of-place send buffer is unchanged, and for allreduce that every rank holds
// bitwise the same result.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <ostream>
#include <stdexcept>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "chorus/chorus.h"
#include "comm/transport/subset_transport.h"
#include "util/expected.h"
#include "util/ranks.h"

namespace chorus {
namespace {

using test::check_move;
using test::check_reduce_input;
using test::fill_move;
using test::fill_reduce_input;
using test::ReduceExpectation;

// Counts: empty, one element (fewer than the ranks of a node: empty blocks), small, not
// divisible by any local size used here (2, 3, 4), and large (~100k).
constexpr size_t kCounts[] = {0, 1, 7, 1001, 100003};
constexpr size_t kLarge = 100003;
// Large enough that each rank's block of f32 exceeds 1 MiB with 2 ranks per node, so
// that the cross-node phase runs the ring rather than halving-doubling.
constexpr size_t kHuge = (size_t{1} << 19) + 5;
constexpr int kMaxFailedCases = 10;

// ----- layouts -----

struct Layout {
  const char* name;
  std::vector<int> node_of;  // node of every rank
  bool hierarchical;         // whether the forced algorithm can run (uniform, >1 x >1)

  int size() const { return static_cast<int>(node_of.size()); }
};

// gtest prints a failing test's parameter: the layout's name, not its bytes.
void PrintTo(const Layout& layout, std::ostream* os) { *os << layout.name; }

std::vector<int> blocks(int nodes, int per_node) {
  std::vector<int> v;
  for (int r = 0; r < nodes * per_node; ++r) v.push_back(r / per_node);
  return v;
}

std::vector<int> interleaved(int nodes, int per_node) {
  std::vector<int> v;
  for (int r = 0; r < nodes * per_node; ++r) v.push_back(r % nodes);
  return v;
}

std::vector<Layout> layouts() {
  return {
      {"blocks_2x2", blocks(2, 2), true},
      {"blocks_2x3", blocks(2, 3), true},
      {"blocks_3x2", blocks(3, 2), true},
      {"blocks_2x4", blocks(2, 4), true},
      {"blocks_4x2", blocks(4, 2), true},
      {"interleaved_2x2", interleaved(2, 2), true},
      {"interleaved_2x3", interleaved(2, 3), true},
      {"interleaved_3x2", interleaved(3, 2), true},
      // Nodes {0, 3} and {1, 2}: local rank 1 is rank 3 on node 0 but rank 2 on node 1.
      {"crossed_2x2", {0, 1, 1, 0}, true},
      {"fallback_1x4", {0, 0, 0, 0}, false},
      {"fallback_4x1", {0, 1, 2, 3}, false},
      {"fallback_3x1", {0, 1, 2}, false},
      {"fallback_3_on_2", {0, 0, 1}, false},
  };
}

// ----- a group of ranks on simulated nodes -----

CommOptions options_for(const Layout& layout, int rank, const std::string& cost_model) {
  CommOptions options = test::test_options();
  options.algorithm = Algorithm::kHierarchical;
  options.timeout = std::chrono::seconds(60);
  options.node_id = "node" + std::to_string(layout.node_of[rank]);
  options.cost_model = cost_model;
  return options;
}

// Like test::RankGroup, with per-rank options: connected once per layout, rebuilt after
// a failed run.
class NodeGroup {
 public:
  // `cost_model`: CHORUS_COST_MODEL's text for every rank (tuning thresholds).
  explicit NodeGroup(const Layout& layout, std::string cost_model = "")
      : layout_(layout), cost_model_(std::move(cost_model)) {}
  ~NodeGroup() { destroy(); }

  // Runs body on every rank; throws test::RankFailure if any rank failed.
  void run(const std::function<void(Communicator&)>& body) {
    if (comms_.empty()) connect();
    auto abort_others = [&](int failed) {
      for (int r = 0; r < layout_.size(); ++r) {
        if (r != failed) comms_[r]->abort("test: rank " + std::to_string(failed) + " failed");
      }
    };
    auto errors = test::run_threads(
        layout_.size(), [&](int rank) { body(*comms_[rank]); }, test::kDefaultRankDeadline,
        abort_others);
    for (const auto& error : errors) {
      if (error) {
        destroy();
        test::rethrow_rank_failures(errors);
      }
    }
  }

 private:
  void connect() {
    store_ = std::make_shared<InMemoryStore>();
    comms_.assign(layout_.size(), nullptr);
    auto errors = test::run_threads(layout_.size(), [&](int rank) {
      comms_[rank] = Communicator::create(store_, rank, layout_.size(),
                                          options_for(layout_, rank, cost_model_));
    });
    for (const auto& error : errors) {
      if (error) {
        destroy();
        test::rethrow_rank_failures(errors);
      }
    }
  }

  // Communicators close together (a clean close talks to the peers).
  void destroy() {
    if (comms_.empty()) return;
    test::run_threads(layout_.size(), [&](int rank) { comms_[rank].reset(); },
                      std::chrono::seconds(60));
    comms_.clear();
  }

  Layout layout_;
  std::string cost_model_;
  std::shared_ptr<InMemoryStore> store_;
  std::vector<std::shared_ptr<Communicator>> comms_;
};

// ----- cases -----

struct Case {
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  size_t count = 0;
  bool in_place = false;
  int root = 0;

  std::string name(const char* collective) const {
    std::ostringstream s;
    s << collective << " dtype=" << dtype_name(dtype) << " op=" << op_name(op)
      << " count=" << count << (in_place ? " in-place" : " out-of-place") << " root=" << root;
    return s.str();
  }
};

struct RankResult {
  std::string errors;
  uint64_t checksum = 0;
  bool ran = false;  // the rank finished the case (a batch that threw stops its ranks)
  void expect(const std::string& what, const std::string& problem) {
    if (!problem.empty()) errors += what + ": " + problem + "\n";
  }
};

using CaseFn = std::function<void(Communicator&, const Case&, RankResult&)>;

// 8-byte aligned bytes; data() is null when empty (count-0 cases pass null pointers).
class Buffer {
 public:
  explicit Buffer(size_t bytes) : words_((bytes + 7) / 8), bytes_(bytes) {
    if (bytes_ != 0) std::memset(words_.data(), test::kSentinelByte, bytes_);
  }
  uint8_t* data() { return bytes_ == 0 ? nullptr : reinterpret_cast<uint8_t*>(words_.data()); }
  uint8_t* at(size_t index, DataType dtype) { return data() + index * dtype_size(dtype); }

 private:
  std::vector<uint64_t> words_;
  size_t bytes_;
};

// Runs every case on one group, back to back (test::run_case_batches), reporting
// failures with the case and the rank.
void run_cases(const Layout& layout, const char* collective, const std::vector<Case>& cases,
               const CaseFn& fn, bool identical_results = false,
               const std::string& cost_model = "") {
  NodeGroup group(layout, cost_model);
  std::vector<std::vector<RankResult>> results(cases.size(),
                                               std::vector<RankResult>(layout.size()));
  int failed_cases = test::run_case_batches(
      layout.size(), cases.size(), [&](size_t) { return cases.size(); },
      [&](size_t begin, size_t end, std::vector<size_t>& at) {
        group.run([&](Communicator& c) {
          for (size_t i = begin; i < end; ++i) {
            at[c.rank()] = i;
            fn(c, cases[i], results[i][c.rank()]);
            results[i][c.rank()].ran = true;
          }
        });
      },
      [&](const std::vector<size_t>& at, const test::RankFailure& failure) {
        std::ostringstream where;
        for (int r = 0; r < layout.size(); ++r) {
          where << "\n  rank " << r << " was in: " << cases[at[r]].name(collective);
        }
        ADD_FAILURE() << layout.name << ": a rank threw" << where.str() << "\n" << failure.what();
      },
      kMaxFailedCases);
  for (size_t i = 0; i < cases.size() && failed_cases < kMaxFailedCases; ++i) {
    const std::string where = std::string(layout.name) + " " + cases[i].name(collective);
    bool failed = false;
    for (int r = 0; r < layout.size(); ++r) {
      const RankResult& result = results[i][r];
      if (!result.errors.empty()) {
        ADD_FAILURE() << where << " rank " << r << ":\n" << result.errors;
        failed = true;
      }
      if (identical_results && !failed && result.ran && results[i][0].ran &&
          result.checksum != results[i][0].checksum) {
        ADD_FAILURE() << where << ": rank " << r << "'s result differs bitwise from rank 0's";
        failed = true;
      }
    }
    if (failed) ++failed_cases;
  }
  if (failed_cases >= kMaxFailedCases) {
    ADD_FAILURE() << "stopping after " << failed_cases << " failed cases";
  }
}

// The algorithm the communicator must pick for a hierarchical-capable collective.
void expect_algorithm(Communicator& c, const char* collective, size_t bytes, const Layout& layout,
                      RankResult& res) {
  Algorithm got = c.algorithm_for(collective, bytes);
  bool is_hier = got == Algorithm::kHierarchical;
  if (is_hier != layout.hierarchical) {
    res.expect("algorithm_for", std::string(collective) + " chose " + algorithm_name(got));
  }
}

// ----- per-collective bodies -----

void allreduce_case(const Layout& layout, Communicator& c, const Case& k, RankResult& res) {
  const size_t n = k.count, bytes = n * dtype_size(k.dtype);
  expect_algorithm(c, "allreduce", bytes, layout, res);
  Buffer send(bytes), recv(k.in_place ? 0 : bytes);
  fill_reduce_input(k.dtype, k.op, c.rank(), send.data(), 0, n);
  uint8_t* out = k.in_place ? send.data() : recv.data();
  c.allreduce(send.data(), out, n, k.dtype, k.op).wait();
  res.expect("result", ReduceExpectation(k.dtype, k.op, c.size()).check(out, 0, n));
  if (!k.in_place) {
    res.expect("send buffer", check_reduce_input(k.dtype, k.op, c.rank(), send.data(), 0, n));
  }
  res.checksum = test::checksum(out, bytes);
}

void broadcast_case(const Layout& layout, Communicator& c, const Case& k, RankResult& res) {
  const size_t n = k.count, bytes = n * dtype_size(k.dtype);
  expect_algorithm(c, "broadcast", bytes, layout, res);
  const bool is_root = c.rank() == k.root;
  Buffer send(bytes), recv(k.in_place ? 0 : bytes);
  if (is_root) fill_move(k.dtype, k.root, send.data(), 0, n);
  uint8_t* out = k.in_place ? send.data() : recv.data();
  c.broadcast(send.data(), out, n, k.dtype, k.root).wait();
  res.expect("result", check_move(k.dtype, k.root, out, 0, n));
  if (is_root && !k.in_place) {
    res.expect("root's send buffer", check_move(k.dtype, k.root, send.data(), 0, n));
  }
}

void allgather_case(const Layout& layout, Communicator& c, const Case& k, RankResult& res) {
  const size_t n = k.count, size = c.size(), es = dtype_size(k.dtype);
  expect_algorithm(c, "allgather", size * n * es, layout, res);
  Buffer recv(size * n * es), own(k.in_place ? 0 : n * es);
  uint8_t* send = k.in_place ? recv.at(c.rank() * n, k.dtype) : own.data();
  fill_move(k.dtype, c.rank(), send, 0, n);
  c.allgather(send, recv.data(), n, k.dtype).wait();
  for (size_t r = 0; r < size; ++r) {
    res.expect("block of rank " + std::to_string(r),
               check_move(k.dtype, static_cast<int>(r), recv.at(r * n, k.dtype), 0, n));
  }
  if (!k.in_place) res.expect("send buffer", check_move(k.dtype, c.rank(), send, 0, n));
}

// ----- the tests -----

class HierarchicalTest : public ::testing::TestWithParam<Layout> {
 protected:
  // Binds a per-collective body to this test's layout.
  template <class Fn>
  CaseFn bound(Fn fn) {
    const Layout& layout = GetParam();
    return [&layout, fn](Communicator& c, const Case& k, RankResult& res) {
      fn(layout, c, k, res);
    };
  }
};

// The topology the communicator found, and which algorithm it picks for each
// collective: hierarchical where the shape allows it, never for the others.
TEST_P(HierarchicalTest, TopologyAndChoice) {
  const Layout& layout = GetParam();
  std::set<int> distinct(layout.node_of.begin(), layout.node_of.end());
  NodeGroup group(layout);
  group.run([&](Communicator& c) {
    const Topology& t = c.topology();
    EXPECT_EQ(t.nodes, static_cast<int>(distinct.size())) << "rank " << c.rank();
    EXPECT_EQ(t.node_of.size(), layout.node_of.size());
    for (int r = 0; r < c.size(); ++r) {
      // Same node in the layout <=> same node in the topology.
      EXPECT_EQ(layout.node_of[r] == layout.node_of[c.rank()], t.node_of[r] == t.node)
          << "rank " << c.rank() << " about rank " << r;
    }
    for (size_t bytes : {size_t{0}, size_t{4}, size_t{1} << 20, size_t{64} << 20}) {
      for (const char* coll : {"allreduce", "broadcast", "allgather"}) {
        EXPECT_EQ(c.algorithm_for(coll, bytes) == Algorithm::kHierarchical, layout.hierarchical)
            << "rank " << c.rank() << " " << coll << " bytes=" << bytes << " chose "
            << algorithm_name(c.algorithm_for(coll, bytes));
      }
      for (const char* coll : {"reduce", "reduce_scatter", "allgatherv", "alltoall"}) {
        EXPECT_NE(c.algorithm_for(coll, bytes), Algorithm::kHierarchical) << coll;
      }
    }
  });
}

// Every dtype x op x count, in and out of place; every rank must hold the same bytes.
TEST_P(HierarchicalTest, Allreduce) {
  std::vector<Case> cases;
  for (size_t count : kCounts) {
    for (DataType dtype : kAllDataTypes) {
      for (ReduceOp op : kAllReduceOps) {
        for (bool in_place : {false, true}) {
          if (count == kLarge && in_place) continue;  // the large count: out of place only
          cases.push_back(Case{dtype, op, count, in_place, 0});
        }
      }
    }
  }
  // The ring in the cross-node phase (blocks over 1 MiB), with rounding in f32 and bf16.
  for (auto [dtype, op] : {std::pair{DataType::kFloat32, ReduceOp::kSum},
                           std::pair{DataType::kBFloat16, ReduceOp::kAvg},
                           std::pair{DataType::kInt32, ReduceOp::kMax}}) {
    cases.push_back(Case{dtype, op, kHuge, true, 0});
  }
  run_cases(GetParam(), "allreduce", cases, bound(allreduce_case), /*identical_results=*/true);
}

// The pipelined allreduce at its chunk boundaries, through the node's shared memory
// and tcp: chunks of 100 bytes (25 f32, 12 f64, 50 bf16, 100 i8), counts of no chunk,
// one chunk, one element more (a last chunk smaller than a node: empty blocks), odd
// and many chunks. Each case runs twice on the same inputs, which must give the same
// bytes (the sums' order depends on nothing but the call).
TEST_P(HierarchicalTest, AllreduceChunks) {
  std::vector<Case> cases;
  for (size_t count : {size_t{0}, size_t{1}, size_t{25}, size_t{26}, size_t{33}, size_t{1001},
                       size_t{4099}}) {
    for (DataType dtype : {DataType::kFloat32, DataType::kFloat64, DataType::kBFloat16,
                           DataType::kInt8}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
        cases.push_back(Case{dtype, op, count, (count + static_cast<size_t>(op)) % 2 == 0, 0});
      }
    }
  }
  auto twice = [&](const Layout& layout, Communicator& c, const Case& k, RankResult& res) {
    allreduce_case(layout, c, k, res);
    const uint64_t first = res.checksum;
    allreduce_case(layout, c, k, res);
    if (res.checksum != first) res.expect("second run", "differs bitwise from the first");
  };
  run_cases(GetParam(), "allreduce", cases, bound(twice), /*identical_results=*/true,
            "hier_chunk_bytes=100,hier_max_chunks=1000");
}

// Every root, every dtype on the small counts; the large count (the chain algorithm in
// both phases) with f32 and i8.
TEST_P(HierarchicalTest, Broadcast) {
  std::vector<Case> cases;
  for (int root = 0; root < GetParam().size(); ++root) {
    for (size_t count : kCounts) {
      for (DataType dtype : kAllDataTypes) {
        if (count == kLarge && dtype != DataType::kFloat32 && dtype != DataType::kInt8) continue;
        cases.push_back(Case{dtype, ReduceOp::kSum, count, (root + count) % 2 == 0, root});
      }
    }
  }
  run_cases(GetParam(), "broadcast", cases, bound(broadcast_case));
}

// Every dtype on the small counts, in and out of place; the large count with f32 and u8.
TEST_P(HierarchicalTest, Allgather) {
  std::vector<Case> cases;
  for (size_t count : kCounts) {
    for (DataType dtype : kAllDataTypes) {
      if (count == kLarge && dtype != DataType::kFloat32 && dtype != DataType::kUInt8) continue;
      for (bool in_place : {false, true}) cases.push_back(Case{dtype, ReduceOp::kSum, count, in_place, 0});
    }
  }
  run_cases(GetParam(), "allgather", cases, bound(allgather_case));
}

// Hierarchical collectives interleaved with flat ones on one communicator: the phases
// must leave nothing pending on the shared streams.
TEST_P(HierarchicalTest, MixedWithFlatCollectives) {
  const Layout& layout = GetParam();
  NodeGroup group(layout);
  group.run([&](Communicator& c) {
    const size_t n = 1001, size = c.size();
    std::vector<float> a(n), gathered(n * size), bcast(n);
    std::vector<int32_t> scattered(n);
    std::vector<int32_t> rs_in(n * size);
    for (int round = 0; round < 5; ++round) {
      fill_reduce_input(DataType::kFloat32, ReduceOp::kSum, c.rank(), a.data(), 0, n);
      fill_reduce_input(DataType::kInt32, ReduceOp::kSum, c.rank(), rs_in.data(), 0, n * size);
      fill_move(DataType::kFloat32, c.rank(), bcast.data(), 0, n);
      Work w1 = c.allreduce(a.data(), n, DataType::kFloat32, ReduceOp::kSum);
      Work w2 = c.reduce_scatter(rs_in.data(), scattered.data(), n, DataType::kInt32,
                                 ReduceOp::kSum);
      Work w3 = c.allgather(a.data(), gathered.data(), n, DataType::kFloat32);
      Work w4 = c.broadcast(bcast.data(), n, DataType::kFloat32, round % c.size());
      w1.wait();
      w2.wait();
      w3.wait();
      w4.wait();
      ReduceExpectation f32(DataType::kFloat32, ReduceOp::kSum, c.size());
      EXPECT_EQ(f32.check(a.data(), 0, n), "") << "rank " << c.rank();
      EXPECT_EQ(ReduceExpectation(DataType::kInt32, ReduceOp::kSum, c.size())
                    .check(scattered.data(), c.rank() * n, n),
                "")
          << "rank " << c.rank();
      for (size_t r = 0; r < size; ++r) {
        EXPECT_EQ(f32.check(gathered.data() + r * n, 0, n), "") << "rank " << c.rank();
      }
      EXPECT_EQ(check_move(DataType::kFloat32, round % c.size(), bcast.data(), 0, n), "")
          << "rank " << c.rank();
    }
  });
}

// ----- SubsetTransport alone, over a base that records what reaches it -----

class RecordingTransport : public transport::Transport {
 public:
  RecordingTransport(int rank, int size) : rank_(rank), size_(size) {
    for (int r = 0; r < size; ++r) hosts_.push_back("host" + std::to_string(r));
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& host_of(int rank) const override { return hosts_.at(rank); }
  void begin(const transport::OpInfo& op) override { log.push_back("begin " + std::string(op.name)); }
  transport::Request isend(int peer, const void*, size_t len) override {
    log.push_back("isend " + std::to_string(peer) + " " + std::to_string(len));
    return transport::Request{peer, true, next_++};
  }
  transport::Request irecv(int peer, void*, size_t len) override {
    log.push_back("irecv " + std::to_string(peer) + " " + std::to_string(len));
    return transport::Request{peer, false, next_++};
  }
  void wait(const transport::Request& r) override {
    log.push_back("wait " + std::to_string(r.peer) + " " + std::to_string(r.index));
  }
  bool test(const transport::Request&) const override { return false; }
  void wait_all() override { log.push_back("wait_all"); }
  bool wait_for(const transport::Request* r, std::chrono::microseconds) override {
    log.push_back(r != nullptr ? "wait_for " + std::to_string(r->peer) : "wait_for all");
    return true;
  }
  void interrupt(const std::string& reason) override { log.push_back("interrupt " + reason); }
  void abort(const std::string&) override { log.push_back("abort"); }
  void close() override { log.push_back("close"); }

  std::vector<std::string> log;

 private:
  int rank_, size_;
  uint64_t next_ = 0;
  std::vector<std::string> hosts_;
};

TEST(SubsetTransport, RenumbersAndForwards) {
  RecordingTransport base(5, 8);
  transport::SubsetTransport view(base, {1, 2, 5, 7});
  EXPECT_EQ(view.rank(), 2);
  EXPECT_EQ(view.size(), 4);
  EXPECT_EQ(view.host_of(3), "host7");
  EXPECT_EQ(view.base_rank(0), 1);
  transport::OpInfo op;
  op.name = "allreduce";
  view.begin(op);
  transport::Request s = view.isend(3, nullptr, 8);
  transport::Request r = view.irecv(0, nullptr, 4);
  // Requests are the base's own: waiting through the view or the base is the same.
  EXPECT_EQ(s.peer, 7);
  EXPECT_EQ(r.peer, 1);
  view.wait(s);
  base.wait(r);
  view.wait_all();
  view.interrupt("stop");
  EXPECT_EQ(base.log, (std::vector<std::string>{"begin allreduce", "isend 7 8", "irecv 1 4",
                                                "wait 7 0", "wait 1 1", "wait_all",
                                                "interrupt stop"}));
}

// The view never ends the base's streams (their owner does), and is unusable afterwards.
TEST(SubsetTransport, AbortAndCloseLeaveTheBaseOpen) {
  RecordingTransport base(0, 4);
  transport::SubsetTransport view(base, {0, 3});
  view.abort("failure in a phase");
  view.close();
  EXPECT_TRUE(base.log.empty());
  EXPECT_THROW(view.isend(1, nullptr, 1), Error);
}

TEST(SubsetTransport, RejectsBadMemberLists) {
  RecordingTransport base(2, 4);
  using transport::SubsetTransport;
  EXPECT_THROW(SubsetTransport(base, {0, 1}), std::logic_error);     // this rank missing
  EXPECT_THROW(SubsetTransport(base, {3, 2}), std::logic_error);     // not ascending
  EXPECT_THROW(SubsetTransport(base, {2, 2, 3}), std::logic_error);  // repeated
  EXPECT_THROW(SubsetTransport(base, {2, 4}), std::logic_error);     // not a rank of base
  SubsetTransport view(base, {2, 3});
  EXPECT_THROW(view.isend(2, nullptr, 1), std::logic_error);  // peer outside the view
}

INSTANTIATE_TEST_SUITE_P(Layouts, HierarchicalTest, ::testing::ValuesIn(layouts()),
                         [](const ::testing::TestParamInfo<Layout>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace chorus
