// The progress engine of a communicator: the queue of issued operations, run one at a
// time in issue order by the runner role, which the engine's progress thread holds or a
// caller that waits for one of them (help(), Work::wait()); and the progress thread's
// loop of claim grace, helped streaks, naps and futex sleeps. It knows nothing of what
// an operation is or does: its owner runs each one through a Runner.
//
// The threading contract:
// - enqueue() and help() may be called by any thread, at once, between start() and
//   stop(); wake() by any thread at any time.
// - The runner role: at most one thread at a time pops operations and calls the Runner,
//   the progress thread or a thread inside help(); so whatever only the Runner touches
//   (for the communicator: its transports and scratch memory) needs no lock. The Runner
//   is never called under the queue's lock, and must outlive the engine.
// - start() and stop() are called once each, by the owner. stop() does not abort
//   anything: the thread runs every operation still queued, then ends and is joined.
//   An owner that must not wait for them sets the abort flag first (see the
//   constructor), so that each one fails at once. The destructor calls stop() if the
//   thread is still running.
// - A help() still inside the engine when stop() is called is not waited for: the owner
//   keeps helpers out (the communicator can only be destroyed once no Work::wait()
//   holds it).
#pragma once

#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "comm/common/deadline.h"
#include "comm/common/event.h"
#include "comm/communicator/work_state.h"

namespace chorus::communicator {

// What does not depend on the operations' type: the signal the progress thread sleeps
// on, the runner role, and the thread's idle policy (progress_engine.cc).
class ProgressEngineBase {
 public:
  ProgressEngineBase(const ProgressEngineBase&) = delete;
  ProgressEngineBase& operator=(const ProgressEngineBase&) = delete;

  // Every core of the node is taken by the ranks' own threads (as many local ranks as
  // cores, or more, all peers local): set once, before start(). The progress thread then
  // has no core of its own; each time it runs, it takes one from a rank's computation,
  // and nothing is gained by starting an operation before somebody waits for it. So
  // the thread leaves every operation to its callers for `claim_grace`, asleep (not
  // yielding, as with a spare core: each yield was a context switch on a busy core), a
  // caller that waits runs what is queued behind its operation too (no hand-over to the
  // thread), and the naps of a streak of operations their callers ran (rest()) last the
  // grace. An operation nobody waits for still starts within about twice the grace.
  // chorus-mnist, 2 ranks on 2 cores: the progress threads woke some 4 times a step each
  // and spun in waits for the other rank's progress thread mid-backward, preempting the
  // computation 5 times a step (1.3 in plain libtorch); docs/performance.md has the rest.
  // How long the thread leaves a newly issued operation to its caller otherwise
  // (Tuning::claim_grace_us). Before start() only.
  void set_claim_grace(std::chrono::microseconds claim_grace) { claim_grace_ = claim_grace; }
  void set_no_spare_core(std::chrono::microseconds claim_grace) {
    no_spare_core_ = true;
    busy_claim_grace_ = claim_grace;
  }
  bool no_spare_core() const { return no_spare_core_; }

  // Wakes the progress thread whether it sleeps or naps (an abort, stop()).
  void wake() {
    queue_signal_.fetch_add(1, std::memory_order_seq_cst);
    futex_wake_all(queue_signal_);
  }

 protected:
  using Clock = std::chrono::steady_clock;

  ProgressEngineBase() = default;
  ~ProgressEngineBase() = default;

  // After an operation was queued: wakes the progress thread if it sleeps.
  void notify() {
    queue_signal_.fetch_add(1, std::memory_order_seq_cst);
    // The syscall only when the thread sleeps: see the matching order in rest().
    if (progress_sleeping_.load(std::memory_order_seq_cst)) futex_wake_all(queue_signal_);
  }
  // The progress thread found nothing to run (the signal read `seen` before it looked):
  // naps or sleeps until woken; `last_active` is when it last saw work.
  void rest(uint32_t seen, Clock::time_point& last_active);
  // Names the progress thread `t` for top -H, gdb and /proc/<pid>/task/*/comm: from
  // start(), so that the name is there as soon as the thread is, not once the thread
  // has first been scheduled (which on a loaded machine can come much later).
  static void name_progress_thread(std::thread& t);

