// TcpTransport's streams (tcp_transport_impl.h): posting sends and receives, driving
// them with non-blocking I/O until a wait is satisfied (spinning briefly, then sleeping
// in poll()), checking each frame header as it completes, interrupt, and the control
// frames that abort() and close() send before closing every stream. Whatever fails is
// reported through the members of diagnosis.cc.
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "chorus/error.h"
#include "comm/common/socket.h"
#include "comm/transport/tcp/frame.h"
#include "comm/transport/tcp/tcp_transport_impl.h"

namespace chorus::transport::tcp {
namespace {

// How long a wait keeps retrying non-blocking I/O after the last bytes moved before it
// sleeps in poll(). Short, so that ranks waiting for a peer that is behind give the
// cores away at once; but counted from the last progress, so that a large transfer,
// whose socket buffers fill and drain many times, is not put to sleep at every stall
// (each wake-up costs tens of microseconds: 2 MiB allreduce on loopback 1.1 -> 0.9 ms).
constexpr auto kSpin = std::chrono::microseconds(50);
// How often a blocked wait wakes to re-check deadlines.
constexpr int kPollSliceMs = 500;
constexpr int kMaxIov = 64;
// One sendmsg() hands the kernel about kMaxSendBytes at most, one readv()
// takes at most kMaxRecvBytes of payload. Shorter calls hold the socket lock for less
// time, so the peer's arriving segments wait less in its backlog, and what one call
// copies stays in cache. 256 MiB allreduce, 2 ranks on loopback: 172 ms uncapped,
// 132-135 ms with these caps.
constexpr size_t kMaxSendBytes = size_t{1} << 20;
constexpr size_t kMaxRecvBytes = size_t{128} << 10;

}  // namespace

void TcpTransport::interrupt(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(interrupt_mutex_);
    if (interrupted_.load()) return;
    interrupt_reason_ = reason;
  }
  interrupted_.store(true, std::memory_order_release);
  net::wake(wakeup_.get());
}

void TcpTransport::check_interrupt() {
  if (!interrupted_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(interrupt_mutex_);
  throw AbortedError(op_name() + " on " + here() + " was aborted: " + interrupt_reason_);
}

void TcpTransport::begin(const OpInfo& op) {
  op_ = op;
  ++serial_;
  first_sleep_ = Clock::time_point{};
  suspect_ = waiting_sent_ = false;
  calls_.record(op);
}

Request TcpTransport::isend(int peer, const void* data, size_t len) {
  Peer& p = peers_[peer];
  activate(peer);  // a stream not open yet is connected by the wait (progress_sends)
  SendEntry e;
  e.header.kind = static_cast<uint8_t>(op_.kind);
  e.header.op = op_.code;
  e.header.seq = op_.kind == FrameKind::kP2P ? p.p2p_sent++ : static_cast<uint32_t>(op_.seq);
  e.header.length = len;
  e.header.set_signature(op_.sig);
  e.data = static_cast<const uint8_t*>(data);
  p.sends.push_back(e);
  return Request{peer, true, p.sends_posted++};
}

Request TcpTransport::irecv_message(int peer, void* data, size_t len, const Signature& sig) {
  Peer& p = peers_[peer];
  activate(peer);
  RecvEntry e;
  e.want.kind = static_cast<uint8_t>(op_.kind);
  e.want.op = op_.code;
  e.want.seq = op_.kind == FrameKind::kP2P ? p.p2p_received++ : static_cast<uint32_t>(op_.seq);
  e.want.length = len;
  e.want.set_signature(sig);
  e.data = static_cast<uint8_t*>(data);
  p.recvs.push_back(e);
  return Request{peer, false, p.recvs_posted++};
}

bool TcpTransport::peek_message(int peer, FrameHeader& h, bool* later) {
  Peer& p = peers_[peer];
  if (!p.in.valid()) {
    adopt_arrivals();
    if (!p.in.valid()) return false;  // it has not connected yet: nothing from it
  }
  while (true) {
    if (p.said_goodbye) return false;
    ssize_t n = ::recv(p.in.get(), &h, sizeof h, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) fail_closed(peer, peer_name(peer) + " closed its connection to this rank while "
                                  "this rank waited for a message from it");
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
      std::string err = std::strerror(errno);
      fail_closed(peer, "receiving from " + peer_name(peer) + " failed: " + err);
    }
    if (n != static_cast<ssize_t>(sizeof h)) return false;  // the rest is on its way
    if (h.magic != kFrameMagic) {
      fail_peer(peer, "corrupt frame from " + peer_name(peer) + " (bad magic number)");
    }
    switch (static_cast<FrameKind>(h.kind)) {
      case FrameKind::kP2P:
        return true;
      case FrameKind::kWaiting:
        ::recv(p.in.get(), &h, sizeof h, MSG_DONTWAIT);  // peeked whole: all there
        check_against_call(peer, h);
        continue;
      case FrameKind::kGoodbye: {
        // It sends nothing more: a receive from any of several peers waits for the others.
        std::vector<uint8_t> sink(sizeof h + std::min<uint64_t>(h.length, kMaxControlPayload));
        ::recv(p.in.get(), sink.data(), sink.size(), MSG_DONTWAIT);
        p.said_goodbye = true;
        return false;
      }
      case FrameKind::kAbort: {
        ::recv(p.in.get(), &h, sizeof h, MSG_DONTWAIT);
        RecvEntry e;
        e.got = h;
        e.data = nullptr;
        fail_peer(peer, peer_name(peer) + " aborted: " + read_control_text(peer, e, 0));
      }
      default:
        if (later != nullptr) {
          *later = true;
          return false;
        }
        fail_peer(peer, "expected a send/recv message from " + peer_name(peer) + ", found " +
                            describe_frame(h) + " (did the ranks issue different operations?)");
    }
  }
}

