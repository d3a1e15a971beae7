// The progress engine of a communicator: the queue of issued operations, the runner
// role (held by the progress thread or by a caller inside Work::wait(), help()), and
// the progress thread's loop of claim grace, helped streaks, naps and futex sleeps.
#include <pthread.h>
#include <sched.h>

#include "chorus/error.h"
#include "comm/common/event.h"
#include "comm/communicator/communicator_impl.h"

namespace chorus::internal {
namespace {

// How long the progress thread naps instead of sleeping after its last operation, while
// callers run their operations themselves (kHelpedStreak in a row, see progress_loop()),
// and how long each nap is. 8-byte allreduce over shared memory, 2 ranks: 1.2 -> 1.0 us
// with 5 ms naps.
constexpr auto kProgressLinger = std::chrono::milliseconds(20);
constexpr auto kHelpedTick = std::chrono::microseconds(2000);
constexpr uint32_t kHelpedStreak = 16;
// How long the progress thread leaves a newly issued operation to a caller that may be
// about to wait for it (and run it itself, help()), yielding meanwhile: woken by the
// call, the thread often ran before the caller got there (see progress_loop()).
constexpr auto kClaimGrace = std::chrono::microseconds(50);

}  // namespace

Work CommunicatorImpl::enqueue(const OpSpec& spec, OpBody body) {
  // CHORUS_DEBUG=DETAIL: two threads issuing at the same moment put their operations
  // in an order that may differ on every rank (the fingerprints cannot see it when
  // both calls look alike). Catches the calls that overlap here, which two threads
  // issuing in loops do within a few calls; one atomic add each.
  struct Issuing {
    std::atomic<int>* count = nullptr;
    ~Issuing() {
      if (count) count->fetch_sub(1, std::memory_order_acq_rel);
    }
  } issuing;
  if (options_.check_consistency) {
    issuing.count = &issuing_;
    if (issuing_.fetch_add(1, std::memory_order_acq_rel) != 0) {
      throw InvalidArgumentError(
          std::string(collective_name(spec.what)) + " on " + where() +
          ": issued while another thread was issuing an operation on this communicator "
          "(found by CHORUS_DEBUG=DETAIL); the ranks must issue operations in one order, so "
          "issue them from one thread or order the threads yourself");
    }
  }
  std::shared_ptr<WorkState> work;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    uint64_t seq = is_p2p(spec.what) ? next_p2p_++ : next_collective_++;
    work = std::make_shared<WorkState>(collective_name(spec.what), seq, weak_from_this());
    size_t slot = recorder_.enabled() ? recorder_.queued(seq, spec.what, spec.dtype, spec.count, spec.root)
                                      : 0;
    queue_.push_back(Op{spec, seq, std::move(body), work, slot, std::chrono::steady_clock::now()});
    unfinished_.fetch_add(1, std::memory_order_acq_rel);
  }
  wake_progress_thread();
  return Work(work);
}

std::optional<CommunicatorImpl::Op> CommunicatorImpl::pop() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (queue_.empty()) return std::nullopt;
  std::optional<Op> op(std::move(queue_.front()));
  queue_.pop_front();
  return op;
}

void CommunicatorImpl::wake_progress_thread() {
  queue_signal_.fetch_add(1, std::memory_order_seq_cst);
  // The syscall only when the thread sleeps: see the matching order in progress_loop().
  if (progress_sleeping_.load(std::memory_order_seq_cst)) futex_wake_all(queue_signal_);
}

