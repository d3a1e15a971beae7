// The progress engine on its own, over a runner that only records what it is given:
// issue order and the numbering streams, one runner at a time, help(), stop() running
// what is still queued, and the abort hook called once.
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/communicator/progress_engine.h"

namespace chorus::communicator {
namespace {

struct FakeOp {
  size_t stream = 0;
  uint64_t seq = 0;
  int issuer = 0;
  std::shared_ptr<WorkState> work;
  std::thread::id ran_on;  // recorded by the runner
};

class RecordingRunner : public ProgressEngine<FakeOp>::Runner {
 public:
  void run(FakeOp& op) override {
    if (inside_.fetch_add(1) != 0) overlapped_ = true;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ran_.push_back({op.stream, op.seq, op.issuer, nullptr, std::this_thread::get_id()});
    }
    if (on_run) on_run(op);
    inside_.fetch_sub(1);
    op.work->complete(nullptr);
  }
  // Called inside run(), before the operation completes.
  std::function<void(FakeOp&)> on_run;
  void on_abort() override { aborts_.fetch_add(1); }

  std::vector<FakeOp> ran() {
    std::lock_guard<std::mutex> lock(mutex_);
    return ran_;
  }
  bool overlapped() const { return overlapped_.load(); }
  int aborts() const { return aborts_.load(); }

