// The shared-memory transport and the topology behind it, with ranks as threads:
// which ranks share a node, when the direct shared-memory algorithms are chosen, that
// segments leave nothing in /dev/shm, and sub-communicators and simulated nodes each
// with their own segment. The collective sweep itself runs over shared memory in
// collectives_test (ranks of one process share a node); the failure cases with real
// processes are in process_test.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "chorus/chorus.h"
#include "comm/transport/topology.h"
#include "comm/transport/shm/shm_group.h"
#include "comm/transport/shm_groups.h"
#include "util/ranks.h"

namespace chorus {
namespace {

using test::run_threads;

std::vector<std::string> our_segments() {
  std::vector<std::string> found;
  const std::string prefix = "chorus." + std::to_string(getpid()) + ".";
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0) found.push_back(name);
  }
  return found;
}

// Rank r's element i of the reduction tests: in [1, 2], different on every rank, and
// sums of several of them round in floating point.
float value(size_t i, int r) {
  return 1.0f + static_cast<float>((i * 2654435761u + 97u * r) % 1000) / 999.0f;
}

// Runs body(comm) on `size` rank threads, rank r with node_id node_of(r) ("" = real).
void run_ranks(int size, CommOptions options, const std::function<std::string(int)>& node_of,
               const std::function<void(Communicator&)>& body) {
  auto store = std::make_shared<InMemoryStore>();
  auto errors = run_threads(size, [&](int rank) {
    CommOptions o = options;
    o.node_id = node_of(rank);
    auto comm = Communicator::create(store, rank, size, o);
    body(*comm);
  });
  test::rethrow_rank_failures(errors);
}

TEST(Topology, FromIdsNumbersNodesByLowestRank) {
  Topology t = transport::topology_from_ids({"b", "a", "b", "c", "a"}, 4);
  EXPECT_EQ(t.nodes, 3);
  EXPECT_EQ(t.node_of, (std::vector<int>{0, 1, 0, 2, 1}));
  EXPECT_EQ(t.node_ranks, (std::vector<std::vector<int>>{{0, 2}, {1, 4}, {3}}));
  EXPECT_EQ(t.node, 1);
  EXPECT_EQ(t.local_rank, 1);
  EXPECT_EQ(t.local_size, 2);
  EXPECT_FALSE(t.uniform());
  EXPECT_TRUE(transport::topology_from_ids({"x", "y", "x", "y"}, 0).uniform());
}

TEST(Topology, RealNodeIdHasHostAndBootId) {
  std::string id = transport::local_node_id("");
  EXPECT_NE(id.find('/'), std::string::npos) << id;
  EXPECT_GT(id.size(), 30u) << id;  // hostname + '/' + 36-character boot id
  EXPECT_EQ(transport::local_node_id("sim3"), "sim3");
}

TEST(Shm, OneNodeUsesDirectSharedMemoryAndLeavesNoSegment) {
  for (int size : {2, 3, 5, 8}) {
    SCOPED_TRACE("size " + std::to_string(size));
    run_ranks(size, test::test_options(), [](int) { return ""; }, [&](Communicator& c) {
      const Topology& t = c.topology();
      EXPECT_EQ(t.nodes, 1);
      EXPECT_EQ(t.local_size, size);
      EXPECT_EQ(t.local_rank, c.rank());
      for (const char* op : {"allreduce", "broadcast", "reduce", "allgather", "reduce_scatter",
                             "barrier"}) {
        EXPECT_EQ(c.algorithm_for(op, 1 << 20), Algorithm::kShmDirect) << op;
      }
      // Every rank has mapped the segment once the communicator exists: its name is gone.
      c.barrier().wait();
      EXPECT_TRUE(our_segments().empty()) << our_segments().front();
      std::vector<double> v(100000, c.rank() + 1.0);
      c.allreduce(v.data(), v.size(), DataType::kFloat64, ReduceOp::kAvg).wait();
      EXPECT_EQ(v.front(), (size + 1) / 2.0);
      EXPECT_EQ(v.back(), (size + 1) / 2.0);
    });
  }
  EXPECT_TRUE(our_segments().empty());
}

TEST(Shm, TcpTransportTurnsItOffAndForcedAlgorithmsWin) {
  CommOptions tcp = test::test_options();
  tcp.transport = TransportKind::kTcp;
  run_ranks(3, tcp, [](int) { return ""; }, [](Communicator& c) {
    EXPECT_NE(c.algorithm_for("allreduce", 1 << 20), Algorithm::kShmDirect);
    EXPECT_EQ(c.topology().local_size, 3);  // the topology is known all the same
  });
  CommOptions ring = test::test_options();
  ring.algorithm = Algorithm::kRing;
  run_ranks(3, ring, [](int) { return ""; }, [](Communicator& c) {
    EXPECT_EQ(c.algorithm_for("allreduce", 1 << 20), Algorithm::kRing);
  });
  CommOptions shm = test::test_options();
  shm.transport = TransportKind::kShm;
  run_ranks(2, shm, [](int) { return ""; }, [](Communicator& c) {
    EXPECT_EQ(c.algorithm_for("allreduce", 8), Algorithm::kShmDirect);
  });
}

// Five ranks on two simulated nodes (3 + 2, interleaved): every node gets its own
// segment, the communicator spans both, and collectives are exact.
TEST(Shm, SimulatedNodesEachMeetInTheirOwnSegment) {
  run_ranks(5, test::test_options(), [](int r) { return "sim" + std::to_string(r % 2); },
            [](Communicator& c) {
              const Topology& t = c.topology();
              EXPECT_EQ(t.nodes, 2);
              EXPECT_EQ(t.node, c.rank() % 2);
              EXPECT_EQ(t.local_size, c.rank() % 2 == 0 ? 3 : 2);
              EXPECT_EQ(t.local_rank, c.rank() / 2);
              EXPECT_NE(c.algorithm_for("allreduce", 1 << 20), Algorithm::kShmDirect);
              std::vector<int64_t> v(70001, c.rank());
              c.allreduce(v.data(), v.size(), DataType::kInt64, ReduceOp::kSum).wait();
              EXPECT_EQ(v[0], 10);
              EXPECT_EQ(v[70000], 10);
            });
}

