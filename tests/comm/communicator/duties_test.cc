// What stays the caller's duty (include/chorus/communicator.h, "The caller's duties")
// and how it fails: integer and f16 averages are a sum divided by the size, in the
// element type, so they overflow as the sum does; issuing from two threads at once
// orders the operations differently on each rank, which CHORUS_DEBUG=DETAIL catches
// where the calls overlap.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "chorus/chorus.h"
#include "util/ranks.h"

namespace chorus {
namespace {

// The documented arithmetic, pinned: int8 100 on each of 3 ranks sums to 300, which
// wraps to 44 in int8, and 44 / 3 is 14. A float32 average of the same values is 100.
TEST(Duties, IntegerAveragesAreTheWrappedSumDividedBySize) {
  test::run_ranks(3, [](Communicator& c) {
    std::vector<int8_t> small(5, 100);
    c.allreduce(small.data(), small.size(), DataType::kInt8, ReduceOp::kAvg).wait();
    for (int8_t v : small) EXPECT_EQ(v, 14);
    std::vector<float> wide(5, 100.0f);
    c.allreduce(wide.data(), wide.size(), DataType::kFloat32, ReduceOp::kAvg).wait();
    for (float v : wide) EXPECT_EQ(v, 100.0f);
  });
}

// Two threads issue allreduces of the same shape, without waiting, on one
// communicator: with CHORUS_DEBUG=DETAIL a call that overlaps another thread's fails
// from the issuing call, naming the cause. (Without it nothing can tell: the calls look
// alike on every rank, only their order differs.) One rank, so that the two threads
// have the machine's two cores to overlap on; the check is the same at any size.
TEST(Duties, DetailCatchesTwoThreadsIssuingAtOnce) {
  constexpr int kSize = 1, kCalls = 20000;
  CommOptions options = test::test_options();
  options.check_consistency = true;
  auto store = std::make_shared<InMemoryStore>();
  std::atomic<int> caught{0};
  std::string message;
  std::mutex message_mutex;
  auto errors = test::run_threads(kSize, [&](int rank) {
    auto comm = Communicator::create(store, rank, kSize, options);
    std::vector<std::vector<Work>> works(2);
    std::vector<std::vector<float>> data(2, std::vector<float>(4, 1.0f));
    auto issue = [&](int t) {
      for (int i = 0; i < kCalls; ++i) {
        try {
          works[t].push_back(comm->allreduce(data[t].data(), 4, DataType::kFloat32, ReduceOp::kSum));
        } catch (const InvalidArgumentError& e) {
          if (caught++ == 0) {
            std::lock_guard<std::mutex> lock(message_mutex);
            message = e.what();
          }
          return;
        }
      }
    };
    // Rounds until a call is caught (one round nearly always suffices; a loaded machine
    // may run the two threads one after the other for a while).
    for (int round = 0; round < 10 && caught.load() == 0; ++round) {
      std::thread other(issue, 1);
      issue(0);
      other.join();
    }
    // The ranks' sequences now differ: stop instead of waiting for them.
    comm->abort("test: two threads issued at once");
    for (auto& list : works) {
      for (Work& w : list) {
        try {
          w.wait();
        } catch (const Error&) {
        }
      }
    }
  }, std::chrono::seconds(240));
  test::rethrow_rank_failures(errors);
  EXPECT_GT(caught.load(), 0) << "no overlapping call was caught in 10 rounds of 2 x " << kCalls
                               << " calls";
  EXPECT_NE(message.find("another thread was issuing"), std::string::npos) << message;
  EXPECT_NE(message.find("allreduce"), std::string::npos) << message;
}

// A send completes when its buffer may be reused; over tcp that is once the kernel
// holds its bytes, before the receiver looks at them. When the receiver then fails
// the recv (here it expects a different length), the sender learns it at its next
// operation, which fails naming the receiver and its reason (communicator.h,
// "Completion").
TEST(Duties, ASendThatItsReceiverRefusesFailsTheSendersNextOperation) {
  constexpr int kSize = 2;
  CommOptions options = test::test_options();
  auto store = std::make_shared<InMemoryStore>();
  std::string receiver_error, sender_next_error;
  auto errors = test::run_threads(kSize, [&](int rank) {
    auto comm = Communicator::create(store, rank, kSize, options);
    std::vector<float> data(100, 1.0f);
    if (rank == 0) {
      Work send = comm->send(data.data(), 100, DataType::kFloat32, 1);
      try {
        send.wait();  // may complete: its bytes left
      } catch (const Error& e) {
        sender_next_error = e.what();
        return;
      }
      try {
        comm->barrier().wait();
      } catch (const Error& e) {
        sender_next_error = e.what();
      }
      return;
    }
    try {
      comm->recv(data.data(), 50, DataType::kFloat32, 0).wait();
    } catch (const Error& e) {
      receiver_error = e.what();
    }
  }, std::chrono::seconds(120));
  test::rethrow_rank_failures(errors);
  EXPECT_NE(receiver_error.find("rank 0"), std::string::npos) << receiver_error;
  EXPECT_NE(sender_next_error.find("rank 1"), std::string::npos) << sender_next_error;
  EXPECT_FALSE(sender_next_error.empty());
}

}  // namespace
}  // namespace chorus
