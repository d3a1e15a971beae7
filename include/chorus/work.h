// A handle to one operation issued on a communicator.
//
// Operations run on the communicator's progress thread in the order they were issued.
// The buffers passed to the call must stay valid and untouched until the Work has
// completed. A Work may be copied; all copies refer to the same operation. Waiting
// from several threads at once is allowed.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>

namespace chorus {

namespace communicator {
class WorkState;
class CommunicatorImpl;
}

class Work {
 public:
  Work() = default;  // an empty handle: completed, no error
  explicit Work(std::shared_ptr<communicator::WorkState> state) : state_(std::move(state)) {}

  // Blocks until the operation has finished. Returns normally on success and throws
  // its chorus::Error on failure. Always returns: the progress thread finishes or
  // fails every operation within the communicator's operation timeout.
  void wait() const;

  // Like wait(), but gives up after `timeout`: returns false if the operation is
  // still running then (it keeps running), true if it completed successfully.
  bool wait(std::chrono::milliseconds timeout) const;

  // True once the operation has finished, successfully or not. Never blocks.
  bool is_completed() const;

  // The failure of a completed operation, or nullptr (success or still running).
  std::exception_ptr error() const;

  // "allreduce #12" and the like: the operation and its sequence number.
  std::string description() const;

  // A completed recv or recv_any: the rank its message came from. -1 for other
  // operations, while running, after a failure, and for a recv_any whose claim another
  // receive took.
  int source() const;

 private:
  friend class communicator::CommunicatorImpl;
  // An operation that completed successfully while it was issued (a small collective
  // on one node, run at once by the issuing thread): only its name, a string literal,
  // and sequence number, for description(); no shared state to allocate and count.
  Work(const char* name, uint64_t seq) : done_name_(name), done_seq_(seq) {}

  std::shared_ptr<communicator::WorkState> state_;
  const char* done_name_ = nullptr;
  uint64_t done_seq_ = 0;
};

}  // namespace chorus