Arrival TcpTransport::probe(const std::vector<int>& peers, Clock::time_point until, bool shared_claim) {
  if (closed_) throw AbortedError(op_name() + " on " + here() + ": the transport is closed");
  auto spin_until = Clock::now() + kSpin;
  std::vector<pollfd> fds;
  // With a shared claim: the peers whose next frame belongs to a later operation. They
  // are not polled (their frame is readable all along) until the claim is settled.
  std::vector<char> later(peers.size(), 0);
  while (true) {
    bool any_left = false;
    for (size_t k = 0; k < peers.size(); ++k) {
      const int peer = peers[k];
      if (later[k]) continue;
      FrameHeader h;
      bool moved_on = false;
      if (peek_message(peer, h, shared_claim ? &moved_on : nullptr)) {
        return Arrival{peer, h.signature(), h.length};
      }
      later[k] = moved_on;
      any_left |= !peers_[peer].said_goodbye && !moved_on;
    }
    if (!any_left && !shared_claim) {
      fail_peer(peers.back(), (peers.size() == 1 ? peer_name(peers.back()) : "every rank it waited for") +
                                  std::string(" left the communicator while this rank waited for a "
                                              "message from it (did the ranks issue different "
                                              "operations?)"));
    }
    check_interrupt();
    const auto now = Clock::now();
    if (now >= until) return Arrival{};
    if (op_.deadline.expired()) fail_probe_timeout(peers);
    if (now < spin_until) {
      sched_yield();
      continue;
    }
    fds.assign(1, pollfd{wakeup_.get(), POLLIN, 0});
    if (acceptor_) fds.push_back({acceptor_->ready_fd(), POLLIN, 0});
    for (size_t k = 0; k < peers.size(); ++k) {
      const Peer& p = peers_[peers[k]];
      if (!p.said_goodbye && !later[k] && p.in.valid()) {
        fds.push_back({p.in.get(), POLLIN | POLLRDHUP, 0});
      }
    }
    int timeout = op_.deadline.remaining_ms(kPollSliceMs);
    if (until != Clock::time_point::max()) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - now);
      timeout = std::min<int>(timeout, static_cast<int>(std::max<int64_t>(left.count(), 0)));
    }
    if (::poll(fds.data(), fds.size(), timeout) < 0 && errno != EINTR) net::throw_errno("poll", errno);
  }
}

