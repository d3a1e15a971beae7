// The inline path (src/comm/communicator/issue.cc, decided in plan.cc): small allreduces on one node in
// shared memory that run on the issuing thread when the engine is idle, wait for their
// peers a bounded number of polls, and leave the rest to the queue otherwise.
// - Every way of issuing gives the rank-order fold, bit for bit: in the arrivals' lines
//   (up to 16 bytes) and in the buffers, in place or not, with ranks arriving late (so
//   that the others leave the rest to the queue), and with ranks that have the path
//   off (CHORUS_SHM_INLINE=0) beside ranks that have it on.
// - Issuing does not wait for the peers: two communicators issued in opposite orders on
//   two ranks complete, which an issue that waited for its peers would deadlock on.
// - An operation whose rest was queued runs before what was issued after it, and
//   completes when nobody waits for it.
// - A Work completed at issue carries no shared state but still names its operation and
//   number, and the flight recorder has the operation as completed.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <unistd.h>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "chorus/chorus.h"
#include "util/ranks.h"

namespace chorus {
namespace {

using namespace std::chrono_literals;

// Rank r's element i: different on every rank, and sums of several round in floating
// point, so that a fold in another order shows.
double value(size_t i, int r) { return 1.0 + static_cast<double>((i * 2654435761u + 97u * r) % 1000) / 999.0; }

// The rank-order fold of value(i, r) over `size` ranks, computed as T.
template <class T>
T fold(size_t i, int size, ReduceOp op) {
  T want = static_cast<T>(value(i, 0));
  for (int r = 1; r < size; ++r) {
    const T v = static_cast<T>(value(i, r));
    want = op == ReduceOp::kMax ? std::max(want, v) : static_cast<T>(want + v);
  }
  if (op == ReduceOp::kAvg) want = static_cast<T>(want / static_cast<T>(size));
  return want;
}

// Runs body(comm) on `size` rank threads of one node; rank r's communicator has the
// inline path on when inline_on(r).
void run_node(int size, const std::function<bool(int)>& inline_on,
              const std::function<void(Communicator&)>& body) {
  auto store = std::make_shared<InMemoryStore>();
  auto errors = test::run_threads(size, [&](int rank) {
    CommOptions o = test::test_options();
    o.shm_inline = inline_on(rank);
    auto comm = Communicator::create(store, rank, size, o);
    body(*comm);
  });
  test::rethrow_rank_failures(errors);
}

template <class T>
void check_allreduces(Communicator& c, DataType dtype, const std::vector<size_t>& counts, unsigned seed) {
  std::mt19937 rng(seed + static_cast<unsigned>(c.rank()));
  for (size_t count : counts) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kAvg}) {
      if (op == ReduceOp::kAvg && dtype == DataType::kInt32) continue;
      for (bool in_place : {false, true}) {
        // Now and then this rank arrives late, so that its peers leave the rest of
        // their call to the queue (or find it busy) and finish it when they wait.
        if (rng() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
        std::vector<T> in(count), out(count, T(-7));
        for (size_t i = 0; i < count; ++i) in[i] = static_cast<T>(value(i, c.rank()));
        T* result = in_place ? in.data() : out.data();
        c.allreduce(in.data(), result, count, dtype, op).wait();
        for (size_t i = 0; i < count; ++i) {
          const T want = fold<T>(i, c.size(), op);
          ASSERT_EQ(std::memcmp(&want, &result[i], sizeof(T)), 0)
              << "count " << count << ", op " << static_cast<int>(op) << (in_place ? ", in place" : "")
              << ", rank " << c.rank() << ", element " << i << ": " << result[i] << " != " << want;
        }
      }
    }
  }
}

// Up to 16 bytes (the arrivals' lines), a little more, and up to the inline limit and
// past it (the buffers and the queued path).
const std::vector<size_t> kCounts = {1, 2, 3, 4, 5, 7, 64, 255, 1024, 1025, 4097};

