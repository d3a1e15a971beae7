// The shared state behind chorus::Work: completion flag, error, description.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <string>

namespace chorus::internal {

class WorkState {
 public:
  explicit WorkState(std::string description) : description_(std::move(description)) {}

  // Called once, by the progress thread. Wakes every waiter.
  void complete(std::exception_ptr error);

  bool completed() const { return state_.load(std::memory_order_acquire) != kPending; }
  std::exception_ptr error() const { return completed() ? error_ : nullptr; }
  const std::string& description() const { return description_; }
  // Waits until completion or `deadline`; false on timeout.
  bool wait_until(std::chrono::steady_clock::time_point deadline);

 private:
  static constexpr uint32_t kPending = 0, kDone = 1;
  std::atomic<uint32_t> state_{kPending};
  std::exception_ptr error_;
  std::string description_;
};

}  // namespace chorus::internal