template <class Pred>
bool TcpTransport::drive_until(Pred pred, Clock::time_point until) {
  if (closed_) throw AbortedError(op_name() + " on " + here() + ": the transport is closed");
  if (pred()) return true;
  auto spin_until = Clock::now() + kSpin;
  while (true) {
    bool moved = progress_all();
    if (pred()) return true;
    auto now = Clock::now();
    if (now >= until) return false;
    if (moved) spin_until = now + kSpin;
    if (now < spin_until) {
      if (!moved) {
        check_interrupt();
        sched_yield();
      }
      continue;
    }
    check_interrupt();
    if (op_.deadline.expired()) fail_timeout();
    poll_once(until);
    if (pred()) return true;
  }
}

bool TcpTransport::progress_all() {
  adopt_arrivals();
  bool moved = false;
  for (size_t k = 0; k < active_.size();) {
    const int i = active_[k];
    Peer& p = peers_[i];
    if (!p.sends.empty()) moved |= progress_sends(i);
    if (!p.recvs.empty()) moved |= progress_recvs(i);
    if (p.sends.empty() && p.recvs.empty()) {
      // Idle: out of the list (the order of the others does not matter).
      p.listed = false;
      active_[k] = active_.back();
      active_.pop_back();
    } else {
      ++k;
    }
  }
  return moved;
}

bool TcpTransport::progress_sends(int peer) {
  Peer& p = peers_[peer];
  if (!p.out.valid()) connect_out(peer, op_.deadline);
  bool moved = false;
  while (!p.sends.empty()) {
    iovec iov[kMaxIov];
    int n = 0;
    size_t room = kMaxSendBytes;
    for (auto it = p.sends.begin(); it != p.sends.end() && n + 2 <= kMaxIov && room > 0; ++it) {
      size_t total = sizeof(FrameHeader) + it->header.length;
      size_t off = it->done;
      if (off < sizeof(FrameHeader)) {
        iov[n++] = {reinterpret_cast<uint8_t*>(&it->header) + off, sizeof(FrameHeader) - off};
        room -= std::min(room, sizeof(FrameHeader) - off);
        off = sizeof(FrameHeader);
      }
      if (off < total && room > 0) {
        size_t take = std::min(total - off, room);
        iov[n++] = {const_cast<uint8_t*>(it->data) + (off - sizeof(FrameHeader)), take};
        room -= take;
      }
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n);
    ssize_t w = ::sendmsg(p.out.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return moved;
      std::string err = std::strerror(errno);
      fail_closed(peer, "sending to " + peer_name(peer) + " failed: " + err);
    }
    moved = true;
    auto left = static_cast<size_t>(w);
    while (left > 0) {
      SendEntry& e = p.sends.front();
      size_t total = sizeof(FrameHeader) + e.header.length;
      size_t take = std::min(left, total - e.done);
      e.done += take;
      left -= take;
      if (e.done == total) {
        p.sends.pop_front();
        ++p.sends_done;
      }
    }
    // Zero-length frames are complete once their header is out; loop to flush more.
  }
  return moved;
}

