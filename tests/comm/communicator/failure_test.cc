// Failure paths with ranks as threads: mismatched collectives, a rank that never
// arrives (operation timeout), abort() during a wait, refused handshakes. Every case
// must end in a clear error, never a hang.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <chrono>
#include <thread>
#include <vector>

#include "chorus/chorus.h"
#include "comm/transport/tcp/handshake.h"
#include "util/ranks.h"
#include "util/checks.h"

namespace chorus {
namespace {

using namespace std::chrono_literals;
using test::run_threads;

// Runs a body per rank on its own communicator (created inside the thread) and
// returns the message of each rank's exception ("" when none).
std::vector<std::string> run_and_collect(int size, CommOptions options,
                                         const std::function<void(Communicator&)>& body) {
  auto store = std::make_shared<InMemoryStore>();
  std::vector<std::string> messages(size);
  auto errors = run_threads(size, [&](int rank) {
    auto comm = Communicator::create(store, rank, size, options);
    try {
      body(*comm);
    } catch (const Error& e) {
      messages[rank] = e.what();
    }
  }, std::chrono::seconds(120));
  test::rethrow_rank_failures(errors);
  return messages;
}

using chorus::test::contains;

// Ranks as threads share a node: they meet in shared memory unless CHORUS_TRANSPORT=tcp
// (ctest runs this suite both ways). Both transports word a mismatch of calls the same
// way, naming both calls (tests/comm/communicator/mismatch_test.cc has more).
bool over_shm(const CommOptions& o) { return o.transport != TransportKind::kTcp; }

TEST(Failure, MismatchedCountsAreAnErrorOnBothRanks) {
  CommOptions o = test::test_options();
  auto msgs = run_and_collect(2, o, [](Communicator& c) {
    std::vector<float> buf(11, 1.0f);
    size_t count = c.rank() == 0 ? 10 : 11;
    c.allreduce(buf.data(), count, DataType::kFloat32, ReduceOp::kSum).wait();
  });
  for (int r = 0; r < 2; ++r) {
    // Both ranks receive from the other (or compare descriptors), so both name both counts.
    EXPECT_TRUE(contains(msgs[r], "allreduce #0")) << msgs[r];
    EXPECT_TRUE(contains(msgs[r], "allreduce #0 with f32 × 10, sum")) << msgs[r];
    EXPECT_TRUE(contains(msgs[r], "allreduce #0 with f32 × 11, sum")) << msgs[r];
  }
}

// Gather, scatter and alltoall take the same path through shared memory whatever the
// count, so that a mismatch is found by comparing descriptors, naming both counts.
TEST(Failure, MismatchedCountsOfGatherScatterAlltoallAreNamed) {
  CommOptions o = test::test_options();
  for (const std::string op : {"gather", "scatter", "alltoall"}) {
    auto msgs = run_and_collect(2, o, [&](Communicator& c) {
      std::vector<float> a(22, 1.0f), b(22, 1.0f);
      size_t count = c.rank() == 0 ? 10 : 11;
      if (op == "gather") c.gather(a.data(), b.data(), count, DataType::kFloat32, 0).wait();
      if (op == "scatter") c.scatter(a.data(), b.data(), count, DataType::kFloat32, 0).wait();
      if (op == "alltoall") c.alltoall(a.data(), b.data(), count, DataType::kFloat32).wait();
    });
    // Over tcp, or a forced flat algorithm's streams, a rank whose sends all went out
    // may finish first.
    for (int r = 0; r < 2; ++r) {
      if (!test::direct_shm(o) && msgs[r].empty()) continue;
      EXPECT_TRUE(contains(msgs[r], op + " #0")) << msgs[r];
      EXPECT_TRUE(contains(msgs[r], op + " #0 with f32 × 10")) << msgs[r];
      EXPECT_TRUE(contains(msgs[r], op + " #0 with f32 × 11")) << msgs[r];
    }
    EXPECT_FALSE(msgs[0].empty() && msgs[1].empty()) << op;
  }
}

// allgatherv whose ranks disagree on the counts, with the same total: the ranks compare
// a digest of the counts (over shared memory before anyone reads a peer's buffer,
// which could read past the end of a shorter one).
TEST(Failure, AllgathervCountsThatDisagreeAreAnError) {
  CommOptions o = test::test_options();
  auto msgs = run_and_collect(2, o, [&](Communicator& c) {
    // Rank 0 thinks the blocks are 3 and 5 elements, rank 1 that they are 4 and 4.
    std::vector<size_t> counts = c.rank() == 0 ? std::vector<size_t>{3, 5} : std::vector<size_t>{4, 4};
    std::vector<size_t> displs = {0, counts[0]};
    std::vector<float> send(counts[c.rank()], 1.0f), recv(8, 0.0f);
    c.allgatherv(send.data(), send.size(), recv.data(), counts, displs, DataType::kFloat32).wait();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(contains(msgs[r], "allgatherv #0")) << msgs[r];
    EXPECT_TRUE(contains(msgs[r], "mismatch with rank " + std::to_string(1 - r) + " (host")) << msgs[r];
    EXPECT_TRUE(contains(msgs[r], "called allgatherv #0 with f32 × recv_counts of digest ")) << msgs[r];
  }
}

TEST(Failure, DifferentCollectivesAreAnError) {
  CommOptions o = test::test_options();
  auto msgs = run_and_collect(3, o, [](Communicator& c) {
    std::vector<int32_t> buf(4, 1);
    if (c.rank() == 1) {
      c.broadcast(buf.data(), 4, DataType::kInt32, 0).wait();
    } else {
      c.allreduce(buf.data(), 4, DataType::kInt32, ReduceOp::kSum).wait();
    }
  });
  for (int r = 0; r < 3; ++r) EXPECT_FALSE(msgs[r].empty()) << "rank " << r << " saw no error";
  EXPECT_TRUE(contains(msgs[1], " called allreduce #0 with i32 × 4, sum;")) << msgs[1];
  EXPECT_TRUE(contains(msgs[1], "this rank called broadcast #0 with i32 × 4, root 0 (")) << msgs[1];
  EXPECT_TRUE(contains(msgs[0], "rank 1 (host")) << msgs[0];
}

// The ring forwards a reduced segment from a receive slot and reuses the slot once
// that send completed; a send completes only when the right neighbour reads it, behind
// the whole first chunk. With fewer slots than segments per chunk, every rank could
// wait for its right neighbour to read while none posted a receive: a deadlock as soon
// as a chunk outgrew the socket buffers (seen with 4 ranks at 64 MiB as the first
// operation). 16 MiB chunks of 512 KiB segments, over tcp.
TEST(Failure, RingWithMoreSegmentsThanSlotsDoesNotDeadlock) {
  CommOptions o = test::test_options();
  o.transport = TransportKind::kTcp;
  o.algorithm = Algorithm::kRing;
  o.timeout = std::chrono::seconds(60);
  constexpr size_t kCount = size_t{12} << 20;  // 48 MiB of f32: 16 MiB per chunk
  auto msgs = run_and_collect(3, o, [](Communicator& c) {
    std::vector<float> buf(kCount, static_cast<float>(c.rank() + 1));
    c.allreduce(buf.data(), kCount, DataType::kFloat32, ReduceOp::kSum).wait();
    EXPECT_EQ(buf.front(), 6.0f);
    EXPECT_EQ(buf.back(), 6.0f);
  });
  for (int r = 0; r < 3; ++r) EXPECT_EQ(msgs[r], "") << "rank " << r;
}

// CHORUS_DEBUG=DETAIL (CommOptions::check_consistency): ranks compare fingerprints
// before every collective, so a mismatch fails on every rank with what each called,
// before any data moves, and the communicator stays usable.
TEST(Failure, ConsistencyCheckListsWhatEveryRankCalled) {
  CommOptions o = test::test_options();
  o.check_consistency = true;
  auto msgs = run_and_collect(3, o, [](Communicator& c) {
    std::vector<float> buf(11, 1.0f);
    std::string seen;
    try {
      if (c.rank() == 2) c.broadcast(buf.data(), 11, DataType::kFloat32, 1).wait();
      else c.allreduce(buf.data(), c.rank() == 0 ? 10 : 11, DataType::kFloat32, ReduceOp::kMax).wait();
    } catch (const InvalidArgumentError& e) {
      seen = e.what();
    }
    // Usable afterwards: a matching collective goes through.
    std::vector<float> v(5, static_cast<float>(c.rank()));
    c.allreduce(v.data(), 5, DataType::kFloat32, ReduceOp::kSum).wait();
    EXPECT_EQ(v[4], 3.0f);
    if (!seen.empty()) throw InvalidArgumentError(seen);
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(contains(msgs[r], "rank 0 called allreduce #0 with f32 × 10, max;")) << msgs[r];
    EXPECT_TRUE(contains(msgs[r], "rank 1 called allreduce #0 with f32 × 11, max;")) << msgs[r];
    EXPECT_TRUE(contains(msgs[r], "rank 2 called broadcast #0 with f32 × 11, root 1;")) << msgs[r];
  }
}

// The check compares what every rank passes alike: allgatherv and alltoallv, whose
// send counts differ between ranks by design, pass it and give exact results.
TEST(Failure, ConsistencyCheckPassesCallsWhoseSendCountsDifferByDesign) {
  CommOptions o = test::test_options();
  o.check_consistency = true;
  constexpr int kRanks = 3;
  auto msgs = run_and_collect(kRanks, o, [](Communicator& c) {
    const int me = c.rank();
    std::vector<size_t> counts{1, 4, 2}, displs{0, 1, 5};
    std::vector<int32_t> send(counts[me], me + 1), all(7, -1);
    c.allgatherv(send.data(), send.size(), all.data(), counts, displs, DataType::kInt32).wait();
    EXPECT_EQ(all, (std::vector<int32_t>{1, 2, 2, 2, 2, 3, 3})) << "rank " << me;
    // Rank r sends r + q + 1 elements of value 10r + q to rank q.
    std::vector<size_t> sc(kRanks), sd(kRanks), rc(kRanks), rd(kRanks);
    size_t st = 0, rt = 0;
    for (int q = 0; q < kRanks; ++q) {
      sc[q] = me + q + 1, sd[q] = st, st += sc[q];
      rc[q] = q + me + 1, rd[q] = rt, rt += rc[q];
    }
    std::vector<int32_t> out(st), in(rt, -1), want;
    for (int q = 0; q < kRanks; ++q) std::fill_n(out.begin() + sd[q], sc[q], 10 * me + q);
    for (int q = 0; q < kRanks; ++q) want.insert(want.end(), rc[q], 10 * q + me);
    c.alltoallv(out.data(), sc, sd, in.data(), rc, rd, DataType::kInt32).wait();
    EXPECT_EQ(in, want) << "rank " << me;
  });
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(msgs[r], "") << "rank " << r;
}

// Options whose flight recorder writes to `dir` (emptied first) after a 1.5 s timeout,
// and the trace that `rank` of communicator `comm_id` wrote there ("" when none).
CommOptions traced_options(const std::string& dir, const std::string& comm_id) {
  std::filesystem::remove_all(dir);
  CommOptions o = test::test_options();
  o.timeout = 1500ms;
  o.trace_dir = dir;
  o.comm_id = comm_id;
  return o;
}

std::string read_trace(const std::string& dir, const std::string& comm_id, int rank) {
  std::ifstream in(dir + "/chorus_trace_" + comm_id + "_rank" + std::to_string(rank) + ".json");
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The flight recorder: on the timeout every rank writes its last operations to the
// trace directory, and chorus-trace names the rank that had not called the collective
// the others were waiting in.
TEST(Failure, FlightRecorderAndChorusTraceNameTheRankBehind) {
  const std::string dir = ::testing::TempDir() + "chorus_trace_" + std::to_string(getpid());
  CommOptions o = traced_options(dir, "traced");
  auto msgs = run_and_collect(3, o, [](Communicator& c) {
    std::vector<float> buf(1000, 1.0f);
    for (int i = 0; i < 2; ++i) c.allreduce(buf.data(), 1000, DataType::kFloat32, ReduceOp::kSum).wait();
    if (c.rank() == 2) std::this_thread::sleep_for(3s);  // busy elsewhere: behind
    // Ranks 0 and 1 time out in #2. Rank 2 may still complete #2 (its peers had sent
    // their part before giving up), but #3 fails for it.
    for (int i = 2; i < 4; ++i) c.allreduce(buf.data(), 1000, DataType::kFloat32, ReduceOp::kSum).wait();
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_FALSE(msgs[r].empty()) << "rank " << r;
    std::string file = dir + "/chorus_trace_traced_rank" + std::to_string(r) + ".json";
    ASSERT_TRUE(std::filesystem::exists(file)) << file;
    std::string text = read_trace(dir, "traced", r);
    EXPECT_TRUE(contains(text, "\"seq\":1,\"kind\":\"collective\",\"op\":\"allreduce\"")) << text;
    EXPECT_TRUE(contains(text, "\"state\":\"completed\"")) << text;
    EXPECT_TRUE(contains(text, "\"state\":\"failed\"")) << text;
  }
  std::string cmd = std::string(CHORUS_BIN_DIR) + "/chorus-trace " + dir + " 2>&1";
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[512];
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    EXPECT_EQ(pclose(p), 0) << out;
  }
  EXPECT_TRUE(contains(out, "BEHIND: rank 2 (host")) << out;
  EXPECT_TRUE(contains(out, "had called only up to collective #1")) << out;
  EXPECT_FALSE(contains(out, "BEHIND: rank 0")) << out;
  // The ranks that timed out recorded which peers they were still waiting for.
  EXPECT_TRUE(contains(out, "), waiting for rank")) << out;
  std::filesystem::remove_all(dir);
}

// A recv whose sender never sends times out naming the sender (in shared memory: what it
// waited for it to do), and the flight recorder keeps the recv with its count and peer.
TEST(Failure, RecvFromASilentPeerTimesOutNamingItAndIsRecorded) {
  const std::string dir = ::testing::TempDir() + "chorus_p2p_trace_" + std::to_string(getpid());
  CommOptions o = traced_options(dir, "p2p");
  auto msgs = run_and_collect(2, o, [](Communicator& c) {
    std::vector<float> buf(10, 1.0f);
    if (c.rank() == 0) {
      std::this_thread::sleep_for(3s);  // alive but silent, past rank 1's deadline
      return;
    }
    c.recv(buf.data(), 10, DataType::kFloat32, 0).wait();
  });
  EXPECT_TRUE(contains(msgs[1], "timed out")) << msgs[1];
  EXPECT_TRUE(contains(msgs[1], "rank 0 (host")) << msgs[1];
  if (over_shm(o)) {
    EXPECT_TRUE(contains(msgs[1], "waiting in shared memory for rank 0 (host")) << msgs[1];
    EXPECT_TRUE(contains(msgs[1], ") to send")) << msgs[1];
  }
  const std::string text = read_trace(dir, "p2p", 1);
  EXPECT_TRUE(contains(text, "\"kind\":\"p2p\",\"op\":\"recv\",\"dtype\":\"f32\",\"count\":10,\"peer\":0,"
                             "\"state\":\"failed\"")) << text;
  std::filesystem::remove_all(dir);
}

TEST(Failure, AbsentRankTimesOutNamingIt) {
  CommOptions o = test::test_options();
  o.timeout = 1500ms;
  std::atomic<bool> rank0_done{false};
  auto msgs = run_and_collect(2, o, [&](Communicator& c) {
    std::vector<float> buf(1000, 1.0f);
    if (c.rank() == 0) {
      auto start = std::chrono::steady_clock::now();
      try {
        c.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum).wait();
      } catch (const TimeoutError& e) {
        auto took = std::chrono::steady_clock::now() - start;
        EXPECT_LT(took, 10s);
        EXPECT_GE(took, 1400ms);
        rank0_done = true;
        // The communicator is broken now: the next call fails at once.
        auto w = c.barrier();
        EXPECT_THROW(w.wait(), AbortedError);
        throw;
      }
    } else {
      while (!rank0_done) std::this_thread::sleep_for(10ms);
      // Late: rank 0 has given up and aborted. Its data for this allreduce may still
      // be in flight (then this one completes), but the next operation must fail
      // promptly, naming rank 0.
      auto start = std::chrono::steady_clock::now();
      try {
        c.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum).wait();
        c.barrier().wait();
      } catch (const PeerError&) {
        EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
        throw;
      }
      ADD_FAILURE() << "rank 1 never learnt that rank 0 aborted";
    }
  });
  EXPECT_TRUE(contains(msgs[0], "timed out")) << msgs[0];
  EXPECT_TRUE(contains(msgs[0], "rank 1")) << msgs[0];
  EXPECT_TRUE(contains(msgs[0], "allreduce #0")) << msgs[0];
  EXPECT_TRUE(contains(msgs[1], "rank 0")) << msgs[1];
}

TEST(Failure, AbortInterruptsAWaitingOperation) {
  CommOptions o = test::test_options();
  auto msgs = run_and_collect(2, o, [&](Communicator& c) {
    std::vector<float> buf(10, 1.0f);
    if (c.rank() == 1) {
      std::this_thread::sleep_for(300ms);
      c.abort("test abort");
      EXPECT_TRUE(c.is_aborted());
      auto w = c.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
      EXPECT_THROW(w.wait(), AbortedError);
      return;
    }
    auto start = std::chrono::steady_clock::now();
    // Rank 0 waits for rank 1, which aborts instead of joining.
    auto w = c.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
    try {
      w.wait();
    } catch (const PeerError&) {
      EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
      throw;
    }
  });
  EXPECT_TRUE(contains(msgs[0], "rank 1")) << msgs[0];
  EXPECT_TRUE(contains(msgs[0], "test abort") || contains(msgs[0], "closed")) << msgs[0];
}

TEST(Failure, AbortFromAnotherThreadWhileWaiting) {
  CommOptions o = test::test_options();
  // Set once rank 0 has aborted: rank 1 joins only then, whatever the scheduler does to
  // the aborter's sleep (a loaded machine once held it past a fixed 1 s, rank 1 joined
  // first and rank 0's allreduce completed before the abort came).
  std::atomic<bool> aborted{false};
  auto msgs = run_and_collect(2, o, [&](Communicator& c) {
    std::vector<float> buf(10, 1.0f);
    if (c.rank() == 0) {
      std::thread aborter([&] {
        std::this_thread::sleep_for(300ms);
        c.abort("stop now");
        aborted.store(true);
      });
      auto start = std::chrono::steady_clock::now();
      try {
        c.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum).wait();
      } catch (const AbortedError&) {
        EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
        aborter.join();
        throw;
      }
      aborter.join();
      return;
    }
    // Rank 1 joins only after rank 0 aborted: it must fail, not hang (the allreduce
    // may still complete with data rank 0 sent before aborting; the barrier cannot).
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while (!aborted.load()) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "rank 0 never aborted";
      std::this_thread::sleep_for(10ms);
    }
    c.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum).wait();
    c.barrier().wait();
  });
  EXPECT_TRUE(contains(msgs[0], "stop now")) << msgs[0];
  EXPECT_FALSE(msgs[1].empty());
}