// A split by node gives one-node communicators, which then use shared memory; two of
// them run at once on disjoint segments.
TEST(Shm, SplitByNodeUsesSharedMemoryPerNode) {
  run_ranks(6, test::test_options(), [](int r) { return "sim" + std::to_string(r / 3); },
            [](Communicator& c) {
              auto local = c.split(c.topology().node, c.rank());
              ASSERT_TRUE(local);
              EXPECT_EQ(local->size(), 3);
              EXPECT_EQ(local->algorithm_for("allreduce", 1 << 20), Algorithm::kShmDirect);
              std::vector<float> v(300001, static_cast<float>(c.rank()));
              local->allreduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kMax).wait();
              float expect = c.rank() < 3 ? 2.0f : 5.0f;
              EXPECT_EQ(v[0], expect);
              EXPECT_EQ(v[300000], expect);
              std::vector<int32_t> all(3);
              int32_t mine = c.rank();
              local->allgather(&mine, all.data(), 1, DataType::kInt32).wait();
              EXPECT_EQ(all[0] + all[1] + all[2], c.rank() < 3 ? 3 : 12);
            });
}

// Results of 64 MiB and more are written with streaming stores: an unaligned output
// (offset by one element) and an odd count, in and out of place, on 3 ranks.
TEST(Shm, LargeAllreduceWithStreamingStoresIsExact) {
  constexpr size_t kCount = (size_t{64} << 20) / sizeof(float) + 5;
  run_ranks(3, test::test_options(), [](int) { return ""; }, [](Communicator& c) {
    ASSERT_EQ(c.algorithm_for("allreduce", kCount * sizeof(float)), Algorithm::kShmDirect);
    std::vector<float> in(kCount + 1), out(kCount + 1, -1.0f);
    for (size_t i = 0; i < kCount; ++i) in[i + 1] = static_cast<float>((i % 1000) + c.rank());
    c.allreduce(in.data() + 1, out.data() + 1, kCount, DataType::kFloat32, ReduceOp::kSum).wait();
    c.allreduce(in.data() + 1, kCount, DataType::kFloat32, ReduceOp::kSum).wait();
    size_t wrong = 0;
    for (size_t i = 0; i < kCount; ++i) {
      float expect = static_cast<float>(3 * (i % 1000) + 3);
      wrong += out[i + 1] != expect;
      wrong += in[i + 1] != expect;
    }
    EXPECT_EQ(wrong, 0u);
    EXPECT_EQ(out[0], -1.0f);  // nothing written before the output
  });
}

// The reducing ops of the two sweeps below: sum, avg, prod and max. Under
// CHORUS_SWEEP=quick (scripts/sanitize.sh, where every element check runs many times
// slower) avg and max: avg takes the adding path of every size class and the division
// after it, max the comparing path; sum and prod differ from avg only in the kernel.
std::vector<ReduceOp> sweep_ops() {
  const char* s = std::getenv("CHORUS_SWEEP");
  if (s != nullptr && std::string(s) == "quick") return {ReduceOp::kAvg, ReduceOp::kMax};
  return {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProd, ReduceOp::kMax};
}

// Allreduce chunks reduced whole by every rank (two ranks at any size, in 512 KiB
// chunks; more ranks for small chunks, up to 32 KiB when they outnumber the cores, 64
// KiB with more than two per core), shared out in 32 KiB pieces (more ranks, 256 KiB
// chunks) and, with more than two ranks per core, reduced by slices (on machines of up
// to 4 cores): every element exact against
// the ranks' values folded in rank order, on every rank, in floating point where the
// order shows. Counts on either side of 8 KiB, 32 KiB, 64 KiB (the one-pass reduction
// of many sources), 256 KiB and 512 KiB, and several chunks with a partial last one.
TEST(Shm, AllreduceGivesEveryRankTheRankOrderFold) {
  const int more = std::clamp(static_cast<int>(std::thread::hardware_concurrency()) + 1, 3, 8);
  const size_t kChunk = (512 << 10) / sizeof(float);
  const size_t counts[] = {1,          7,          2047,       2049,       8191,
                           8193,       16383,      16385,      65535,      65537,
                           kChunk - 1, kChunk + 1, 3 * kChunk + 5};
  const std::vector<ReduceOp> ops = sweep_ops();
  // More than two ranks per core, where this machine has few enough cores for it.
  const int crowded = 2 * static_cast<int>(std::thread::hardware_concurrency()) + 1;
  std::vector<int> sizes = {2, more};
  if (crowded <= 9) sizes.push_back(crowded);
  for (int size : sizes) {
    SCOPED_TRACE("size " + std::to_string(size));
    run_ranks(size, test::test_options(), [](int) { return ""; }, [&](Communicator& c) {
      for (size_t count : counts) {
        for (ReduceOp op : ops) {
          for (bool in_place : {false, true}) {
            std::vector<float> in(count), out(count, -7.0f);
            for (size_t i = 0; i < count; ++i) in[i] = value(i, c.rank());
            float* result = in_place ? in.data() : out.data();
            c.allreduce(in.data(), result, count, DataType::kFloat32, op).wait();
            size_t wrong = 0, first = count;
            for (size_t i = 0; i < count; ++i) {
              float want = value(i, 0);
              for (int r = 1; r < size; ++r) {
                const float v = value(i, r);
                want = op == ReduceOp::kProd ? want * v : op == ReduceOp::kMax ? std::max(want, v) : want + v;
              }
              if (op == ReduceOp::kAvg) want /= static_cast<float>(size);
              if (std::memcmp(&want, &result[i], sizeof want) != 0 && wrong++ == 0) first = i;
            }
            ASSERT_EQ(wrong, 0u) << "count " << count << ", op " << static_cast<int>(op)
                                 << (in_place ? ", in place" : "") << ", rank " << c.rank()
                                 << ": first wrong element " << first;
          }
        }
      }
    });
  }
}