TEST(Inline, SmallAllreducesGiveTheRankOrderFoldHoweverTheRanksArrive) {
  for (int size : {2, 3, 4}) {
    SCOPED_TRACE("size " + std::to_string(size));
    run_node(size, [](int) { return true; }, [&](Communicator& c) {
      check_allreduces<float>(c, DataType::kFloat32, kCounts, 11);
      check_allreduces<double>(c, DataType::kFloat64, kCounts, 12);
      check_allreduces<int32_t>(c, DataType::kInt32, kCounts, 13);
    });
  }
}

TEST(Inline, RanksWithThePathOffAndOnRunTheSameExchange) {
  for (int size : {2, 3}) {
    SCOPED_TRACE("size " + std::to_string(size));
    run_node(size, [](int rank) { return rank % 2 == 0; }, [&](Communicator& c) {
      check_allreduces<float>(c, DataType::kFloat32, kCounts, 21);
    });
  }
}

// Rank 0 issues on A then B, rank 1 on B then A, and each waits only afterwards. An
// issue that waited for its peers would hold rank 0 in A and rank 1 in B until the
// deadline; the inline path gives up its polls and leaves each to the queue.
TEST(Inline, IssuingDoesNotWaitForThePeers) {
  run_node(2, [](int) { return true; }, [&](Communicator& a) {
    std::shared_ptr<Communicator> b = a.split(0, a.rank());
    ASSERT_NE(b, nullptr);
    for (int round = 0; round < 50; ++round) {
      float x = static_cast<float>(a.rank() + 1), y = static_cast<float>(10 * (a.rank() + 1) + round);
      Work wa, wb;
      if (a.rank() == 0) {
        wa = a.allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum);
        wb = b->allreduce(&y, &y, 1, DataType::kFloat32, ReduceOp::kSum);
      } else {
        wb = b->allreduce(&y, &y, 1, DataType::kFloat32, ReduceOp::kSum);
        wa = a.allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum);
      }
      wa.wait();
      wb.wait();
      ASSERT_EQ(x, 3.0f) << "round " << round;
      ASSERT_EQ(y, static_cast<float>(30 + 2 * round)) << "round " << round;
    }
  });
}

// Rank 1 comes late; rank 0 issues a small allreduce (whose rest goes to the queue), a
// large one and another small one before waiting for any: each gets its own result.
TEST(Inline, AQueuedRestRunsBeforeWhatWasIssuedAfterIt) {
  run_node(2, [](int) { return true; }, [&](Communicator& c) {
    for (int round = 0; round < 10; ++round) {
      if (c.rank() == 1) std::this_thread::sleep_for(2ms);
      float first = static_cast<float>(c.rank() + round), last = static_cast<float>(100 * c.rank() + round);
      std::vector<float> big(1 << 16, static_cast<float>(c.rank() + 1));
      Work w1 = c.allreduce(&first, &first, 1, DataType::kFloat32, ReduceOp::kSum);
      Work w2 = c.allreduce(big.data(), big.data(), big.size(), DataType::kFloat32, ReduceOp::kSum);
      Work w3 = c.allreduce(&last, &last, 1, DataType::kFloat32, ReduceOp::kMax);
      w3.wait();
      EXPECT_TRUE(w1.is_completed());
      EXPECT_TRUE(w2.is_completed());
      w1.wait();
      w2.wait();
      ASSERT_EQ(first, static_cast<float>(1 + 2 * round));
      ASSERT_EQ(last, static_cast<float>(100 + round));
      ASSERT_EQ(std::count(big.begin(), big.end(), 3.0f), static_cast<long>(big.size()));
    }
  });
}

