// chorus error policy at the public C++ API.
//
// Every failure that crosses the public boundary is thrown as chorus::Error (or a
// subclass). The message always says what was attempted and by whom: the operation,
// the communicator's rank and, where a peer is involved, the peer's rank and host.
//
// Kinds:
//   kInvalidArgument  the call was wrong (bad root, null buffer, overflow, ...). Nothing
//                     was sent; the communicator is still usable.
//   kConfig           an environment variable or option had a bad value.
//   kTimeout          a deadline passed (connect, operation, store wait).
//   kPeer             a peer died, closed its connection, sent a bad frame, or made
//                     another call (dtype, count, op, root: see communicator.h).
//   kAborted          the communicator is broken: an earlier error aborted it. Every
//                     later call fails at once. Rebuild the communicator.
//   kStore            the rendezvous store failed (server gone, protocol error).
//   kSystem           an operating-system call failed (errno is in the message).
#pragma once

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace chorus {

enum class ErrorKind {
  kInvalidArgument,
  kConfig,
  kTimeout,
  kPeer,
  kAborted,
  kStore,
  kSystem,
};

// Returns a stable lower-case name ("invalid argument", "timeout", ...).
const char* error_kind_name(ErrorKind kind);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message)
      : std::runtime_error(message), kind_(kind) {}

  ErrorKind kind() const noexcept { return kind_; }

  // True when the communicator that raised this error can no longer be used.
  bool is_fatal() const noexcept {
    return kind_ == ErrorKind::kTimeout || kind_ == ErrorKind::kPeer ||
           kind_ == ErrorKind::kAborted || kind_ == ErrorKind::kSystem;
  }

 private:
  ErrorKind kind_;
};

class InvalidArgumentError : public Error {
 public:
  explicit InvalidArgumentError(const std::string& m) : Error(ErrorKind::kInvalidArgument, m) {}
};

class ConfigError : public Error {
 public:
  explicit ConfigError(const std::string& m) : Error(ErrorKind::kConfig, m) {}
};

class TimeoutError : public Error {
 public:
  explicit TimeoutError(const std::string& m, std::vector<int> awaited = {})
      : Error(ErrorKind::kTimeout, m), awaited_(std::move(awaited)) {}
  // The ranks this rank was still waiting for when an operation's deadline passed,
  // ascending (empty when the wait was not on peers, e.g. a store wait).
  const std::vector<int>& awaited_ranks() const noexcept { return awaited_; }

 private:
  std::vector<int> awaited_;
};

class PeerError : public Error {
 public:
  explicit PeerError(const std::string& m) : Error(ErrorKind::kPeer, m) {}
};

class AbortedError : public Error {
 public:
  explicit AbortedError(const std::string& m) : Error(ErrorKind::kAborted, m) {}
};

class StoreError : public Error {
 public:
  explicit StoreError(const std::string& m) : Error(ErrorKind::kStore, m) {}
};

class SystemError : public Error {
 public:
  explicit SystemError(const std::string& m) : Error(ErrorKind::kSystem, m) {}
};

}  // namespace chorus