bool TcpTransport::progress_recvs(int peer) {
  Peer& p = peers_[peer];
  if (!p.in.valid()) return false;  // it has not connected yet (adopt_arrivals)
  bool moved = false;
  while (!p.recvs.empty()) {
    RecvEntry& e = p.recvs.front();
    size_t total = sizeof(FrameHeader) + e.want.length;
    iovec iov[2];
    int n = 0;
    size_t off = e.done;
    if (off < sizeof(FrameHeader)) {
      iov[n++] = {reinterpret_cast<uint8_t*>(&e.got) + off, sizeof(FrameHeader) - off};
      off = sizeof(FrameHeader);
    }
    if (off < total) {
      iov[n++] = {e.data + (off - sizeof(FrameHeader)), std::min(total - off, kMaxRecvBytes)};
    }
    ssize_t r = ::readv(p.in.get(), iov, n);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return moved;
      std::string err = std::strerror(errno);
      fail_closed(peer, "receiving from " + peer_name(peer) + " failed: " + err);
    }
    if (r == 0) {
      if (p.said_goodbye) {
        fail_peer(peer, peer_name(peer) + " closed the connection while " +
                            std::to_string(e.want.length) +
                            " bytes were expected from it (it had left the communicator "
                            "cleanly: did the ranks issue different operations?)");
      }
      fail_closed(peer, peer_name(peer) + " closed the connection while " +
                            std::to_string(e.want.length) + " bytes were expected from it");
    }
    moved = true;
    size_t before = e.done;
    e.done += static_cast<size_t>(r);
    if (before < sizeof(FrameHeader) && e.done >= sizeof(FrameHeader)) {
      finish_header(peer, e, e.done - sizeof(FrameHeader));
    }
    if (e.done == total) {
      p.recvs.pop_front();
      ++p.recvs_done;
    }
  }
  return moved;
}

// Checks a header once it is complete. `payload_read` bytes after it already went to
// the receive buffer.
void TcpTransport::finish_header(int peer, RecvEntry& e, size_t payload_read) {
  while (true) {
    const FrameHeader& g = e.got;
    // The expected frame: every field equal, magic and signature included.
    if (std::memcmp(&g, &e.want, sizeof g) == 0) return;
    if (g.magic != kFrameMagic) {
      fail_peer(peer, "corrupt frame from " + peer_name(peer) + " (bad magic number)");
    }
    auto kind = static_cast<FrameKind>(g.kind);
    if (kind == FrameKind::kAbort) {
      fail_peer(peer, peer_name(peer) + " aborted: " + read_control_text(peer, e, payload_read));
    }
    if (kind == FrameKind::kGoodbye) {
      look_for_mismatch(peer, kExplainWithin);
      fail_peer(peer, peer_name(peer) + " left the communicator while this rank expected " +
                          std::to_string(e.want.length) +
                          " bytes from it (did the ranks issue different operations?)");
    }
    if (kind != FrameKind::kWaiting) fail_mismatched(peer, e);
    check_against_call(peer, g);
    // What followed the waiting frame went to the receive buffer as payload: it starts
    // the next frame, header first.
    const size_t extra = e.done - sizeof(FrameHeader);
    const size_t head = std::min(extra, sizeof(FrameHeader));
    if (head > 0) std::memcpy(&e.got, e.data, head);
    if (extra > head) std::memmove(e.data, e.data + head, extra - head);
    e.done = extra;
    payload_read = extra - head;
    if (e.done < sizeof(FrameHeader)) return;
  }
}