  std::atomic<uint32_t> queue_signal_{0};
  std::atomic<bool> progress_sleeping_{false};
  // The runner role: held by the progress thread or by a thread inside help().
  std::atomic<bool> running_{false};
  // Operations run in a row by threads that wait for them (help()), 0 after one run by
  // the progress thread. Written by the runner, read by the progress thread.
  std::atomic<uint32_t> helped_streak_{0};
  // set_no_spare_core(); written before start() only.
  bool no_spare_core_ = false;
  std::chrono::microseconds busy_claim_grace_{0};
  // How long the progress thread leaves a newly issued operation to a caller that may
  // be about to wait for it (and run it itself, help()), yielding meanwhile: woken by
  // the call, the thread often ran before the caller got there (see loop()).
  // set_claim_grace(); written before start() only.
  std::chrono::microseconds claim_grace_{50};
};

template <class Op>
class ProgressEngine : public ProgressEngineBase {
 public:
  // What the owner does with its operations; called by the runner role's holder only.
  class Runner {
   public:
    // Runs `op`, or fails it once the abort flag is set, and completes whatever waits
    // for it. Never throws.
    virtual void run(Op& op) = 0;
    // Once the abort flag is set: called once, by the next holder of the role after its
    // last run(), before it gives the role up (not at all when stop() found nothing
    // queued and the thread ended first); the owner's place to abort what its
    // operations use.
    virtual void on_abort() = 0;

   protected:
    ~Runner() = default;
  };

  // Sequence numbers count up from 0 in each of these streams apart (the
  // communicator's collectives, and its sends and receives).
  static constexpr size_t kStreams = 2;

  // `aborted`, the owner's, may be set at any time (and is never cleared): from then on
  // no operation is left to its caller (see loop()) and Runner::on_abort() is due.
  // Both must outlive the engine.
  ProgressEngine(Runner& runner, const std::atomic<bool>& aborted)
      : runner_(runner), aborted_(aborted) {}
  ~ProgressEngine() {
    if (thread_.joinable()) stop();
  }

  // Starts the progress thread.
  void start() {
    thread_ = std::thread([this] { loop(); });
    name_progress_thread(thread_);
  }

  // Queues the operation `make(seq, queued_at)` returns, seq being the next number of
  // `stream` and queued_at the steady clock's time now: the one reading of the clock on
  // this path, which the flight recorder shares (readings of some 25 ns each took 18% of
  // perf's samples of 8-byte allreduces, 5 per call; now 3). `make` is called under the
  // queue's lock, so that the numbers, the
  // order of the queue and whatever `make` records with them agree; it must not call
  // the engine.
  template <class Make>
  void enqueue(size_t stream, Make&& make) {
    const Clock::time_point now = Clock::now();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      uint64_t seq = next_seq_[stream]++;
      queue_.push_back(Queued{make(seq, now), now});
    }
    notify();
  }

  // An operation run at once by the thread that issues it (the communicator's inline
  // path): when nothing is queued or running, and no abort or stop is under way, takes
  // the runner role, numbers the operation and calls `claimed(seq, now)` under the
  // queue's lock as enqueue() calls `make` (`now` from coarse_now(): the op is small,
  // and its deadline seconds away), and returns true. The caller runs the operation
  // and then calls release_inline(), passing what is left of it when it could not
  // finish, which then runs before anything issued meanwhile. False: nothing was taken;
  // enqueue() it.
  template <class Claimed>
  bool claim_inline(size_t stream, Claimed&& claimed) {
    if (running_.load(std::memory_order_relaxed)) return false;
    const Clock::time_point now = coarse_now();
    std::lock_guard<std::mutex> lock(mutex_);
    if (!queue_.empty() || stopping_ || aborted_.load()) return false;
    bool expected = false;
    if (!running_.compare_exchange_strong(expected, true, std::memory_order_acquire)) return false;
    claimed(next_seq_[stream]++, now);
    return true;
  }
  void release_inline(std::optional<Op> rest) {
    bool left_behind;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      // Queued now, by the precise clock: the claim grace (loop()) counts from here.
      // The coarse time the operation was claimed at lags by up to a tick (4 ms), so
      // the progress thread took every rest at once, ahead of its caller's wait(); the
      // caller then slept on its Work, and the thread, its helped streak broken, was
      // woken for every rest that followed (8-byte allreduces, 2 ranks: runs of 0.99 us
      // and 39,000 context switches in 400,000 calls, against 0.36 us and 2,000).
      if (rest) queue_.push_front(Queued{std::move(*rest), Clock::now()});
      left_behind = !queue_.empty();
    }
    // Run by the thread that waits for it, as far as the progress thread can tell.
    helped_streak_.store(helped_streak_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    running_.store(false, std::memory_order_release);
    // What is left, issued meanwhile, or an abort's on_abort() is the progress
    // thread's (or a waiting caller's) now.
    if (aborted_.load()) wake();
    else if (left_behind) notify();
  }