 private:
  std::mutex mutex_;
  std::vector<FakeOp> ran_;
  std::atomic<int> inside_{0};
  std::atomic<bool> overlapped_{false};
  std::atomic<int> aborts_{0};
};

std::shared_ptr<WorkState> issue(ProgressEngine<FakeOp>& engine, size_t stream, int issuer = 0) {
  std::shared_ptr<WorkState> work;
  engine.enqueue(stream, [&](uint64_t seq, std::chrono::steady_clock::time_point) {
    work = std::make_shared<WorkState>("op", seq, std::weak_ptr<Executor>());
    return FakeOp{stream, seq, issuer, work, {}};
  });
  return work;
}

void wait_for(WorkState& work) {
  while (!work.completed()) work.wait_until(std::chrono::steady_clock::now() + std::chrono::seconds(1));
}

TEST(ProgressEngine, RunsInIssueOrderNumberingEachStreamApart) {
  RecordingRunner runner;
  std::atomic<bool> aborted{false};
  ProgressEngine<FakeOp> engine(runner, aborted);
  engine.start();
  const size_t streams[] = {0, 0, 1, 0, 1, 1, 0};
  std::vector<std::shared_ptr<WorkState>> works;
  for (size_t s : streams) works.push_back(issue(engine, s));
  for (auto& w : works) wait_for(*w);
  engine.stop();
  std::vector<FakeOp> ran = runner.ran();
  ASSERT_EQ(ran.size(), std::size(streams));
  uint64_t next[2] = {0, 0};
  for (size_t i = 0; i < ran.size(); ++i) {
    EXPECT_EQ(ran[i].stream, streams[i]);
    EXPECT_EQ(ran[i].seq, next[streams[i]]++);
  }
  EXPECT_EQ(runner.aborts(), 0);
}

// Threads that issue and help at once: one runner at a time, and in each stream the
// numbers come in the order of the queue.
TEST(ProgressEngine, OneRunnerAtATimeWhileThreadsIssueAndHelp) {
  constexpr int kThreads = 4, kOps = 500;
  RecordingRunner runner;
  std::atomic<bool> aborted{false};
  ProgressEngine<FakeOp> engine(runner, aborted);
  engine.start();
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&engine, t] {
      for (int i = 0; i < kOps; ++i) {
        auto work = issue(engine, static_cast<size_t>(i % 2), t);
        if (i % 3 != 0) {
          engine.help(*work);
          wait_for(*work);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  engine.stop();
  std::vector<FakeOp> ran = runner.ran();
  ASSERT_EQ(ran.size(), static_cast<size_t>(kThreads * kOps));
  EXPECT_FALSE(runner.overlapped());
  uint64_t next[2] = {0, 0};
  for (const FakeOp& op : ran) EXPECT_EQ(op.seq, next[op.stream]++);
}

// stop() does not drop what is queued: the thread runs it, then ends.
TEST(ProgressEngine, StopRunsWhatIsStillQueued) {
  RecordingRunner runner;
  std::atomic<bool> aborted{false};
  std::vector<std::shared_ptr<WorkState>> works;
  {
    ProgressEngine<FakeOp> engine(runner, aborted);
    engine.start();
    for (int i = 0; i < 100; ++i) works.push_back(issue(engine, 0));
    engine.stop();
  }
  for (auto& w : works) EXPECT_TRUE(w->completed());
  EXPECT_EQ(runner.ran().size(), works.size());
}

// Once the owner's abort flag is set, the progress thread takes the runner role for
// on_abort() even with nothing queued, and no holder calls it again.
TEST(ProgressEngine, AbortHookRunsOnce) {
  RecordingRunner runner;
  std::atomic<bool> aborted{false};
  ProgressEngine<FakeOp> engine(runner, aborted);
  engine.start();
  wait_for(*issue(engine, 0));
  aborted.store(true);
  engine.wake();
  while (runner.aborts() == 0) std::this_thread::yield();
  for (int i = 0; i < 10; ++i) {
    auto work = issue(engine, static_cast<size_t>(i % 2));
    engine.help(*work);
    wait_for(*work);
  }
  engine.stop();
  EXPECT_EQ(runner.aborts(), 1);
  EXPECT_EQ(runner.ran().size(), 11u);
}

// Without a spare core (set_no_spare_core()), a caller that waits runs what was queued
// behind its operation too, instead of handing it to the progress thread, but not what
// is queued after its operation completed; that, which nobody waits for, the progress
// thread still runs once the grace has passed.
TEST(ProgressEngine, WithoutASpareCoreTheHelperRunsWhatWasQueuedBehindItsOperation) {
  RecordingRunner runner;
  std::atomic<bool> aborted{false};
  ProgressEngine<FakeOp> engine(runner, aborted);
  // Long enough that the thread never takes the first two before help() below.
  engine.set_no_spare_core(std::chrono::milliseconds(300));
  ASSERT_TRUE(engine.no_spare_core());
  engine.start();
  std::shared_ptr<WorkState> late;
  runner.on_run = [&](FakeOp& op) {
    if (op.issuer == 1) late = issue(engine, 0, 2);  // queued after the first completed
  };
  auto first = issue(engine, 0, 0);
  auto second = issue(engine, 1, 1);
  engine.help(*first);
  EXPECT_TRUE(first->completed());
  EXPECT_TRUE(second->completed());
  ASSERT_NE(late, nullptr);
  wait_for(*late);  // not helped: the progress thread runs it
  engine.stop();
  std::vector<FakeOp> ran = runner.ran();
  ASSERT_EQ(ran.size(), 3u);
  EXPECT_EQ(ran[0].issuer, 0);
  EXPECT_EQ(ran[1].issuer, 1);
  EXPECT_EQ(ran[2].issuer, 2);
  EXPECT_EQ(ran[0].ran_on, std::this_thread::get_id());
  EXPECT_EQ(ran[1].ran_on, std::this_thread::get_id());
  EXPECT_NE(ran[2].ran_on, std::this_thread::get_id());
  EXPECT_FALSE(runner.overlapped());
}

// The same with a spare core (the default): the helper stops at its own operation, and
// the progress thread runs what is queued behind it (and the first too, when the caller
// came after the grace).
TEST(ProgressEngine, WithASpareCoreTheHelperStopsAtItsOperation) {
  RecordingRunner runner;
  std::atomic<bool> aborted{false};
  ProgressEngine<FakeOp> engine(runner, aborted);
  EXPECT_FALSE(engine.no_spare_core());
  engine.start();
  auto first = issue(engine, 0, 0);
  auto second = issue(engine, 0, 1);
  engine.help(*first);
  wait_for(*second);
  engine.stop();
  std::vector<FakeOp> ran = runner.ran();
  ASSERT_EQ(ran.size(), 2u);
  EXPECT_NE(ran[1].ran_on, std::this_thread::get_id());
}

}  // namespace
}  // namespace chorus::communicator
