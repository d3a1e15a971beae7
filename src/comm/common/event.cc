#include "comm/common/event.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>

namespace chorus {

bool futex_wait_change(std::atomic<uint32_t>& word, uint32_t old,
                       std::chrono::steady_clock::time_point deadline,
                       std::chrono::microseconds spin) {
  using Clock = std::chrono::steady_clock;
  auto spin_until = Clock::now() + spin;
  for (int i = 0; word.load(std::memory_order_acquire) == old; ++i) {
    if (Clock::now() >= spin_until) break;
    if (i > 64) sched_yield();
  }
  while (word.load(std::memory_order_acquire) == old) {
    auto now = Clock::now();
    if (now >= deadline) return false;
    auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now).count();
    struct timespec ts;
    ts.tv_sec = static_cast<time_t>(left / 1000000000LL);
    ts.tv_nsec = static_cast<long>(left % 1000000000LL);
    // Relative timeout; EAGAIN (value changed), EINTR and ETIMEDOUT all loop back to
    // the check above.
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT_PRIVATE, old, &ts,
            nullptr, 0);
  }
  return true;
}

void futex_wake_all(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr,
          nullptr, 0);
}

}  // namespace chorus
