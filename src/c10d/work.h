// The c10d::Work of a chorus operation, and the thread that completes their futures.
//
// A Work wraps one chorus::Work plus what has to happen once
// it is done: copying results back into tensors that were not contiguous, splitting a
// packed buffer into a list of tensors. That step runs exactly once, on whichever
// thread gets there first: the caller of wait() or isCompleted() (the usual case: the
// caller runs the operation itself, as chorus's Work::wait does, and no thread hop is
// paid), or, once somebody asked for the future, a completion thread, so that DDP's
// hooks (which only look at the future) run without anyone calling wait().
//
// Errors: wait() throws the chorus::Error of the operation (a std::runtime_error, a
// Python RuntimeError), the future holds the same exception. A fatal error (a dead or
// stopped peer, a timeout) breaks the whole process group (see Comms::abort_all).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/version.h>

#include "chorus/communicator.h"

namespace chorus::c10d_backend {

// The communicators of one process group: collectives on `collectives`; a message from
// rank a to rank b on `p2p[a < b ? 0 : 1]`, so that every rank's sends to higher ranks
// and its sends to lower ranks run on different progress threads (a ring of isends and
// irecvs cannot wait on itself).
struct Comms {
  std::shared_ptr<Communicator> collectives;
  std::shared_ptr<Communicator> p2p[2];
  // Breaks all three after a failure in any of them: later calls fail at once.
  void abort_all(const std::string& reason);
};

class Completer;

class ChorusWork : public ::c10d::Work {
 public:
  using Finisher = std::function<void()>;
  // Whether the stages of an operation issued after `operation` (stages.h) have
  // finished; it may issue them (without blocking) to find out.
  using LaterDone = std::function<bool()>;
  // `finish` runs once `operation` has succeeded, before the future completes with
  // `outputs`. `keep` holds tensors the operation reads or writes.
  ChorusWork(int rank, ::c10d::OpType type, ::chorus::Work operation,
             std::vector<at::Tensor> outputs, Finisher finish, std::vector<at::Tensor> keep,
             std::shared_ptr<Comms> comms, std::weak_ptr<Completer> completer,
             ::chorus::Work partner = {}, LaterDone later_done = nullptr);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  void synchronize() override {}
  // timeout 0 (kNoTimeout): until done, which chorus bounds by the group's timeout.
  bool wait(std::chrono::milliseconds timeout) override;
  // The first call hands the work to the group's completion threads.
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

  // Waits for the chorus operation, runs the finisher, completes the future; once.
  void complete();
  // True once the chorus operation has finished (the finisher may not have run).
  bool operation_done() const {
    return operation_.is_completed() && partner_.is_completed() && (!later_done_ || later_done_());
  }
  // A receive's sender (torch's Work::sourceRank); other works raise as torch's do.
  int sourceRank() const override;

 private:
  ::chorus::Work operation_;
  ::chorus::Work partner_;  // empty (completed) unless a second operation belongs to it
  LaterDone later_done_;    // nullptr unless later stages belong to it
  std::vector<at::Tensor> outputs_;
  Finisher finish_;
  std::vector<at::Tensor> keep_;
  std::shared_ptr<Comms> comms_;
  std::weak_ptr<Completer> completer_;
  std::atomic<bool> future_asked_{false};
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::mutex complete_mutex_;  // held while complete() runs: others wait for it
  bool done_ = false;          // guarded by complete_mutex_
};

#if TORCH_VERSION_MAJOR >= 2
// The work endCoalescing returns: done when every work issued while coalescing is; wait()
// completes each in issue order and raises the first failure; its future completes
// once all have (asked for, it completes them on the asking thread).
class CoalescedWork : public ::c10d::Work {
 public:
  CoalescedWork(int rank, std::vector<c10::intrusive_ptr<ChorusWork>> works);
  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  void synchronize() override {}
  bool wait(std::chrono::milliseconds timeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

 private:
  std::vector<c10::intrusive_ptr<ChorusWork>> works_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

#endif

// Completes the works whose futures were asked for, in the order they were asked, one
// per process group. A future's
// callbacks run on the thread that completes it, and a callback may issue another
// operation and wait for its future (PowerSGD's hook does): so whenever a work is
// queued while every thread is busy, another thread starts (at most kMaxThreads;
// threads stay until the destructor). The destructor completes what is queued (each
// within the group's timeout) and joins.
class Completer {
 public:
  static constexpr size_t kMaxThreads = 8;
  Completer() = default;
  ~Completer();
  void push(c10::intrusive_ptr<ChorusWork> work);
  // Waits until nothing is queued and no thread is completing a work (running its
  // future's callbacks), or until `deadline`; returns whether it got there. Python's
  // exit calls it (torch_chorus): after that a thread that asks for the GIL, as a
  // Python callback does, ends inside C++ and the process aborts.
  bool drain(std::chrono::steady_clock::time_point deadline);

 private:
  void loop();
  std::mutex mutex_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;  // a thread went idle
  std::deque<c10::intrusive_ptr<ChorusWork>> queue_;  // guarded by mutex_
  size_t idle_ = 0;                                    // guarded by mutex_
  bool stopping_ = false;                              // guarded by mutex_
  std::vector<std::thread> threads_;                   // guarded by mutex_
};

}  // namespace chorus::c10d_backend