// The ranks agree on cross-memory attach: on when every rank can read every other's
// memory, off everywhere when any rank is told not to try (CHORUS_SHM_CMA=0 on one).
// Groups of more than two use it only when every rank allows any size (=all).
TEST(ShmGroupTest, CrossMemoryAttachIsAgreedByAllRanks) {
  struct Case {
    int size;
    int refuser;        // the rank that does not try, or -1
    int narrow;         // the rank that allows groups of two only, -1: none, 9: all
    bool expected;
  };
  // Threads of one process can always read its memory, unless the kernel forbids the
  // call altogether (seccomp): then nobody may use it.
  const Case cases[] = {{3, -1, -1, true}, {3, 0, -1, false}, {3, 2, -1, false},
                        {3, -1, 1, false}, {3, -1, 9, false}, {2, -1, 9, true},
                        {2, 1, 9, false}};
  for (const Case& k : cases) {
    SCOPED_TRACE("size " + std::to_string(k.size) + ", rank not trying: " +
                 std::to_string(k.refuser) + ", narrow: " + std::to_string(k.narrow));
    InMemoryStore store;
    std::vector<int> on(k.size, -1);
    auto errors = test::run_threads(k.size, [&](int rank) {
      auto group = connect_group(store, rank, k.size, rank != k.refuser,
                                 !(k.narrow == 9 || rank == k.narrow));
      on[rank] = group->cma();
      group->close();
    });
    test::rethrow_rank_failures(errors);
    for (int r = 0; r < k.size; ++r) EXPECT_EQ(on[r], k.expected) << "rank " << r;
  }
}

// ----- shared work (ShmGroup::begin_work ... wait_work) -----

transport::OpInfo op_info(uint64_t seq, std::chrono::milliseconds timeout) {
  transport::OpInfo op;
  op.name = "allreduce";
  op.seq = seq;
  op.deadline = Deadline(timeout);
  return op;
}

// Rounds of 0 to 65 pieces, each round after a phase as the allreduce runs them: every
// piece is taken by exactly one rank, and once wait_work() returns every rank sees the
// values all pieces wrote. World sizes 1 to 8, more ranks than this machine has cores.
TEST(ShmGroupTest, SharedWorkHandsEveryPieceToOneRank) {
  const size_t pieces_of_round[] = {1, 0, 3, 65, 2, 7, 1, 64, 5, 0, 33};
  for (int size = 1; size <= 8; ++size) {
    SCOPED_TRACE("size " + std::to_string(size));
    InMemoryStore store;
    const size_t rounds = 40;
    // Round k's piece i: how many ranks took it, and the value its taker wrote. Atomics,
    // relaxed: each rank's thread maps the segment at its own address, so ThreadSanitizer
    // cannot see the order the group's counters give; what is checked is that every
    // piece is done when wait_work() returns.
    std::vector<std::vector<std::atomic<int>>> takers(rounds);
    std::vector<std::vector<std::atomic<uint64_t>>> written(rounds);
    for (size_t k = 0; k < rounds; ++k) {
      const size_t n = pieces_of_round[k % std::size(pieces_of_round)];
      takers[k] = std::vector<std::atomic<int>>(n);
      written[k] = std::vector<std::atomic<uint64_t>>(n);
    }
    std::vector<size_t> taken_by(size, 0);
    auto errors = run_threads(size, [&](int rank) {
      auto g = connect_group(store, rank, size);
      for (size_t k = 0; k < rounds; ++k) {
        g->begin(op_info(k + 1, std::chrono::seconds(20)));
        g->arrive();
        g->wait_all();
        const size_t n = written[k].size();
        g->begin_work(n);
        for (int64_t i; (i = g->take_piece()) >= 0;) {
          ASSERT_LT(static_cast<size_t>(i), n);
          takers[k][i].fetch_add(1);
          written[k][i].store((k << 32) | static_cast<uint64_t>(i), std::memory_order_relaxed);
          ++taken_by[rank];
          if (i % 3 == 0) std::this_thread::yield();  // let the others take some
          g->finish_piece();
        }
        g->wait_work();
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(written[k][i].load(std::memory_order_relaxed), (k << 32) | i)
              << "round " << k << ", piece " << i << ", rank " << rank;
        }
      }
      g->close();
    });
    test::rethrow_rank_failures(errors);
    size_t total = 0;
    for (size_t k = 0; k < rounds; ++k) {
      total += takers[k].size();
      for (size_t i = 0; i < takers[k].size(); ++i) {
        EXPECT_EQ(takers[k][i].load(), 1) << "round " << k << ", piece " << i;
      }
    }
    size_t counted = 0;
    for (size_t t : taken_by) counted += t;
    EXPECT_EQ(counted, total);
  }
}

// A round one rank does alone, as the first rank to wait does while its peers still
// compute: it takes every piece of every rank's share, each once, and the others, who
// begin the round only after its wait_work() returned, find none left and the round
// done. The lone rank changes from round to round, so each rank's share counter is
// taken by others and by itself in turn, and the next round's shares start where the
// last ones ended.
TEST(ShmGroupTest, OneRankCanDoEveryPieceOfARoundWhileThePeersAreAway) {
  for (int size : {2, 3, 5}) {
    SCOPED_TRACE("size " + std::to_string(size));
    InMemoryStore store;
    const size_t pieces_of_round[] = {1, 4, 7, 64, 2, 13};
    std::atomic<size_t> round_done{0};  // rounds the lone rank has finished
    auto errors = run_threads(size, [&](int rank) {
      auto g = connect_group(store, rank, size);
      for (size_t k = 0; k < 12; ++k) {
        const size_t n = pieces_of_round[k % std::size(pieces_of_round)];
        const int lone = static_cast<int>(k % static_cast<size_t>(size));
        g->begin(op_info(k + 1, std::chrono::seconds(20)));
        g->arrive();
        g->wait_all();
        if (rank != lone) {
          while (round_done.load() <= k) std::this_thread::yield();
        }
        g->begin_work(n);
        std::vector<int> got(n, 0);
        for (int64_t i; (i = g->take_piece()) >= 0;) {
          ASSERT_LT(static_cast<size_t>(i), n);
          ++got[static_cast<size_t>(i)];
          g->finish_piece();
        }
        g->wait_work();
        if (rank == lone) {
          for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], 1) << "round " << k << ", piece " << i;
          round_done.store(k + 1);
        } else {
          ASSERT_EQ(std::count(got.begin(), got.end(), 0), static_cast<long>(n))
              << "round " << k << ": rank " << rank << " took a piece of a finished round";
        }
      }
      g->close();
    });
    test::rethrow_rank_failures(errors);
  }
}

