// What the two transports of streams, tcp/ (TcpTransport) and shm/ (ShmTransport), share:
// when a request is complete, and the waits that drive the streams until it is.
//
// Each keeps, per peer, the sends and receives posted and not yet complete, in order
// (`sends`, `recvs`), and how many of each have completed (`sends_done`,
// `recvs_done`): a request is complete once its stream has completed more than its
// index, since a stream completes its requests in the order they were posted. How the
// bytes move, and how a wait sleeps, is the transport's own (its drive_until()).
#pragma once

#include <chrono>

#include "comm/transport/transport.h"

namespace chorus::transport {

// The base of a transport of streams `Self`, which provides, and makes this class a
// friend to reach:
//   const auto& stream_of(int peer) const;  // the state of `peer`'s streams
//   const auto& streams() const;            // every peer's, to go through
//   template <class Pred> bool drive_until(Pred pred, Clock::time_point until);
// drive_until() moves bytes until pred() (true) or `until` (false; max(): no end but
// the operation's deadline), throwing the transport's errors. The waits below are
// instantiated once, explicitly, in the .cc that defines drive_until() (Self's header
// declares that instantiation extern), and drive_until() is always inlined into them
// with its predicate, as when each transport wrote its own waits: they are the hot
// path of every operation.
template <class Self>
class StreamTransport : public Transport {
 public:
  using Clock = std::chrono::steady_clock;

  void wait(const Request& request) final;
  bool test(const Request& request) const final { return done(request); }
  void wait_all() final;
  bool wait_for(const Request* request, std::chrono::microseconds slice) final;

 protected:
  bool done(const Request& r) const {
    const auto& stream = self().stream_of(r.peer);
    return r.is_send ? stream.sends_done > r.index : stream.recvs_done > r.index;
  }
  // No request pending on any stream.
  bool all_done() const {
    for (const auto& stream : self().streams()) {
      if (!stream.sends.empty() || !stream.recvs.empty()) return false;
    }
    return true;
  }

 private:
  const Self& self() const { return static_cast<const Self&>(*this); }
  Self& self() { return static_cast<Self&>(*this); }
};

template <class Self>
void StreamTransport<Self>::wait(const Request& request) {
  self().drive_until([&] { return done(request); }, Clock::time_point::max());
}

template <class Self>
void StreamTransport<Self>::wait_all() {
  self().drive_until([&] { return all_done(); }, Clock::time_point::max());
}

template <class Self>
bool StreamTransport<Self>::wait_for(const Request* request, std::chrono::microseconds slice) {
  const Clock::time_point until = Clock::now() + slice;
  if (request != nullptr) return self().drive_until([&] { return done(*request); }, until);
  return self().drive_until([&] { return all_done(); }, until);
}

}  // namespace chorus::transport
