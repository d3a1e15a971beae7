#include "c10d/stages.h"

namespace chorus::c10d_backend {

void Stages::issue_pending() {
  if (!pending_) return;
  // Taken out first: issue_second never throws, and the slot is free either way.
  std::shared_ptr<TwoStageOperation> op = std::move(pending_);  // leaves pending_ empty
  op->issue_second(*comm_);
}

Communicator& Stages::ready() {
  std::lock_guard<std::mutex> lock(mutex_);
  issue_pending();
  return *comm_;
}

void Stages::start(std::shared_ptr<TwoStageOperation> op) {
  std::lock_guard<std::mutex> lock(mutex_);
  issue_pending();
  op->issue_first(*comm_);
  pending_ = std::move(op);
}

bool Stages::advance(const TwoStageOperation* op, bool wait) {
  std::unique_lock<std::mutex> lock(mutex_, std::defer_lock);
  if (wait) {
    lock.lock();
  } else if (!lock.try_lock()) {
    return false;
  }
  if (pending_.get() != op) return true;
  if (!wait && !op->first_done()) return false;
  issue_pending();
  return true;
}

}  // namespace chorus::c10d_backend