void TcpTransport::poll_once(Clock::time_point until) {
  // After kSuspectAfter asleep in this operation, the first frame on every idle stream
  // is checked once (POLLIN), and the peers waited for are told what this rank waits in.
  const auto now = Clock::now();
  if (first_sleep_ == Clock::time_point{}) first_sleep_ = now;
  else if (!suspect_ && now - first_sleep_ >= kSuspectAfter) suspect_ = true;
  // Up to two entries per peer: `out` while sends are pending, `in` while receives are
  // pending or its closing (or, suspecting, its first frame) is watched. who[k] is the
  // peer, negative (-1) for the wake-up fd.
  // Only peers with a stream open can show anything; the acceptor's mailbox (-2) shows
  // a peer connecting.
  std::vector<pollfd> fds;
  std::vector<int> who;
  fds.reserve(2 * linked_.size() + 2);
  fds.push_back({wakeup_.get(), POLLIN, 0});
  who.push_back(-1);
  if (acceptor_) {
    fds.push_back({acceptor_->ready_fd(), POLLIN, 0});
    who.push_back(-2);
  }
  for (int i : linked_) {
    Peer& p = peers_[i];
    if (!p.sends.empty() && p.out.valid()) {
      fds.push_back({p.out.get(), POLLOUT, 0});
      who.push_back(i);
    } else if (!p.recvs.empty() && !p.in.valid() && p.out.valid()) {
      // Awaited, and it never sent here: the stream to it is all that shows it die
      // (its end closes, POLLHUP or POLLRDHUP), where the full mesh had its stream here.
      fds.push_back({p.out.get(), POLLRDHUP, 0});
      who.push_back(i);
    }
    short ev = 0;
    const bool peek = suspect_ && p.peeked_serial != serial_ && !p.said_goodbye;
    if (!p.recvs.empty() || peek) ev |= POLLIN;
    if (p.watch_close) ev |= POLLRDHUP;
    if (ev != 0 && p.in.valid()) {
      fds.push_back({p.in.get(), ev, 0});
      who.push_back(i);
    }
  }
  int timeout = op_.deadline.remaining_ms(kPollSliceMs);
  if (until != Clock::time_point::max()) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - now);
    timeout = std::min<int>(timeout, static_cast<int>(std::max<int64_t>(left.count(), 0)));
  }
  if (!suspect_) {
    const auto until =
        std::chrono::ceil<std::chrono::milliseconds>(first_sleep_ + kSuspectAfter - now);
    timeout = std::min<int>(timeout, static_cast<int>(std::max<int64_t>(until.count(), 0)));
  } else if (!waiting_sent_) {
    timeout = 0;  // look at what is there already, then tell the peers
  }
  int rc = ::poll(fds.data(), fds.size(), timeout);
  if (rc < 0 && errno != EINTR) net::throw_errno("poll", errno);
  for (size_t k = 0; rc > 0 && k < fds.size(); ++k) {
    int i = who[k];
    short re = fds[k].revents;
    if (re == 0) continue;
    if (i == -2) {
      adopt_arrivals();
      continue;
    }
    if (i < 0) {
      check_interrupt();
      continue;
    }
    if (fds[k].fd == peers_[i].out.get()) {
      if (!peers_[i].sends.empty()) {
        progress_sends(i);
      } else if ((re & (POLLRDHUP | POLLHUP | POLLERR)) != 0 && !peers_[i].in.valid()) {
        fail_closed(i, peer_name(i) + " closed its connection from this rank while this rank "
                        "waited for data from it");
      }
    } else if (!peers_[i].recvs.empty()) {
      progress_recvs(i);
    } else {
      check_idle_peer(i, re);
    }
  }
  if (suspect_ && !waiting_sent_) {
    waiting_sent_ = true;
    send_waiting_frames();
  }
}

