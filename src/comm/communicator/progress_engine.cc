// The progress thread's idle policy: naps while callers run their operations
// themselves, futex sleeps otherwise (progress_engine.h has the rest of the engine).
#include "comm/communicator/progress_engine.h"

#include <pthread.h>

namespace chorus::communicator {
namespace {

// How long the progress thread naps instead of sleeping after its last operation, while
// callers run their operations themselves (kHelpedStreak in a row, see rest()), and how
// long each nap is. 8-byte allreduce over shared memory, 2 ranks: 1.2 -> 1.0 us with
// 5 ms naps.
constexpr auto kProgressLinger = std::chrono::milliseconds(20);
constexpr auto kHelpedTick = std::chrono::microseconds(2000);
constexpr uint32_t kHelpedStreak = 16;

}  // namespace

void ProgressEngineBase::name_progress_thread(std::thread& t) {
  pthread_setname_np(t.native_handle(), "chorus-progress");  // 15 characters at most
}

void ProgressEngineBase::rest(uint32_t seen, Clock::time_point& last_active) {
  // A caller that waits runs its operation itself (help()). While the last
  // kHelpedStreak operations were all run that way (a caller that waits for each),
  // enqueue() does not wake this thread, which would only take a core from the caller
  // and its peers; the thread naps kHelpedTick instead, so that an operation nobody
  // waits for still starts within a nap. Otherwise (operations issued and not waited
  // for, as DDP's buckets during backward) it sleeps until enqueue() wakes it: naps of
  // a fraction of a millisecond, as this loop once took, woke it some 40 times in
  // every 10 ms training step and took that much from the rank's computation
  // (chorus-mnist, 2 ranks on 2 cores: 26,700 context switches in 305 steps -> 5,700).
  // Without a spare core each nap takes a core from a computation: they last the claim
  // grace, which an operation waits out anyway before this thread runs it.
  if (Clock::now() - last_active < kProgressLinger &&
      helped_streak_.load(std::memory_order_relaxed) >= kHelpedStreak) {
    const std::chrono::microseconds tick = no_spare_core_ ? busy_claim_grace_ : kHelpedTick;
    futex_wait_change(queue_signal_, seen, Clock::now() + tick, std::chrono::microseconds(0));
    return;
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

}  // namespace chorus::communicator