bool CommunicatorImpl::run_queued(const WorkState* until) {
  bool expected = false;
  if (!running_.compare_exchange_strong(expected, true, std::memory_order_acquire)) return false;
  while (until == nullptr || !until->completed()) {
    std::optional<Op> op = pop();
    if (!op) break;
    run(*op);
    // Only the runner writes it: no read-modify-write needed.
    const uint32_t streak = helped_streak_.load(std::memory_order_relaxed);
    helped_streak_.store(until != nullptr ? streak + 1 : 0, std::memory_order_relaxed);
  }
  if (abort_requested_.load() && !transport_aborted_) {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    // The routed transport aborts shared memory first: it tells the local peers at
    // once, while tcp's abort lingers up to half a second for its peers to hang up.
    transport_->abort(abort_reason_);
    transport_aborted_ = true;
  }
  running_.store(false, std::memory_order_release);
  bool left_behind;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    left_behind = !queue_.empty();
  }
  if (left_behind && until != nullptr) {
    // Operations queued behind the helped one must not wait for the next tick.
    queue_signal_.fetch_add(1, std::memory_order_seq_cst);
    futex_wake_all(queue_signal_);
  }
  return true;
}

void CommunicatorImpl::help(const WorkState& work) { run_queued(&work); }

void CommunicatorImpl::progress_loop() {
  using Clock = std::chrono::steady_clock;
  // Named for top -H, gdb and /proc/<pid>/task/*/comm (15 characters at most).
  pthread_setname_np(pthread_self(), "chorus-progress");
  Clock::time_point last_active = Clock::now();
  while (true) {
    uint32_t seen = queue_signal_.load(std::memory_order_acquire);
    bool pending;
    Clock::time_point queued_at;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      pending = !queue_.empty();
      if (!pending && stopping_) break;
      if (pending) queued_at = queue_.front().queued_at;
    }
    if (pending) last_active = Clock::now();
    // An operation issued a moment ago is left to its caller for kClaimGrace: one that
    // waits for it runs it itself. Woken by the call, this thread was often scheduled
    // first, on the caller's core or a peer's; it ran the operation while the caller
    // slept until it completed, and with that streak broken enqueue() woke it for the
    // next one too: on one of 2 ranks in a loop of waited 64 KiB allreduces it ran
    // 49,960 of 50,000, with a sleep and a wake-up each. Yielding gives a caller it
    // preempted its core back; an operation nobody waits for starts 50 us later.
    if (pending && last_active - queued_at < kClaimGrace && !abort_requested_.load()) {
      sched_yield();
      continue;
    }
    if ((pending || (abort_requested_.load() && !transport_aborted_)) && run_queued(nullptr)) {
      continue;
    }
    // A caller that waits runs its operation itself (help()). While the last
    // kHelpedStreak operations were all run that way (a caller that waits for each),
    // enqueue() does not wake this thread, which would only take a core from the caller
    // and its peers; the thread naps kHelpedTick instead, so that an operation nobody
    // waits for still starts within a nap. Otherwise (operations issued and not waited
    // for, as DDP's buckets during backward) it sleeps until enqueue() wakes it: naps of
    // a fraction of a millisecond, as this loop once took, woke it some 40 times in
    // every 10 ms training step and took that much from the rank's computation
    // (chorus-mnist, 2 ranks on 2 cores: 26,700 context switches in 305 steps -> 5,700).
    if (Clock::now() - last_active < kProgressLinger &&
        helped_streak_.load(std::memory_order_relaxed) >= kHelpedStreak) {
      futex_wait_change(queue_signal_, seen, Clock::now() + kHelpedTick, std::chrono::microseconds(0));
      continue;
    }
    // Idle: sleep until enqueue() wakes us. Announce the sleep first; a waker that
    // misses the flag has already changed the signal, and then the futex wait returns
    // at once.
    progress_sleeping_.store(true, std::memory_order_seq_cst);
    bool woken = futex_wait_change(queue_signal_, seen, Clock::now() + std::chrono::seconds(1),
                                   std::chrono::microseconds(0));
    progress_sleeping_.store(false, std::memory_order_relaxed);
    // Woken by enqueue(): operations are coming again, even if the caller runs this
    // one itself before we look.
    if (woken) last_active = Clock::now();
  }
}

}  // namespace chorus::internal
