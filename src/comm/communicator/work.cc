#include "chorus/work.h"

#include "comm/common/event.h"
#include "comm/communicator/work_state.h"

namespace chorus {
namespace communicator {

void WorkState::complete(std::exception_ptr error) {
  error_ = std::move(error);
  if (state_.exchange(kDone, std::memory_order_acq_rel) == kSleeping) futex_wake_all(state_);
}

void WorkState::help() {
  if (completed()) return;
  if (auto executor = executor_.lock()) executor->help(*this);
}

bool WorkState::wait_until(std::chrono::steady_clock::time_point deadline) {
  uint32_t s = state_.load(std::memory_order_acquire);
  if (s == kDone) return true;
  if (s == kPending) state_.compare_exchange_strong(s, kSleeping, std::memory_order_acq_rel);
  // The exchange fails only when complete() came first: then the state is kDone and
  // the futex wait returns at once.
  return futex_wait_change(state_, kSleeping, deadline, std::chrono::microseconds(0)) &&
         completed();
}

}  // namespace communicator

void Work::wait() const {
  if (!state_) return;
  state_->help();
  // The progress thread completes every operation within its deadline, so this wait
  // ends; the loop only guards against spurious returns.
  while (!state_->completed() &&
         !state_->wait_until(std::chrono::steady_clock::now() + std::chrono::hours(24))) {
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

int Work::source() const { return state_ ? state_->source() : -1; }

std::string Work::description() const {
  if (state_) return state_->description();
  if (done_name_ != nullptr) return std::string(done_name_) + " #" + std::to_string(done_seq_);
  return "empty";
}

}  // namespace chorus
