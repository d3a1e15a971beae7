// The shared state behind chorus::Work: completion flag, error, description.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>

namespace chorus::communicator {

class WorkState;

// Whoever can run queued operations. A thread that waits for an operation lends
// itself to run it (and those queued before it) instead of sleeping while the
// progress thread is woken: one context switch less per blocking collective.
class Executor {
 public:
  virtual ~Executor() = default;
  // Runs queued operations on the calling thread until `work` has completed, if no
  // other thread is running operations right now. Never throws.
  virtual void help(const WorkState& work) = 0;
};

class WorkState {
 public:
  // `name` must outlive the state (a string literal). The description ("allreduce #12")
  // is made only when asked for: most operations never need it.
  WorkState(const char* name, uint64_t seq, std::weak_ptr<Executor> executor)
      : name_(name), seq_(seq), executor_(std::move(executor)) {}

  // Called once, by the progress thread. Wakes every waiter.
  void complete(std::exception_ptr error);

  bool completed() const { return state_.load(std::memory_order_acquire) == kDone; }
  std::exception_ptr error() const { return completed() ? error_ : nullptr; }
  std::string description() const { return std::string(name_) + " #" + std::to_string(seq_); }
  // Waits until completion or `deadline`; false on timeout.
  bool wait_until(std::chrono::steady_clock::time_point deadline);
  // Offers the calling thread to run the operation (see Executor).
  void help();
  // A receive's sender, written by its body before it completes (set before it runs).
  void set_source_slot(std::shared_ptr<std::atomic<int>> slot) { source_ = std::move(slot); }
  int source() const { return source_ && completed() && !error_ ? source_->load() : -1; }

 private:
  // kSleeping: pending, and some thread sleeps on the futex (complete() must wake it).
  static constexpr uint32_t kPending = 0, kDone = 1, kSleeping = 2;
  std::atomic<uint32_t> state_{kPending};
  std::exception_ptr error_;
  const char* name_;
  uint64_t seq_;
  std::weak_ptr<Executor> executor_;
  std::shared_ptr<std::atomic<int>> source_;
};

}  // namespace chorus::communicator