TEST(Handshake, EveryFieldIsChecked) {
  using namespace transport::tcp;
  Expected e{1, 4, "world", "secret"};
  Hello ok;
  ok.from_rank = 3;
  ok.to_rank = 1;
  ok.size = 4;
  ok.comm_id = "world";
  EXPECT_FALSE(check_hello(ok, e).has_value());
  auto refused = [&](auto mutate, const char* field) {
    Hello h = ok;
    mutate(h);
    auto why = check_hello(h, e);
    ASSERT_TRUE(why.has_value()) << field;
    EXPECT_TRUE(contains(*why, field)) << *why;
  };
  refused([](Hello& h) { h.version = 99; }, "protocol version");
  refused([](Hello& h) { h.endian = 0x04030201; }, "byte order");
  refused([](Hello& h) { h.comm_id = "other"; }, "communicator id");
  refused([](Hello& h) { h.size = 5; }, "world size");
  refused([](Hello& h) { h.to_rank = 2; }, "target rank");
  refused([](Hello& h) { h.from_rank = 1; }, "peer rank");  // itself
  refused([](Hello& h) { h.from_rank = 4; }, "peer rank");
  refused([](Hello& h) { h.from_rank = -1; }, "peer rank");
  Hello lower = ok;  // lower ranks connect too: each connection carries one direction
  lower.from_rank = 0;
  EXPECT_FALSE(check_hello(lower, e).has_value());
}

}  // namespace
}  // namespace chorus