// Rank 1 comes late, so rank 0 leaves the rest of its allreduce to the queue, then
// only polls is_completed(), which runs nothing: the progress thread must finish it.
// On ordinary memory and on node-shared buffers (the direct path's inline form).
TEST(Inline, ARestNobodyWaitsForIsFinishedByTheProgressThread) {
  for (bool shared : {false, true}) {
    SCOPED_TRACE(shared ? "node-shared buffer" : "ordinary buffer");
    run_node(2, [](int) { return true; }, [&](Communicator& c) {
      constexpr size_t kCount = 16384;  // 64 KiB: the direct path takes it on shared buffers
      std::shared_ptr<SharedBuffer> buf = shared ? allocate_shared(kCount * sizeof(float)) : nullptr;
      std::vector<float> heap(shared ? 0 : kCount);
      float* x = shared ? static_cast<float*>(buf->data()) : heap.data();
      for (int round = 0; round < 20; ++round) {
        if (c.rank() == 1) std::this_thread::sleep_for(1ms);
        std::fill(x, x + kCount, static_cast<float>(c.rank() + round));
        Work w = c.allreduce(x, x, kCount, DataType::kFloat32, ReduceOp::kSum);
        const auto deadline = std::chrono::steady_clock::now() + 30s;
        while (!w.is_completed() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(100us);
        ASSERT_TRUE(w.is_completed()) << "round " << round << ": not completed after 30 s without wait()";
        ASSERT_EQ(w.error(), nullptr);
        ASSERT_EQ(std::count(x, x + kCount, static_cast<float>(1 + 2 * round)), static_cast<long>(kCount))
            << "round " << round;
      }
      c.barrier().wait();  // no rank frees its buffer while a peer may still read it
    });
  }
}

// Operations completed at issue, and one that could not be (its rest queued): each
// Work names its collective and its own number, the numbers run on consecutively, and
// the flight recorder's trace (written by abort()) lists every one as completed.
TEST(Inline, WorksCompletedAtIssueAreNamedAndRecorded) {
  const std::string dir = testing::TempDir() + "chorus_inline_trace_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  auto store = std::make_shared<InMemoryStore>();
  auto errors = test::run_threads(2, [&](int rank) {
    CommOptions o = test::test_options();
    o.shm_inline = true;
    o.trace_dir = dir;
    o.comm_id = "inl";
    auto c = Communicator::create(store, rank, 2, o);
    std::vector<std::string> names;
    for (int i = 0; i < 6; ++i) {
      if (i == 3 && rank == 1) std::this_thread::sleep_for(2ms);  // rank 0's rest is queued
      float x = 1.f;
      Work w = c->allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum);
      w.wait();
      ASSERT_TRUE(w.is_completed());
      ASSERT_EQ(w.error(), nullptr);
      ASSERT_EQ(x, 2.f);
      names.push_back(w.description());
    }
    const std::string first = names.front();
    ASSERT_EQ(first.rfind("allreduce #", 0), 0u) << first;
    const long base = std::stol(first.substr(std::strlen("allreduce #")));
    for (size_t i = 0; i < names.size(); ++i) {
      EXPECT_EQ(names[i], "allreduce #" + std::to_string(base + static_cast<long>(i)));
    }
    c->barrier().wait();
    if (rank == 0) {
      c->abort("the test reads the trace");  // writes it before returning
      const std::string path = dir + "/chorus_trace_inl_rank0.json";
      std::ifstream in(path);
      const std::string text((std::istreambuf_iterator<char>(in)), {});
      for (long seq = base; seq < base + 6; ++seq) {
        const std::string entry = "\"seq\":" + std::to_string(seq) + ",";
        const size_t at = text.find(entry);
        ASSERT_NE(at, std::string::npos) << entry << " not in " << path << ":\n" << text;
        const size_t end = text.find('}', at);
        const std::string record = text.substr(at, end - at);
        EXPECT_NE(record.find("\"op\":\"allreduce\""), std::string::npos) << record;
        EXPECT_NE(record.find("\"state\":\"completed\""), std::string::npos) << record;
      }
    }
  });
  test::rethrow_rank_failures(errors);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace chorus