  // Runs queued operations on the calling thread, those before `work` and `work`
  // itself, unless another thread holds the runner role now. Never throws.
  void help(const WorkState& work) { run_queued(&work); }

  // Lets the progress thread run what is still queued, then joins it.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake();
    if (thread_.joinable()) thread_.join();
  }

 private:
  struct Queued {
    Op op;
    Clock::time_point queued_at;  // by enqueue()
  };

  // Runs queued operations while holding the runner role, until `until` completes
  // (null: until the queue is empty). False when another thread holds the role.
  bool run_queued(const WorkState* until);
  std::optional<Op> pop();
  void loop();

  Runner& runner_;
  const std::atomic<bool>& aborted_;
  std::mutex mutex_;  // guards queue_, next_seq_, stopping_
  std::deque<Queued> queue_;
  uint64_t next_seq_[kStreams] = {};
  bool stopping_ = false;
  // Runner::on_abort() was called. Written by the runner only.
  std::atomic<bool> abort_handled_{false};
  std::thread thread_;
};

template <class Op>
std::optional<Op> ProgressEngine<Op>::pop() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (queue_.empty()) return std::nullopt;
  std::optional<Op> op(std::move(queue_.front().op));
  queue_.pop_front();
  return op;
}

template <class Op>
bool ProgressEngine<Op>::run_queued(const WorkState* until) {
  bool expected = false;
  if (!running_.compare_exchange_strong(expected, true, std::memory_order_acquire)) return false;
  // Without a spare core a helper also runs what was queued behind `until` when it
  // completed (DDP's later buckets): handed to the progress thread, it would take a
  // core from a computation. What is queued after that is not its: a thread that keeps
  // issuing must not keep the caller here.
  std::optional<size_t> behind;
  while (true) {
    if (until != nullptr && !behind && until->completed()) {
      if (!no_spare_core_) break;
      std::lock_guard<std::mutex> lock(mutex_);
      behind = queue_.size();
    }
    if (behind && (*behind)-- == 0) break;
    std::optional<Op> op = pop();
    if (!op) break;
    runner_.run(*op);
    // Only the runner writes it: no read-modify-write needed.
    const uint32_t streak = helped_streak_.load(std::memory_order_relaxed);
    helped_streak_.store(until != nullptr ? streak + 1 : 0, std::memory_order_relaxed);
  }
  if (aborted_.load() && !abort_handled_) {
    runner_.on_abort();
    abort_handled_ = true;
  }
  running_.store(false, std::memory_order_release);
  bool left_behind;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    left_behind = !queue_.empty();
  }
  // Operations queued behind the helped one must not wait for the next tick.
  if (left_behind && until != nullptr) wake();
  return true;
}

template <class Op>
void ProgressEngine<Op>::loop() {
  Clock::time_point last_active = Clock::now();
  while (true) {
    uint32_t seen = queue_signal_.load(std::memory_order_acquire);
    bool pending, stopping;
    Clock::time_point queued_at;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      pending = !queue_.empty();
      stopping = stopping_;
      if (!pending && stopping) break;
      if (pending) queued_at = queue_.front().queued_at;
    }
    if (pending) last_active = Clock::now();
    // An operation issued a moment ago is left to its caller for claim_grace_: one that
    // waits for it runs it itself. Woken by the call, this thread was often scheduled
    // first, on the caller's core or a peer's; it ran the operation while the caller
    // slept until it completed, and with that streak broken enqueue() woke it for the
    // next one too: on one of 2 ranks in a loop of waited 64 KiB allreduces it ran
    // 49,960 of 50,000, with a sleep and a wake-up each. Yielding gives a caller it
    // preempted its core back; an operation nobody waits for starts 50 us later.
    const std::chrono::microseconds grace = no_spare_core_ ? busy_claim_grace_ : claim_grace_;
    if (pending && !stopping && !aborted_.load() && last_active - queued_at < grace) {
      // Without a spare core, asleep through the grace: an enqueue() does not wake us
      // (we are not sleeping, as it sees it), an abort or stop() does.
      if (no_spare_core_) {
        futex_wait_change(queue_signal_, seen, queued_at + grace, std::chrono::microseconds(0));
      } else {
        sched_yield();
      }
      continue;
    }
    if ((pending || (aborted_.load() && !abort_handled_)) && run_queued(nullptr)) continue;
    rest(seen, last_active);
  }
}

}  // namespace chorus::communicator