// A rank that holds a piece and does not finish it: the ranks waiting for the round
// time out at their deadline naming it and what it was to do; one that aborts or
// closes while holding it is a PeerError naming it. The holder is rank 1 of 3; the
// others take the remaining pieces first.
TEST(ShmGroupTest, PieceHolderThatStallsAbortsOrClosesIsNamed) {
  enum class Holder { kStalls, kAborts, kCloses };
  for (Holder holder : {Holder::kStalls, Holder::kAborts, Holder::kCloses}) {
    SCOPED_TRACE("holder " + std::to_string(static_cast<int>(holder)));
    InMemoryStore store;
    std::atomic<bool> held{false};
    std::atomic<int> past_arrival{0};
    std::vector<std::string> messages(3);
    std::vector<std::vector<int>> awaited(3);
    auto errors = run_threads(3, [&](int rank) {
      auto g = connect_group(store, rank, 3);
      g->begin(op_info(1, std::chrono::milliseconds(400)));
      g->arrive();
      g->wait_all();
      g->begin_work(3);
      ++past_arrival;
      if (rank == 1) {
        // Not before every rank has seen the arrivals: an abort then would fail their
        // wait_all(), not the wait for the piece this test is about.
        while (past_arrival.load() < 3) std::this_thread::yield();
        ASSERT_GE(g->take_piece(), 0);
        held = true;
        if (holder == Holder::kAborts) {
          g->abort("injected by the test");
          return;
        }
        if (holder == Holder::kCloses) {
          g->close();
          return;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1200));  // past the deadline
        g->finish_piece();
        g->wait_work();  // every piece is done by now
        g->close();
        return;
      }
      while (!held) std::this_thread::yield();
      for (int64_t i; (i = g->take_piece()) >= 0;) g->finish_piece();
      try {
        g->wait_work();
        messages[rank] = "<returned>";
      } catch (const TimeoutError& e) {
        messages[rank] = std::string("timeout: ") + e.what();
        awaited[rank] = e.awaited_ranks();
      } catch (const PeerError& e) {
        messages[rank] = std::string("peer: ") + e.what();
      }
      g->close();
    });
    test::rethrow_rank_failures(errors);
    for (int rank : {0, 2}) {
      const std::string& m = messages[rank];
      const std::string me = "rank " + std::to_string(rank) + " (host h" + std::to_string(rank) + ")";
      EXPECT_NE(m.find("allreduce #1"), std::string::npos) << m;
      EXPECT_NE(m.find(me), std::string::npos) << m;
      EXPECT_NE(m.find("rank 1 (host h1)"), std::string::npos) << m;
      switch (holder) {
        case Holder::kStalls:
          EXPECT_EQ(m.rfind("timeout: ", 0), 0u) << m;
          EXPECT_NE(m.find("to finish its piece of the shared reduction"), std::string::npos) << m;
          EXPECT_EQ(awaited[rank], std::vector<int>{1});
          break;
        case Holder::kAborts:
          EXPECT_EQ(m.rfind("peer: ", 0), 0u) << m;
          EXPECT_NE(m.find("aborted: injected by the test"), std::string::npos) << m;
          break;
        case Holder::kCloses:
          EXPECT_EQ(m.rfind("peer: ", 0), 0u) << m;
          EXPECT_NE(m.find("closed the communicator while it held a piece"), std::string::npos) << m;
          break;
      }
    }
  }
}

// Reduce-scatter and reduce through cross-memory attach and through the segment: every
// size where the former is used (and its edges), in place and not, every reducing op:
// the same bytes, since both add the ranks in rank order, and the closed form where it
// is exact. The allreduces (which never use cross-memory attach) give every rank the
// same bytes.
TEST(Shm, CrossMemoryAttachGivesTheSegmentPathsBytes) {
  // 8191 and 8193: reduce-scatters of count / 3 per rank whose inputs (32760 and 32772
  // bytes) lie on either side of 32 KiB. 2047, 2048, 262143 and 262144: reduces on
  // either side of 8 KiB and of 1 MiB.
  const std::vector<size_t> counts = {2047,  2048,   8191,   8193,         (256 << 10) / 4 - 1,
                                      (256 << 10) / 4, 70001, 262143, 262144, (1 << 20) + 3};
  const std::vector<ReduceOp> ops = sweep_ops();
  std::map<std::string, std::vector<float>> results[2];
  for (int cma : {1, 0}) {
    setenv("CHORUS_SHM_CMA", cma ? "all" : "0", 1);  // 3 ranks: only `all` turns it on
    run_ranks(3, test::test_options(), [](int) { return ""; }, [&](Communicator& c) {
      for (size_t count : counts) {
        for (ReduceOp op : ops) {
          for (bool in_place : {false, true}) {
            std::vector<float> in(count), out(count, -7.0f);
            for (size_t i = 0; i < count; ++i) in[i] = value(i, c.rank());
            if (in_place) {
              c.allreduce(in.data(), count, DataType::kFloat32, op).wait();
              out = in;
            } else {
              c.allreduce(in.data(), out.data(), count, DataType::kFloat32, op).wait();
            }
            if (op == ReduceOp::kMax) {
              for (size_t i = 0; i < count; i += 4099) {
                float want = 0;
                for (int r = 0; r < 3; ++r) want = std::max(want, value(i, r));
                ASSERT_EQ(out[i], want) << "element " << i;
              }
            }
            std::string key = std::to_string(count) + "/" + std::to_string(static_cast<int>(op)) +
                              "/" + std::to_string(in_place) + "/" + std::to_string(c.rank());
            // Reduce-scatter of the same input, count / 3 elements per rank (in place:
            // this rank's block of the input is the output).
            const size_t block = count / 3;
            for (size_t i = 0; i < count; ++i) in[i] = value(i, c.rank());
            std::vector<float> rs(in_place ? 0 : block, -7.0f);
            float* rs_out = in_place ? in.data() + c.rank() * block : rs.data();
            c.reduce_scatter(in.data(), rs_out, block, DataType::kFloat32, op).wait();
            std::vector<float> rs_result(rs_out, rs_out + block);
            // Reduce of the same input to a root that changes with the count.
            const int root = static_cast<int>(count % 3);
            for (size_t i = 0; i < count; ++i) in[i] = value(i, c.rank());
            std::vector<float> red(in_place ? 0 : count, -7.0f);
            float* red_out = in_place ? in.data() : red.data();
            c.reduce(in.data(), red_out, count, DataType::kFloat32, op, root).wait();
            std::vector<float> red_result;
            if (c.rank() == root) red_result.assign(red_out, red_out + count);
            static std::mutex m;
            std::lock_guard<std::mutex> lock(m);
            results[cma][key] = std::move(out);
            results[cma]["rs/" + key] = std::move(rs_result);
            results[cma]["red/" + key] = std::move(red_result);
          }
        }
      }
    });
  }
  unsetenv("CHORUS_SHM_CMA");
  ASSERT_EQ(results[0].size(), results[1].size());
  for (const auto& [key, seg] : results[0]) {
    const std::vector<float>& via_cma = results[1].at(key);
    ASSERT_EQ(via_cma.size(), seg.size()) << key;
    if (seg.empty()) continue;  // a reduce's result on a rank other than the root
    EXPECT_EQ(std::memcmp(via_cma.data(), seg.data(), seg.size() * sizeof(float)), 0) << key;
    // Each rank holds a different block; only the root holds a reduce's result.
    if (key.rfind("rs/", 0) == 0 || key.rfind("red/", 0) == 0) continue;
    std::string rank0 = key.substr(0, key.rfind('/')) + "/0";
    EXPECT_EQ(std::memcmp(via_cma.data(), results[1].at(rank0).data(), seg.size() * sizeof(float)), 0)
        << key << " differs from rank 0";
  }
}

