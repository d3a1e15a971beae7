// A communicator's life from the store's and the peers' side (issue 21): destroying one
// with operations pending returns at once and tells the peers, and the keys its creation
// wrote leave the store once the group is connected, so that splitting every step does
// not grow the store.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "chorus/chorus.h"
#include "util/ranks.h"
#include "util/checks.h"

namespace chorus {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

using chorus::test::contains;

// Something the rank threads wait for, with a deadline.
class Flag {
 public:
  void raise() {
    std::lock_guard<std::mutex> lock(mutex_);
    raised_ = true;
    cv_.notify_all();
  }
  bool wait_for(std::chrono::seconds limit) {
    std::unique_lock<std::mutex> lock(mutex_);
    return cv_.wait_for(lock, limit, [&] { return raised_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool raised_ = false;
};

// The error text of waiting on `work` ("" when it succeeded).
std::string failure_of(Work& work) {
  try {
    work.wait();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Rank 0 issues an allreduce that ranks 1 and 2 do not join, then drops its
// communicator. The operation timeout is 10 minutes: a destructor that waited for the
// operation (it did, up to CHORUS_TIMEOUT) would outlast the 30 s this test gives it;
// then ranks 1 and 2 join the allreduce, so that the old behaviour fails the test
// instead of hanging it. The contract (communicator.h): the pending operation fails
// with AbortedError saying the communicator was destroyed, and the peers' operations
// that need rank 0 fail naming it and the cause.
TEST(Lifecycle, DestroyingWithWorkPendingAbortsItAndTellsThePeers) {
  constexpr int kSize = 3;
  CommOptions options = test::test_options();
  options.timeout = std::chrono::minutes(10);
  auto store = std::make_shared<InMemoryStore>();
  Flag created_all, destroyed;
  std::atomic<int> created{0};
  std::atomic<bool> returned_in_time{false};
  std::string pending_error, peer_errors[kSize];
  auto errors = test::run_threads(kSize, [&](int rank) {
    auto comm = Communicator::create(store, rank, kSize, options);
    if (++created == kSize) created_all.raise();
    ASSERT_TRUE(created_all.wait_for(60s));
    std::vector<float> data(1000, 1.0f + rank);
    if (rank == 0) {
      Work work = comm->allreduce(data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum);
      std::this_thread::sleep_for(50ms);  // running and waiting for the peers, not queued
      auto start = Clock::now();
      std::promise<void> done;
      std::future<void> finished = done.get_future();
      std::thread destroyer([&comm, &done] {
        comm.reset();
        done.set_value();
      });
      returned_in_time = finished.wait_for(30s) == std::future_status::ready;
      double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      std::printf("rank 0: the destructor returned after %.3f s\n", seconds);
      destroyed.raise();
      destroyer.join();
      pending_error = failure_of(work);
      return;
    }
    ASSERT_TRUE(destroyed.wait_for(120s));
    // Rank 0 sent its part before it was destroyed, so this allreduce may still
    // complete, with the right sum; if not, it fails naming the cause. The next
    // operation needs rank 0 and fails.
    Work work = comm->allreduce(data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum);
    peer_errors[rank] = failure_of(work);
    if (peer_errors[rank].empty()) {
      EXPECT_EQ(data[0], 6.0f) << "rank " << rank;
      work = comm->allreduce(data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum);
      peer_errors[rank] = failure_of(work);
    }
    std::printf("rank %d: %s\n", rank, peer_errors[rank].c_str());
  }, 300s);
  test::rethrow_rank_failures(errors);
  EXPECT_TRUE(returned_in_time) << "the destructor waited for the pending allreduce";
  EXPECT_TRUE(contains(pending_error, "allreduce #0")) << pending_error;
  EXPECT_TRUE(contains(pending_error, "destroyed")) << pending_error;
  for (int r = 1; r < kSize; ++r) {
    EXPECT_TRUE(contains(peer_errors[r], "rank 0")) << r << ": " << peer_errors[r];
    EXPECT_TRUE(contains(peer_errors[r], "destroyed")) << r << ": " << peer_errors[r];
  }
}

// Destroying with nothing pending is the clean goodbye it always was: the peers'
// operations that need the rank fail naming it as gone, and no operation of the
// destroyed rank is reported as aborted.
TEST(Lifecycle, DestroyingWhenIdleIsAGoodbye) {
  constexpr int kSize = 2;
  auto store = std::make_shared<InMemoryStore>();
  Flag destroyed;
  std::string peer_error;
  auto errors = test::run_threads(kSize, [&](int rank) {
    auto comm = Communicator::create(store, rank, kSize, test::test_options());
    std::vector<int32_t> data(10, rank);
    comm->allreduce(data.data(), data.size(), DataType::kInt32, ReduceOp::kSum).wait();
    EXPECT_EQ(data[9], 1);
    if (rank == 0) {
      comm.reset();
      destroyed.raise();
      return;
    }
    ASSERT_TRUE(destroyed.wait_for(60s));
    Work work = comm->allreduce(data.data(), data.size(), DataType::kInt32, ReduceOp::kSum);
    peer_error = failure_of(work);
  }, 120s);
  test::rethrow_rank_failures(errors);
  EXPECT_TRUE(contains(peer_error, "rank 0")) << peer_error;
  EXPECT_FALSE(contains(peer_error, "destroyed with")) << peer_error;
}

// Every key a communicator's creation writes is gone once the group is connected:
// the world communicator's and those of 40 splits (each destroyed before the next),
// with three ranks, over the default transports and over tcp.
TEST(Lifecycle, SplitsLeaveNoKeysInTheStore) {
  constexpr int kSize = 3;
  constexpr int kSplits = 40;
  for (TransportKind transport : {TransportKind::kAuto, TransportKind::kTcp}) {
    CommOptions options = test::test_options();
    options.transport = transport;
    auto store = std::make_shared<InMemoryStore>();
    store->set("user/key", std::string("kept"));
    const int64_t before = store->num_keys();
    std::vector<int64_t> after_world(kSize), after_splits(kSize);
    auto errors = test::run_threads(kSize, [&](int rank) {
      auto world = Communicator::create(store, rank, kSize, options);
      world->barrier().wait();  // every rank is past its creation
      after_world[rank] = store->num_keys();
      world->barrier().wait();
      for (int i = 0; i < kSplits; ++i) {
        std::shared_ptr<Communicator> part = world->split(rank % 2, -rank);
        ASSERT_NE(part, nullptr);
        int32_t one = 1;
        part->allreduce(&one, 1, DataType::kInt32, ReduceOp::kSum).wait();
        ASSERT_EQ(one, rank % 2 == 0 ? 2 : 1);
      }
      world->barrier().wait();
      after_splits[rank] = store->num_keys();
    }, 240s);
    test::rethrow_rank_failures(errors);
    for (int r = 0; r < kSize; ++r) {
      EXPECT_EQ(after_world[r], before) << "rank " << r << ": keys left by the world's creation";
      EXPECT_EQ(after_splits[r], before) << "rank " << r << ": keys left by " << kSplits << " splits";
    }
    EXPECT_EQ(store->get_string("user/key"), "kept");
  }
}

}  // namespace
}  // namespace chorus
