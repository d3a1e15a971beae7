// A point in time after which a wait must give up. Every wait in chorus has one.
#pragma once

#include <algorithm>
#include <chrono>

#include <time.h>

namespace chorus {

// The steady clock's time at the kernel's last tick (CLOCK_MONOTONIC_COARSE, the steady
// clock's own base; ticks of 4 ms here): some 6 ns a reading against 24 for the exact
// time. For times whose milliseconds are all that matters (a small collective's
// deadline and flight-recorder times on the inline path, where two exact readings were
// a tenth of the call).
inline std::chrono::steady_clock::time_point coarse_now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return std::chrono::steady_clock::time_point(std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec));
}

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;

  explicit Deadline(std::chrono::milliseconds from_now) : at_(Clock::now() + from_now) {}
  static Deadline at(Clock::time_point t) { return Deadline(t); }

  bool expired() const { return Clock::now() >= at_; }
  Clock::time_point time_point() const { return at_; }

  // Milliseconds left, at least 0, capped at `cap_ms` (for poll()).
  int remaining_ms(int cap_ms = 1 << 30) const {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(at_ - Clock::now()).count();
    if (left < 0) return 0;
    return static_cast<int>(std::min<long long>(left + 1, cap_ms));
  }
  std::chrono::milliseconds remaining() const {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(at_ - Clock::now());
    return std::max(left, std::chrono::milliseconds(0));
  }
  Deadline earlier(const Deadline& other) const {
    return at(std::min(at_, other.at_));
  }

 private:
  explicit Deadline(Clock::time_point t) : at_(t) {}  // no clock reading
  Clock::time_point at_;
};

}  // namespace chorus
