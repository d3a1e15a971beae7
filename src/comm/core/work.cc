#include "chorus/work.h"

#include "comm/common/event.h"
#include "comm/core/work_state.h"

namespace chorus {
namespace internal {

void WorkState::complete(std::exception_ptr error) {
  error_ = std::move(error);
  state_.store(kDone, std::memory_order_release);
  futex_wake_all(state_);
}

bool WorkState::wait_until(std::chrono::steady_clock::time_point deadline) {
  return futex_wait_change(state_, kPending, deadline, std::chrono::microseconds(50));
}

}  // namespace internal

void Work::wait() const {
  if (!state_) return;
  // The progress thread completes every operation within its deadline, so this wait
  // ends; the loop only guards against spurious returns.
  while (!state_->wait_until(std::chrono::steady_clock::now() + std::chrono::hours(24))) {
  }
  if (auto e = state_->error()) std::rethrow_exception(e);
}

bool Work::wait(std::chrono::milliseconds timeout) const {
  if (!state_) return true;
  if (!state_->wait_until(std::chrono::steady_clock::now() + timeout)) return false;
  if (auto e = state_->error()) std::rethrow_exception(e);
  return true;
}

bool Work::is_completed() const { return !state_ || state_->completed(); }

std::exception_ptr Work::error() const { return state_ ? state_->error() : nullptr; }

std::string Work::description() const { return state_ ? state_->description() : "empty"; }

}  // namespace chorus