// Broadcast and allgather through cross-memory attach (3 ranks, CHORUS_SHM_CMA=all)
// and through the segment: sizes at and around where the former takes over, every
// root, in place and not. Both only move bytes, so each is checked against the data
// itself; out of place, the root's send buffer and every rank's input must be intact.
TEST(Shm, CrossMemoryAttachBroadcastsAndAllgathersExactly) {
  // Element i of rank r's data.
  auto value = [](size_t i, int r) { return static_cast<int32_t>(i * 2654435761u + 7919u * r); };
  // The allgathers get count / 3 elements per rank: 8191 and 8193 put their results
  // (32760 and 32772 bytes) on either side of 32 KiB.
  const std::vector<size_t> counts = {1,      (32 << 10) / 4 - 1, (32 << 10) / 4 + 1,
                                      (64 << 10) / 4 - 1, (64 << 10) / 4, 70001, (1 << 20) + 3};
  for (const char* cma : {"all", "0"}) {
    SCOPED_TRACE(std::string("CHORUS_SHM_CMA=") + cma);
    setenv("CHORUS_SHM_CMA", cma, 1);
    run_ranks(3, test::test_options(), [](int) { return ""; }, [&](Communicator& c) {
      const int me = c.rank(), p = c.size();
      for (size_t count : counts) {
        for (bool in_place : {false, true}) {
          for (int root = 0; root < p; ++root) {
            std::vector<int32_t> send(count, -1), recv(in_place ? 0 : count, -5);
            if (me == root) {
              for (size_t i = 0; i < count; ++i) send[i] = value(i, root);
            }
            int32_t* out = in_place ? send.data() : recv.data();
            c.broadcast(send.data(), out, count, DataType::kInt32, root).wait();
            for (size_t i = 0; i < count; ++i) {
              ASSERT_EQ(out[i], value(i, root)) << "broadcast of " << count << " from " << root
                                                << ", element " << i << " on rank " << me;
            }
            if (me == root && !in_place) {
              for (size_t i = 0; i < count; ++i) ASSERT_EQ(send[i], value(i, root)) << "root's send";
            }
          }
          // Allgather: `count` elements in all, split as evenly as the collective allows.
          const size_t block = std::max<size_t>(1, count / p);
          std::vector<int32_t> all(block * p, -5), own(in_place ? 0 : block);
          int32_t* mine = in_place ? all.data() + me * block : own.data();
          for (size_t i = 0; i < block; ++i) mine[i] = value(i, me);
          c.allgather(mine, all.data(), block, DataType::kInt32).wait();
          for (int r = 0; r < p; ++r) {
            for (size_t i = 0; i < block; ++i) {
              ASSERT_EQ(all[r * block + i], value(i, r))
                  << "allgather of " << block << " per rank, block " << r << ", element " << i
                  << " on rank " << me;
            }
          }
          if (!in_place) {
            for (size_t i = 0; i < block; ++i) ASSERT_EQ(own[i], value(i, me)) << "send buffer";
          }
        }
      }
    });
  }
  unsetenv("CHORUS_SHM_CMA");
}

// The measured thresholds (algorithms/tuning.h) come from the communicator's cost
// model, and the direct algorithms stay exact at the table's extremes: chunks of 64
// bytes, no chunk reduced whole (two ranks: every chunk in slices, some of them empty;
// allreduce also in place), one-byte pieces (one element) of the shared reduction,
// streaming stores at every size, and cross-memory attach from the first byte, for 2
// and 3 ranks (3 only with CHORUS_SHM_CMA=all), sums of int64 checked exactly.
TEST(Shm, TheAlgorithmsStayExactAtTheTuningTablesExtremes) {
  CommOptions options = test::test_options();
  options.shm_cma = CommOptions::CrossMemoryAttach::kAnyNode;
  options.cost_model =
      "pair_chunk_bytes=64,pair_whole_bytes=0,shared_chunk_bytes=64,whole_bytes=0,"
      "whole_oversubscribed_bytes=0,whole_crowded_bytes=0,stream_bytes=0,shared_piece_bytes=1,many_max_bytes=0,"
      "cma_broadcast_min_bytes=0,cma_allgather_min_bytes=0,cma_reduce_scatter_min_bytes=0,"
      "cma_reduce_min_bytes=0,cma_reduce_max_bytes=1000000000,cma_piece_bytes=24";
  auto value = [](size_t i, int r) { return static_cast<int64_t>(i * 2654435761u) + 7919 * r; };
  for (int size : {2, 3}) {
    SCOPED_TRACE("ranks: " + std::to_string(size));
    run_ranks(size, options, [](int) { return ""; }, [&](Communicator& c) {
      const int me = c.rank(), p = c.size();
      ASSERT_EQ(c.algorithm_for("allreduce", 8), Algorithm::kShmDirect);
      for (size_t n : {size_t{1}, size_t{7}, size_t{1000}, size_t{5001}}) {
        std::vector<int64_t> in(n * p), out(n * p, -1);
        for (size_t i = 0; i < n * p; ++i) in[i] = value(i, me);
        auto sum = [&](size_t i) {
          int64_t s = 0;
          for (int r = 0; r < p; ++r) s += value(i, r);
          return s;
        };
        c.allreduce(in.data(), out.data(), n, DataType::kInt64, ReduceOp::kSum).wait();
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], sum(i)) << "allreduce of " << n << ", " << i;
        std::copy(in.begin(), in.end(), out.begin());
        c.allreduce(out.data(), out.data(), n, DataType::kInt64, ReduceOp::kSum).wait();
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(out[i], sum(i)) << "allreduce in place of " << n << ", " << i;
        }
        const int root = static_cast<int>(n % p);
        std::fill(out.begin(), out.end(), -1);
        c.reduce(in.data(), out.data(), n, DataType::kInt64, ReduceOp::kSum, root).wait();
        for (size_t i = 0; me == root && i < n; ++i) {
          ASSERT_EQ(out[i], sum(i)) << "reduce of " << n << ", " << i;
        }
        std::fill(out.begin(), out.end(), -1);
        c.reduce_scatter(in.data(), out.data(), n, DataType::kInt64, ReduceOp::kSum).wait();
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(out[i], sum(me * n + i)) << "reduce_scatter of " << n << ", " << i;
        }
        std::fill(out.begin(), out.end(), -1);
        c.broadcast(in.data(), out.data(), n, DataType::kInt64, root).wait();
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(out[i], value(i, root)) << "broadcast of " << n << ", " << i;
        }
        std::fill(out.begin(), out.end(), -1);
        c.allgather(in.data(), out.data(), n, DataType::kInt64).wait();
        for (int r = 0; r < p; ++r) {
          for (size_t i = 0; i < n; ++i) {
            ASSERT_EQ(out[r * n + i], value(i, r)) << "allgather of " << n << ", " << r << ", " << i;
          }
        }
      }
    });
  }
}

