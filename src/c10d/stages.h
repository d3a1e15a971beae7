// Operations of a process group issued in two stages on its collectives communicator,
// where the second stage's sizes come from the first stage's results (a sparse
// allreduce learns how much each rank sends from an exchange of fixed-size headers).
//
// Every rank must issue the same collectives in the same order, so a second stage is
// issued before anything the group issues after its operation: by the next issuing
// call (which waits for the first stage to finish), by the operation's own wait or
// completion thread, or by a poll that finds the first stage done. Whichever comes
// first issues it, once.
//
// Threading: any thread; issues are serialised by one mutex, held while a second stage
// waits for its first (bounded by the group's timeout, as every chorus operation is).
#pragma once

#include <memory>
#include <mutex>

#include "chorus/communicator.h"

namespace chorus::c10d_backend {

class TwoStageOperation {
 public:
  virtual ~TwoStageOperation() = default;
  // Issues the first stage; may throw InvalidArgumentError, as an issuing call does.
  virtual void issue_first(Communicator& comm) = 0;
  // Whether the first stage has finished (successfully or not).
  virtual bool first_done() const = 0;
  // Waits for the first stage and issues the second (or nothing, on every rank alike,
  // where the first stage failed or showed that the ranks disagree). Never throws: a
  // failure is kept for the operation's wait.
  virtual void issue_second(Communicator& comm) noexcept = 0;
};

class Stages {
 public:
  explicit Stages(std::shared_ptr<Communicator> comm) : comm_(std::move(comm)) {}

  // The communicator, once a pending second stage has been issued: every issue on the
  // collectives communicator goes through here.
  Communicator& ready();
  // Issues `op`'s first stage after any pending second stage; `op`'s second stage is
  // then pending until advance() or ready() issues it.
  void start(std::shared_ptr<TwoStageOperation> op);
  // Issues `op`'s second stage if it is pending. With `wait`, waits for its first stage
  // and returns true; without, issues only if the first stage is done and no other
  // thread is issuing, and returns whether the second stage has been issued.
  bool advance(const TwoStageOperation* op, bool wait);

 private:
  void issue_pending();  // requires mutex_

  std::mutex mutex_;
  std::shared_ptr<Communicator> comm_;
  std::shared_ptr<TwoStageOperation> pending_;  // guarded by mutex_
};

}  // namespace chorus::c10d_backend