void TcpTransport::send_control(FrameKind kind, const std::string& text) {
  try {
    adopt_arrivals();  // streams that came in meanwhile are closed like the others
  } catch (const Error&) {
  }
  if (kind == FrameKind::kAbort) {
    // The peers that may wait for this rank without a stream from it (connections by
    // use): those that sent here, and those this operation exchanges with. They get a
    // stream now, to read the reason on; a peer that is gone or slow is skipped.
    // Within 500 ms in all and 100 ms a peer, a refusal not tried again: a stopped peer
    // accepts the connection in its kernel and never answers, and a dead one refuses
    // it; this rank's failure report must wait on neither for long (a stopped rank's
    // survivors fail within their timeout and a little more).
    const Deadline connecting(std::chrono::milliseconds(500));
    std::vector<int> waiting = active_;
    for (int i : linked_) {
      if (peers_[i].in.valid()) waiting.push_back(i);
    }
    for (int i : waiting) {
      if (peers_[i].out.valid() || connecting.expired()) continue;
      try {
        connect_out(i, connecting.earlier(Deadline(std::chrono::milliseconds(100))), 0);
      } catch (const Error&) {
      }
    }
  }
  std::string body = text.substr(0, kMaxControlPayload);
  FrameHeader h;
  h.kind = static_cast<uint8_t>(kind);
  h.length = body.size();
  // Best effort within a short, shared deadline: a peer that does not read must not
  // delay this rank's failure report.
  const Deadline deadline(std::chrono::milliseconds(300));
  for (int i : linked_) {
    Peer& p = peers_[i];
    if (!p.out.valid()) continue;
    try {
      // A half-written frame is finished first (its buffer belongs to the operation
      // that is failing now, so it is still valid); otherwise the peer could not find
      // the control frame behind it and would not learn why this rank left.
      if (!p.sends.empty() && p.sends.front().done > 0) {
        SendEntry& e = p.sends.front();
        size_t total = sizeof(FrameHeader) + e.header.length;
        if (e.done < sizeof(FrameHeader)) {
          net::write_full(p.out.get(), reinterpret_cast<uint8_t*>(&e.header) + e.done,
                          sizeof(FrameHeader) - e.done, deadline, "finishing a frame");
          e.done = sizeof(FrameHeader);
        }
        net::write_full(p.out.get(), e.data + (e.done - sizeof(FrameHeader)), total - e.done,
                        deadline, "finishing a frame");
      }
      net::write_full(p.out.get(), &h, sizeof h, deadline, "sending a control frame");
      net::write_full(p.out.get(), body.data(), body.size(), deadline, "sending a control frame");
    } catch (const Error&) {
      // The peer is gone or not reading: closing is all that is left.
    }
    ::shutdown(p.out.get(), SHUT_WR);
    p.sends.clear();
    p.recvs.clear();
  }
  // Closing `in` with unread data in it resets the peer's stream to this rank, and the
  // peer, failing on that, looks for this rank's reason on its own `in`, which the
  // control frame above reaches intact (`out` is never read from, so closing it sends no
  // reset). Still, a peer in the middle of sending should learn the reason rather than
  // "connection reset" in most cases: read and discard what peers still send until each
  // closes its side (they do once they read the control frame) or a short shared
  // deadline passes, and only then close.
  const Deadline linger(std::chrono::milliseconds(500));
  std::vector<pollfd> open;
  std::vector<int> owner;
  for (int i : linked_) {
    peers_[i].out.reset();
    if (!peers_[i].in.valid()) continue;
    open.push_back(pollfd{peers_[i].in.get(), POLLIN, 0});
    owner.push_back(i);
  }
  char sink[16384];
  while (!open.empty() && !linger.expired()) {
    int ready = ::poll(open.data(), open.size(), static_cast<int>(linger.remaining_ms()));
    if (ready < 0 && errno != EINTR) break;
    for (size_t k = 0; k < open.size();) {
      bool done = false;
      if (open[k].revents != 0) {
        ssize_t n = ::recv(open[k].fd, sink, sizeof sink, MSG_DONTWAIT);
        done = n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
      }
      if (done) {
        peers_[owner[k]].in.reset();
        open.erase(open.begin() + static_cast<ptrdiff_t>(k));
        owner.erase(owner.begin() + static_cast<ptrdiff_t>(k));
      } else {
        open[k].revents = 0;
        ++k;
      }
    }
  }
  for (int i : owner) peers_[i].in.reset();
}

void TcpTransport::abort(const std::string& reason) {
  if (closed_) return;
  closed_ = true;
  // The peers with a stream from this rank read the reason on it; one that connects
  // later (it waits for this rank) reads it in the refusal, while this transport lives.
  if (acceptor_) acceptor_->refuse_all(kAbortedRefusal + reason);
  send_control(FrameKind::kAbort, reason);
}

void TcpTransport::close() {
  if (closed_) return;
  closed_ = true;
  if (acceptor_) acceptor_->refuse_all(kClosedRefusal);
  send_control(FrameKind::kGoodbye, "");
}

}  // namespace chorus::transport::tcp

// The waits, with drive_until() above inlined into them (stream_transport.h).
template class chorus::transport::StreamTransport<chorus::transport::tcp::TcpTransport>;