// Twelve ranks on one node have fewer stream slots each (8) than peers (11): the flat
// algorithms (forced ring: ring allreduce and allgather, chain broadcast) and gather,
// scatter and alltoall (their tcp algorithms through the streams: no cross-memory
// attach beyond two ranks) bind slots as they go, messages larger than a slot's ring
// included, and every block arrives exactly.
TEST(Shm, TwelveRanksShareTheirStreamSlotsExactly) {
  auto value = [](size_t i, int from, int to) {
    return static_cast<int32_t>(i * 2654435761u + 7919u * from + 104729u * to);
  };
  for (bool ring : {false, true}) {
    SCOPED_TRACE(ring ? "ring forced" : "auto");
    CommOptions options = test::test_options();
    if (ring) options.algorithm = Algorithm::kRing;
    run_ranks(12, options, [](int) { return ""; }, [&](Communicator& c) {
      const int me = c.rank(), p = c.size();
      for (size_t n : {size_t{1}, size_t{3000}, size_t{20000}}) {
        std::vector<int32_t> send(n * p), recv(n * p, -5);
        for (int to = 0; to < p; ++to) {
          for (size_t i = 0; i < n; ++i) send[to * n + i] = value(i, me, to);
        }
        c.alltoall(send.data(), recv.data(), n, DataType::kInt32).wait();
        for (int from = 0; from < p; ++from) {
          for (size_t i = 0; i < n; ++i) {
            ASSERT_EQ(recv[from * n + i], value(i, from, me)) << "alltoall of " << n << ", from " << from;
          }
        }
        const int root = static_cast<int>(n % p);
        std::fill(recv.begin(), recv.end(), -5);
        c.gather(send.data(), recv.data(), n, DataType::kInt32, root).wait();
        for (int from = 0; me == root && from < p; ++from) {
          for (size_t i = 0; i < n; ++i) {
            ASSERT_EQ(recv[from * n + i], value(i, from, 0)) << "gather of " << n << ", from " << from;
          }
        }
        std::fill(recv.begin(), recv.end(), -5);
        c.scatter(send.data(), recv.data(), n, DataType::kInt32, root).wait();
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(recv[i], value(i, root, me)) << "scatter of " << n;
        std::fill(recv.begin(), recv.end(), -5);
        c.allgather(send.data(), recv.data(), n, DataType::kInt32).wait();
        for (int from = 0; from < p; ++from) {
          for (size_t i = 0; i < n; ++i) {
            ASSERT_EQ(recv[from * n + i], value(i, from, 0)) << "allgather of " << n << ", from " << from;
          }
        }
        c.broadcast(send.data(), recv.data(), n, DataType::kInt32, root).wait();
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(recv[i], value(i, root, 0)) << "broadcast of " << n;
        for (size_t i = 0; i < n; ++i) send[i] = value(i, me, 0) & 0xffff;  // sums that fit
        c.allreduce(send.data(), recv.data(), n, DataType::kInt32, ReduceOp::kSum).wait();
        for (size_t i = 0; i < n; ++i) {
          int32_t sum = 0;
          for (int r = 0; r < p; ++r) sum += value(i, r, 0) & 0xffff;
          ASSERT_EQ(recv[i], sum) << "allreduce of " << n << ", element " << i;
        }
      }
    });
  }
}

// Gather, scatter, alltoall, alltoallv and allgatherv read each other's buffers where
// cross-memory attach is on (here for 3 ranks through CHORUS_SHM_CMA=all; with 2 the
// collective sweep covers them) and run their tcp algorithms where it is off: both give every block exactly,
// at every root, in place and not, leaving inputs intact.
TEST(Shm, GatherScatterAlltoallsAllgathervThroughCrossMemoryAttach) {
  // Element i of the block that rank `from` sends to rank `to`.
  auto value = [](size_t i, int from, int to) {
    return static_cast<int32_t>(i * 2654435761u + 7919u * from + 104729u * to);
  };
  for (const char* cma : {"all", "0"}) {
    SCOPED_TRACE(std::string("CHORUS_SHM_CMA=") + cma);
    setenv("CHORUS_SHM_CMA", cma, 1);
    run_ranks(3, test::test_options(), [](int) { return ""; }, [&](Communicator& c) {
      const int me = c.rank(), p = c.size();
      EXPECT_EQ(std::string(algorithm_name(c.algorithm_for("alltoall", 4096))),
                std::string(cma) == "all" ? "shm" : "auto");
      for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, size_t{70001}}) {
        for (bool in_place : {false, true}) {
          for (int root = 0; root < p; ++root) {
            // gather: rank r's block (value(i, r, root)) lands at block r of the root's recv.
            std::vector<int32_t> all(n * p, -5), own(in_place && me == root ? 0 : n);
            int32_t* send = in_place && me == root ? all.data() + me * n : own.data();
            for (size_t i = 0; i < n; ++i) send[i] = value(i, me, root);
            c.gather(send, all.data(), n, DataType::kInt32, root).wait();
            if (me == root) {
              for (int r = 0; r < p; ++r) {
                for (size_t i = 0; i < n; ++i) {
                  ASSERT_EQ(all[r * n + i], value(i, r, root))
                      << "gather of " << n << " to " << root << ", block " << r << ", element " << i;
                }
              }
            }
            if (!(in_place && me == root)) {
              for (size_t i = 0; i < n; ++i) ASSERT_EQ(send[i], value(i, me, root)) << "gather input";
            }
            // scatter: block r of the root's send goes to rank r.
            std::vector<int32_t> blocks(me == root ? n * p : 0), recv(in_place && me == root ? 0 : n, -5);
            for (int r = 0; me == root && r < p; ++r) {
              for (size_t i = 0; i < n; ++i) blocks[r * n + i] = value(i, root, r);
            }
            int32_t* out = in_place && me == root ? blocks.data() + me * n : recv.data();
            c.scatter(blocks.data(), out, n, DataType::kInt32, root).wait();
            for (size_t i = 0; i < n; ++i) {
              ASSERT_EQ(out[i], value(i, root, me))
                  << "scatter of " << n << " from " << root << ", element " << i << " on rank " << me;
            }
            for (int r = 0; me == root && r < p; ++r) {
              for (size_t i = 0; i < n; ++i) ASSERT_EQ(blocks[r * n + i], value(i, root, r)) << "scatter input";
            }
          }
          // alltoall: block r of rank me's send goes to block me of rank r's recv.
          std::vector<int32_t> sendbuf(n * p), recvbuf(in_place ? 0 : n * p, -5);
          for (int r = 0; r < p; ++r) {
            for (size_t i = 0; i < n; ++i) sendbuf[r * n + i] = value(i, me, r);
          }
          int32_t* out = in_place ? sendbuf.data() : recvbuf.data();
          c.alltoall(sendbuf.data(), out, n, DataType::kInt32).wait();
          for (int r = 0; r < p; ++r) {
            for (size_t i = 0; i < n; ++i) {
              ASSERT_EQ(out[r * n + i], value(i, r, me))
                  << "alltoall of " << n << ", block from " << r << ", element " << i << " on rank " << me;
            }
          }
          for (int r = 0; !in_place && r < p; ++r) {
            for (size_t i = 0; i < n; ++i) ASSERT_EQ(sendbuf[r * n + i], value(i, me, r)) << "alltoall input";
          }
          // alltoallv: rank `from` sends count(from, to) elements (some none) to rank
          // `to`. Sends lie in reverse rank order with a gap of 2 after each block,
          // receives in rank order with a gap of 3 (left alone but in place, where the
          // send blocks may lie in the gaps). In place, both layouts share one buffer.
          auto count = [&](int from, int to) -> size_t {
            return (n * static_cast<size_t>(from + 1) + static_cast<size_t>(to)) % (n + 2);
          };
          std::vector<size_t> sc(p), sd(p), rc(p), rd(p);
          size_t s_at = 0, r_at = 0;
          for (int r = p - 1; r >= 0; --r) {
            sc[r] = count(me, r);
            sd[r] = s_at;
            s_at += sc[r] + 2;
          }
          for (int r = 0; r < p; ++r) {
            rc[r] = count(r, me);
            rd[r] = r_at;
            r_at += rc[r] + 3;
          }
          std::vector<int32_t> vsendbuf(in_place ? std::max(s_at, r_at) : s_at, -5);
          std::vector<int32_t> vrecvbuf(in_place ? 0 : r_at, -5);
          for (int r = 0; r < p; ++r) {
            for (size_t i = 0; i < sc[r]; ++i) vsendbuf[sd[r] + i] = value(i, me, r);
          }
          const std::vector<int32_t> vsent = vsendbuf;
          int32_t* vout = in_place ? vsendbuf.data() : vrecvbuf.data();
          EXPECT_EQ(std::string(algorithm_name(c.algorithm_for("alltoallv", 0))),
                    std::string(cma) == "all" ? "shm" : "auto");
          c.alltoallv(vsendbuf.data(), sc, sd, vout, rc, rd, DataType::kInt32).wait();
          for (int r = 0; r < p; ++r) {
            for (size_t i = 0; i < rc[r]; ++i) {
              ASSERT_EQ(vout[rd[r] + i], value(i, r, me))
                  << "alltoallv with n " << n << ", block from " << r << ", element " << i << " on rank " << me;
            }
            for (size_t i = 0; !in_place && i < 3; ++i) ASSERT_EQ(vout[rd[r] + rc[r] + i], -5) << "gap after " << r;
          }
          if (!in_place) {
            ASSERT_EQ(vsendbuf, vsent) << "alltoallv input";
          }
          // allgatherv: rank r sends n * r + r % 2 elements (rank 0 none when n = 0),
          // placed in reverse rank order with a gap of 3 after each block.
          std::vector<size_t> vcounts(p), vdispls(p);
          size_t at = 0;
          for (int r = p - 1; r >= 0; --r) {
            vcounts[r] = n * r + r % 2;
            vdispls[r] = at;
            at += vcounts[r] + 3;
          }
          std::vector<int32_t> vall(at, -5), vown(in_place ? 0 : vcounts[me]);
          int32_t* vsend = in_place ? vall.data() + vdispls[me] : vown.data();
          for (size_t i = 0; i < vcounts[me]; ++i) vsend[i] = value(i, me, -1);
          c.allgatherv(vsend, vcounts[me], vall.data(), vcounts, vdispls, DataType::kInt32).wait();
          for (int r = 0; r < p; ++r) {
            for (size_t i = 0; i < vcounts[r]; ++i) {
              ASSERT_EQ(vall[vdispls[r] + i], value(i, r, -1))
                  << "allgatherv with n " << n << ", block of " << r << ", element " << i << " on rank " << me;
            }
            for (size_t i = 0; i < 3; ++i) ASSERT_EQ(vall[vdispls[r] + vcounts[r] + i], -5) << "gap after " << r;
          }
        }
      }
    });
  }
  unsetenv("CHORUS_SHM_CMA");
}

// Point to point between ranks of one node goes through their channels in the segment:
// messages that fit the ring need no receiver yet (every rank sends to every other
// first, then receives), longer ones stream through it while the receiver drains it,
// and every message arrives whole and in order. On 2 simulated nodes the pairs of a node
// use their channel and the others tcp, in the same exchange.
TEST(Shm, PointToPointThroughChannels) {
  auto value = [](size_t i, int from, int to, int k) {
    return static_cast<int32_t>(i * 2654435761u + 7919u * from + 104729u * to + 15485863u * k);
  };
  // Message k from `from` to `to`: some empty, at most 12 KiB (all fit any ring).
  auto length = [](int from, int to, int k) -> size_t {
    return static_cast<size_t>((from * 7 + to * 3 + k * 1001) % 3001) * (k % 4 == 3 ? 0 : 1);
  };
  for (const char* nodes : {"one", "two"}) {
    SCOPED_TRACE(std::string(nodes) + " node(s)");
    const bool two = std::string(nodes) == "two";
    run_ranks(4, test::test_options(), [&](int r) { return two ? "p" + std::to_string(r / 2) : ""; },
              [&](Communicator& c) {
      const int me = c.rank(), p = c.size();
      EXPECT_EQ(c.algorithm_for("send", 0), two ? Algorithm::kAuto : Algorithm::kShmDirect);
      std::vector<Work> works;
      std::vector<std::vector<int32_t>> out;
      for (int q = 0; q < p; ++q) {
        for (int k = 0; k < 8 && q != me; ++k) {
          out.emplace_back(length(me, q, k));
          for (size_t i = 0; i < out.back().size(); ++i) out.back()[i] = value(i, me, q, k);
          works.push_back(c.send(out.back().data(), out.back().size(), DataType::kInt32, q));
        }
      }
      for (Work& w : works) w.wait();
      for (int q = 0; q < p; ++q) {
        for (int k = 0; k < 8 && q != me; ++k) {
          std::vector<int32_t> in(length(q, me, k), -1);
          c.recv(in.data(), in.size(), DataType::kInt32, q).wait();
          for (size_t i = 0; i < in.size(); ++i) {
            ASSERT_EQ(in[i], value(i, q, me, k)) << "message " << k << " from " << q << ", element " << i;
          }
        }
      }
      // Longer than any ring (4 MiB + 12 bytes), around a ring of the ranks: even ranks
      // send first, odd ranks receive first.
      const size_t n = (size_t{1} << 20) + 3;
      std::vector<int32_t> big(n), got(n, -1);
      for (size_t i = 0; i < n; ++i) big[i] = value(i, me, -1, 0);
      const int next = (me + 1) % p, prev = (me + p - 1) % p;
      if (me % 2 == 0) {
        c.send(big.data(), n, DataType::kInt32, next).wait();
        c.recv(got.data(), n, DataType::kInt32, prev).wait();
      } else {
        c.recv(got.data(), n, DataType::kInt32, prev).wait();
        c.send(big.data(), n, DataType::kInt32, next).wait();
      }
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], value(i, prev, -1, 0)) << "element " << i;
    });
  }
}

// What a rank sent stays in its channel after it left: the receiver still gets it all.
// Waiting for more from a rank that left is an error naming it; so is a message of
// another count than the recv expects, on the receiver (with both calls), and then on
// the sender, whose next operation finds the receiver aborted.
TEST(Shm, PointToPointAfterTheSenderLeftAndOfTheWrongLength) {
  std::string receiver_error;
  std::vector<float> sent(30000);
  for (size_t i = 0; i < sent.size(); ++i) sent[i] = static_cast<float>(i) * 0.5f;
  run_ranks(2, test::test_options(), [](int) { return ""; }, [&](Communicator& c) {
    if (c.rank() == 0) {
      c.send(sent.data(), 10, DataType::kFloat32, 1).wait();
      c.send(sent.data(), sent.size(), DataType::kFloat32, 1).wait();
      return;  // leaves: its communicator closes
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::vector<float> a(10), b(sent.size());
    c.recv(a.data(), a.size(), DataType::kFloat32, 0).wait();
    c.recv(b.data(), b.size(), DataType::kFloat32, 0).wait();
    EXPECT_EQ(0, std::memcmp(a.data(), sent.data(), a.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(b.data(), sent.data(), b.size() * sizeof(float)));
    try {
      c.recv(a.data(), a.size(), DataType::kFloat32, 0).wait();
      ADD_FAILURE() << "a recv from a rank that left succeeded";
    } catch (const PeerError& e) {
      receiver_error = e.what();
    }
  });
  EXPECT_NE(receiver_error.find("rank 0 (host"), std::string::npos) << receiver_error;
  EXPECT_NE(receiver_error.find("closed the communicator while this rank waited for it to send"),
            std::string::npos) << receiver_error;

  std::string errors[2];
  run_ranks(2, test::test_options(), [](int) { return ""; }, [&](Communicator& c) {
    std::vector<float> buf(100);
    try {
      if (c.rank() == 0) {
        c.send(buf.data(), 100, DataType::kFloat32, 1).wait();  // in the ring: done
        c.barrier().wait();
      } else {
        c.recv(buf.data(), 99, DataType::kFloat32, 0).wait();
      }
      ADD_FAILURE() << "rank " << c.rank() << " did not fail";
    } catch (const PeerError& e) {
      errors[c.rank()] = e.what();
    }
  });
  EXPECT_EQ(errors[1].rfind("recv #0 failed on rank 1 (host", 0), 0u) << errors[1];
  EXPECT_NE(errors[1].find("mismatch with rank 0 (host"), std::string::npos) << errors[1];
  EXPECT_NE(errors[1].find("rank 0 called send with f32 × 100; this rank called recv with f32 × 99 ("),
            std::string::npos) << errors[1];
  EXPECT_NE(errors[0].find("rank 1 (host"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("aborted"), std::string::npos) << errors[0];
}

}  // namespace
}  // namespace chorus
