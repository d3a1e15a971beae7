#include "comm/transport/tcp/tcp_transport.h"

#include <poll.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <atomic>
#include <deque>
#include <mutex>
#include <sstream>
#include <vector>

#include "chorus/error.h"
#include "comm/common/allowlist.h"
#include "comm/common/auth.h"
#include "comm/common/logging.h"
#include "comm/common/socket.h"
#include "comm/store/paged.h"
#include "comm/transport/tcp/acceptor.h"
#include "comm/transport/tcp/frame.h"
#include "comm/transport/tcp/handshake.h"

namespace chorus::transport::tcp {
namespace {

using Clock = std::chrono::steady_clock;

// How long a wait keeps retrying non-blocking I/O after the last bytes moved before it
// sleeps in poll(). Short, so that ranks waiting for a peer that is behind give the
// cores away at once; but counted from the last progress, so that a large transfer,
// whose socket buffers fill and drain many times, is not put to sleep at every stall
// (each wake-up costs tens of microseconds: 2 MiB allreduce on loopback 1.1 -> 0.9 ms).
constexpr auto kSpin = std::chrono::microseconds(50);
// How often a blocked wait wakes to re-check deadlines.
constexpr int kPollSliceMs = 500;
// Collective calls remembered for frames that arrive after this rank has moved on (a
// rank that completed a broadcast as a leaf, then reads a frame that the broadcast's
// other root sent it): far more than ranks drift apart, which a peer's frames bound.
constexpr size_t kCallHistory = 64;
// How long a rank about to fail for a peer's frame it cannot explain (a peer already in
// a later call) waits for frames from other peers that name the disagreement.
constexpr auto kExplainWithin = std::chrono::milliseconds(200);
constexpr int kMaxIov = 64;
// One sendmsg() hands the kernel about kMaxSendBytes at most, one readv()
// takes at most kMaxRecvBytes of payload. Shorter calls hold the socket lock for less
// time, so the peer's arriving segments wait less in its backlog, and what one call
// copies stays in cache. 256 MiB allreduce, 2 ranks on loopback: 172 ms uncapped,
// 132-135 ms with these caps.
constexpr size_t kMaxSendBytes = size_t{1} << 20;
constexpr size_t kMaxRecvBytes = size_t{128} << 10;

struct SendEntry {
  FrameHeader header;
  const uint8_t* data;
  size_t done = 0;  // bytes of header + payload written
};

struct RecvEntry {
  FrameHeader want;
  FrameHeader got;
  uint8_t* data;
  size_t done = 0;  // bytes of header + payload read
};

// Each ordered pair of ranks has its own stream: `out` carries this rank's frames to the
// peer and `in` the peer's frames to this rank. One socket carrying both directions at
// once makes each side's sends queue behind the other's on the socket lock (the kernel
// defers the arriving segments to the lock owner's backlog): on loopback a 1 MiB
// exchange took 1.5x as long as over two one-way sockets.
struct Peer {
  net::Fd out;  // written only by this rank; the peer never writes to it
  net::Fd in;   // read only by this rank
  std::string host;
  std::string address;
  std::deque<SendEntry> sends;
  std::deque<RecvEntry> recvs;
  uint64_t sends_posted = 0, sends_done = 0;
  uint64_t recvs_posted = 0, recvs_done = 0;
  uint32_t p2p_sent = 0, p2p_received = 0;
  bool said_goodbye = false;
  // Whether poll() should watch an idle stream for the peer closing it.
  bool watch_close = true;
  // The operation (TcpTransport::serial_) in which the first frame waiting on the idle
  // stream was checked; while it is the current one, poll() does not watch it for data.
  uint64_t peeked_serial = 0;
};

// A collective call this rank made, for frames that name its sequence number.
struct Call {
  uint64_t seq = UINT64_MAX;  // UINT64_MAX: none
  uint8_t code = 0;
  Signature sig;
};

class TcpTransport final : public Transport {
 public:
  TcpTransport(int rank, int size, std::vector<Peer> peers)
      : rank_(rank), size_(size), peers_(std::move(peers)),
        wakeup_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
    if (!wakeup_.valid()) net::throw_errno("eventfd", errno);
  }
  ~TcpTransport() override { close(); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& host_of(int rank) const override { return peers_[rank].host; }
  void begin(const OpInfo& op) override;

  Request isend(int peer, const void* data, size_t len) override;
  Request irecv(int peer, void* data, size_t len) override;
  void wait(const Request& request) override;
  bool test(const Request& request) const override { return done(request); }
  void wait_all() override;
  void interrupt(const std::string& reason) override;
  void abort(const std::string& reason) override;
  void close() override;

 private:
  void check_interrupt();
  bool done(const Request& r) const {
    const Peer& p = peers_[r.peer];
    return r.is_send ? p.sends_done > r.index : p.recvs_done > r.index;
  }
  bool all_done() const;
  template <class Pred> void drive_until(Pred pred);
  bool progress_all();
  bool progress_sends(int peer);
  bool progress_recvs(int peer);
  void poll_once();
  void check_idle_peer(int peer, short revents);
  void finish_header(int peer, RecvEntry& e, size_t payload_bytes_read);
  [[noreturn]] void fail_mismatched(int peer, const RecvEntry& e);
  // This rank's collective call whose sequence number ends in `seq` (frames carry the
  // low 32 bits), when it made it and still remembers it.
  const Call* call_of(uint32_t seq) const;
  // Throws PeerError when `h` (from `peer`) names a call of this rank's with another
  // operation or signature.
  void check_against_call(int peer, const FrameHeader& h);
  // Before failing with a message that cannot name the disagreement: throws the
  // mismatch that the first frame on another stream (not `except`'s) names, waiting up
  // to `within` for such frames to arrive.
  void look_for_mismatch(int except, std::chrono::milliseconds within);
  std::string describe_frame(const FrameHeader& h) const;
  std::string describe_own(const Call& c) const;
  void send_waiting_frames();
  std::string read_control_text(int peer, const RecvEntry& e, size_t already);
  void send_control(FrameKind kind, const std::string& text);

  std::string op_name() const { return std::string(op_.name) + " #" + std::to_string(op_.seq); }
  std::string peer_name(int peer) const {
    return "rank " + std::to_string(peer) + " (host " + peers_[peer].host + ", " +
           peers_[peer].address + ")";
  }
  std::string here() const {
    return "rank " + std::to_string(rank_) + " (host " + peers_[rank_].host + ")";
  }
  [[noreturn]] void fail_peer(int peer, const std::string& what) const {
    throw PeerError(op_name() + " failed on " + here() + ": " + what);
  }
  [[noreturn]] void fail_timeout() const;
  // The stream to `peer` broke: reports `what` with the peer's own reason when it sent
  // an abort frame before closing, else as a dead peer.
  [[noreturn]] void fail_closed(int peer, const std::string& what);
  std::string salvage_abort_reason(int peer);
  std::string other_dead_peers(int except) const;

  int rank_, size_;
  std::vector<Peer> peers_;
  OpInfo op_;
  uint64_t serial_ = 0;  // operations begun, this one included
  Call calls_[kCallHistory];  // by sequence number modulo kCallHistory
  uint64_t last_collective_ = UINT64_MAX;  // sequence number of the latest collective begun
  // The current operation's slow path: when its first wait went to sleep in poll(),
  // whether it has waited kSuspectAfter since (and looks further), and whether it has
  // sent its waiting frames.
  Clock::time_point first_sleep_{};
  bool suspect_ = false, waiting_sent_ = false;
  bool closed_ = false;
  net::Fd wakeup_;  // eventfd: interrupt() makes poll() return
  std::atomic<bool> interrupted_{false};
  std::mutex interrupt_mutex_;
  std::string interrupt_reason_;
};

void TcpTransport::interrupt(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(interrupt_mutex_);
    if (interrupted_.load()) return;
    interrupt_reason_ = reason;
  }
  interrupted_.store(true, std::memory_order_release);
  uint64_t one = 1;
  ssize_t ignored = ::write(wakeup_.get(), &one, sizeof one);
  (void)ignored;
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
  if (op.kind != FrameKind::kCollective) return;
  calls_[op.seq % kCallHistory] = Call{op.seq, op.code, op.sig};
  last_collective_ = op.seq;
}

Request TcpTransport::isend(int peer, const void* data, size_t len) {
  Peer& p = peers_[peer];
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

Request TcpTransport::irecv(int peer, void* data, size_t len) {
  Peer& p = peers_[peer];
  RecvEntry e;
  e.want.kind = static_cast<uint8_t>(op_.kind);
  e.want.op = op_.code;
  e.want.seq = op_.kind == FrameKind::kP2P ? p.p2p_received++ : static_cast<uint32_t>(op_.seq);
  e.want.length = len;
  e.want.set_signature(op_.sig);
  e.data = static_cast<uint8_t*>(data);
  p.recvs.push_back(e);
  return Request{peer, false, p.recvs_posted++};
}

bool TcpTransport::all_done() const {
  for (const Peer& p : peers_) {
    if (!p.sends.empty() || !p.recvs.empty()) return false;
  }
  return true;
}

void TcpTransport::wait(const Request& request) {
  drive_until([&] { return done(request); });
}

void TcpTransport::wait_all() {
  drive_until([&] { return all_done(); });
}

template <class Pred>
void TcpTransport::drive_until(Pred pred) {
  if (closed_) throw AbortedError(op_name() + " on " + here() + ": the transport is closed");
  if (pred()) return;
  auto spin_until = Clock::now() + kSpin;
  while (true) {
    bool moved = progress_all();
    if (pred()) return;
    auto now = Clock::now();
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
    poll_once();
    if (pred()) return;
  }
}

bool TcpTransport::progress_all() {
  bool moved = false;
  for (int i = 0; i < size_; ++i) {
    if (i == rank_) continue;
    if (!peers_[i].sends.empty()) moved |= progress_sends(i);
    if (!peers_[i].recvs.empty()) moved |= progress_recvs(i);
  }
  return moved;
}

bool TcpTransport::progress_sends(int peer) {
  Peer& p = peers_[peer];
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

// A data frame that is not the one `e` expects: the peer made another call (named with
// both signatures), or the same call with other lengths or algorithms.
void TcpTransport::fail_mismatched(int peer, const RecvEntry& e) {
  const FrameHeader& g = e.got;
  const FrameHeader& w = e.want;
  if (g.kind == static_cast<uint8_t>(FrameKind::kCollective)) check_against_call(peer, g);
  const bool p2p = g.kind == static_cast<uint8_t>(FrameKind::kP2P) &&
                   w.kind == static_cast<uint8_t>(FrameKind::kP2P);
  if (p2p && g.signature() != w.signature()) {
    fail_peer(peer, mismatch_text(peer_name(peer), peer, describe_frame(g),
                                  describe_call(w.op, op_.name, 0, true, w.signature())));
  }
  // A peer that has gone on to a later call completed this one without sending what
  // this rank waits for: it made this call differently, which its frames to other ranks
  // may say (a leaf of a broadcast under another root, whose root has sent this rank
  // its data too). Those frames are on their way, if not here yet.
  const bool ahead = g.kind == static_cast<uint8_t>(FrameKind::kCollective) &&
                     w.kind == static_cast<uint8_t>(FrameKind::kCollective) &&
                     static_cast<int32_t>(g.seq - w.seq) > 0;
  look_for_mismatch(peer, ahead ? kExplainWithin : std::chrono::milliseconds(0));
  const bool want_p2p = w.kind == static_cast<uint8_t>(FrameKind::kP2P);
  std::ostringstream m;
  m << "mismatched message from " << peer_name(peer) << ": expected "
    << describe_call(w.op, want_p2p ? op_.name : nullptr, op_.seq, want_p2p, w.signature())
    << " (" << frame_kind_name(w.kind) << " frame of " << w.length << " bytes), got "
    << describe_frame(g) << " (" << frame_kind_name(g.kind) << " frame of " << g.length
    << " bytes): the ranks issued different operations, counts or types";
  fail_peer(peer, m.str());
}

const Call* TcpTransport::call_of(uint32_t seq) const {
  if (last_collective_ == UINT64_MAX) return nullptr;
  const auto behind = static_cast<int32_t>(static_cast<uint32_t>(last_collective_) - seq);
  // Not made yet (or before the first call).
  if (behind < 0 || static_cast<uint64_t>(behind) > last_collective_) return nullptr;
  const uint64_t full = last_collective_ - static_cast<uint64_t>(behind);
  const Call& c = calls_[full % kCallHistory];
  return c.seq == full ? &c : nullptr;
}

void TcpTransport::check_against_call(int peer, const FrameHeader& h) {
  // The consistency check of CHORUS_DEBUG=DETAIL shares its collective's number.
  if (h.op == kConsistencyCheckCode) return;
  const Call* mine = call_of(h.seq);
  if (mine == nullptr || mine->code == kConsistencyCheckCode) return;
  if (mine->code == h.op && mine->sig == h.signature()) return;
  fail_peer(peer, mismatch_text(peer_name(peer), peer,
                                describe_call(h.op, nullptr, mine->seq, false, h.signature()),
                                describe_own(*mine)));
}

void TcpTransport::look_for_mismatch(int except, std::chrono::milliseconds within) {
  const Deadline deadline(within);
  std::vector<bool> looked(size_, false);
  while (true) {
    std::vector<pollfd> fds;
    for (int i = 0; i < size_; ++i) {
      Peer& p = peers_[i];
      if (i == rank_ || i == except || looked[i] || !p.in.valid() || p.said_goodbye) continue;
      if (!p.recvs.empty() && p.recvs.front().done > 0) continue;  // inside a frame
      int avail = 0;
      FrameHeader h;
      if (ioctl(p.in.get(), FIONREAD, &avail) == 0 && avail >= static_cast<int>(sizeof h) &&
          ::recv(p.in.get(), &h, sizeof h, MSG_PEEK | MSG_DONTWAIT) ==
              static_cast<ssize_t>(sizeof h)) {
        looked[i] = true;
        const bool data = h.kind == static_cast<uint8_t>(FrameKind::kCollective) ||
                          h.kind == static_cast<uint8_t>(FrameKind::kWaiting);
        if (h.magic == kFrameMagic && data) check_against_call(i, h);
        continue;
      }
      fds.push_back({p.in.get(), POLLIN, 0});
    }
    if (fds.empty() || deadline.expired()) return;
    if (::poll(fds.data(), fds.size(), deadline.remaining_ms()) <= 0) return;
  }
}

std::string TcpTransport::describe_frame(const FrameHeader& h) const {
  if (h.kind == static_cast<uint8_t>(FrameKind::kP2P)) {
    return describe_call(h.op, "send", 0, true, h.signature());
  }
  const Call* mine = call_of(h.seq);
  return describe_call(h.op, nullptr, mine != nullptr ? mine->seq : h.seq, false, h.signature());
}

std::string TcpTransport::describe_own(const Call& c) const {
  return describe_call(c.code, nullptr, c.seq, false, c.sig);
}

std::string TcpTransport::read_control_text(int peer, const RecvEntry& e, size_t already) {
  size_t len = std::min<uint64_t>(e.got.length, kMaxControlPayload);
  std::string text(len, '\0');
  size_t have = std::min(already, len);
  if (have > 0) std::memcpy(text.data(), e.data, have);  // e.data is null when idle
  try {
    net::read_full(peers_[peer].in.get(), text.data() + have, len - have,
                   Deadline(std::chrono::seconds(1)), "reading abort reason");
  } catch (const Error&) {
    text.resize(have);
  }
  return text;
}

void TcpTransport::poll_once() {
  // After kSuspectAfter asleep in this operation, the first frame on every idle stream
  // is checked once (POLLIN), and the peers waited for are told what this rank waits in.
  const auto now = Clock::now();
  if (first_sleep_ == Clock::time_point{}) first_sleep_ = now;
  else if (!suspect_ && now - first_sleep_ >= kSuspectAfter) suspect_ = true;
  // Up to two entries per peer: `out` while sends are pending, `in` while receives are
  // pending or its closing (or, suspecting, its first frame) is watched. who[k] is the
  // peer, negative (-1) for the wake-up fd.
  std::vector<pollfd> fds;
  std::vector<int> who;
  fds.reserve(2 * size_ + 1);
  fds.push_back({wakeup_.get(), POLLIN, 0});
  who.push_back(-1);
  for (int i = 0; i < size_; ++i) {
    Peer& p = peers_[i];
    if (i == rank_) continue;
    if (!p.sends.empty() && p.out.valid()) {
      fds.push_back({p.out.get(), POLLOUT, 0});
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
    if (i < 0) {
      check_interrupt();
      continue;
    }
    if (fds[k].fd == peers_[i].out.get()) {
      if (!peers_[i].sends.empty()) progress_sends(i);
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

// A stream with nothing expected on it reported data, a close or an error. A dead peer
// leaves no bytes behind; a clean goodbye or an abort leaves a control frame; waiting
// frames are read and checked; data for a later operation is left for that operation
// to read, once its header was checked against this rank's call of that number (a
// frame of a call this rank has already completed, or made differently, is an error
// now rather than at the read that would find it, if any).
void TcpTransport::check_idle_peer(int peer, short revents) {
  Peer& p = peers_[peer];
  const bool hangup = (revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
  while (true) {
    int avail = 0;
    if (ioctl(p.in.get(), FIONREAD, &avail) != 0) avail = 0;
    if (avail == 0) {
      char c;
      if (hangup || ::recv(p.in.get(), &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0) {
        fail_closed(peer, peer_name(peer) + " closed its connection to this rank");
      }
      return;  // nothing (more) yet
    }
    FrameHeader h;
    ssize_t n = avail >= static_cast<int>(sizeof h)
                    ? ::recv(p.in.get(), &h, sizeof h, MSG_PEEK | MSG_DONTWAIT)
                    : 0;
    p.watch_close = false;
    if (n != static_cast<ssize_t>(sizeof h)) {
      // Part of a header: the rest is on its way, unless the peer has closed.
      if (hangup) p.peeked_serial = serial_;
      return;
    }
    p.peeked_serial = serial_;
    if (h.magic != kFrameMagic) return;  // the read that reaches it reports it
    if (h.kind == static_cast<uint8_t>(FrameKind::kGoodbye)) {
      std::vector<uint8_t> sink(sizeof h + std::min<uint64_t>(h.length, kMaxControlPayload));
      ::recv(p.in.get(), sink.data(), sink.size(), MSG_DONTWAIT);
      p.said_goodbye = true;
      return;
    }
    if (h.kind == static_cast<uint8_t>(FrameKind::kAbort)) {
      ::recv(p.in.get(), &h, sizeof h, MSG_DONTWAIT);
      RecvEntry e;
      e.got = h;
      e.data = nullptr;
      fail_peer(peer, peer_name(peer) + " aborted: " + read_control_text(peer, e, 0));
    }
    if (h.kind == static_cast<uint8_t>(FrameKind::kWaiting)) {
      ::recv(p.in.get(), &h, sizeof h, MSG_DONTWAIT);  // peeked whole: all there
      check_against_call(peer, h);
      continue;
    }
    if (h.kind != static_cast<uint8_t>(FrameKind::kCollective)) return;
    check_against_call(peer, h);
    // Agreeing, for a call this rank made already and is not in: it completed without
    // the frame, which no later call reads as its own.
    const Call* mine = call_of(h.seq);
    const bool in_it =
        op_.kind == FrameKind::kCollective && mine != nullptr && mine->seq == op_.seq;
    if (mine != nullptr && !in_it && h.op != kConsistencyCheckCode) {
      fail_peer(peer, "unexpected message from " + peer_name(peer) + ": it sent " +
                          describe_frame(h) + " data (" + std::to_string(h.length) +
                          " bytes) that this rank's " + describe_own(*mine) +
                          " completed without: the ranks ran it differently (forced algorithms "
                          "or segment sizes that differ?)");
    }
    return;
  }
}

// Tells every peer that this rank waits for, and sends nothing to, which call it waits
// in: a peer that made another call of the same number fails naming both, although
// neither had anything to send the other (ranks that disagree on a broadcast's root,
// each waiting for its parent). Best effort: a stream whose socket buffer is full
// (the peer is not reading it) is skipped.
void TcpTransport::send_waiting_frames() {
  if (op_.kind != FrameKind::kCollective) return;
  for (int i = 0; i < size_; ++i) {
    Peer& p = peers_[i];
    if (i == rank_ || p.recvs.empty() || !p.sends.empty() || !p.out.valid()) continue;
    pollfd writable{p.out.get(), POLLOUT, 0};
    if (::poll(&writable, 1, 0) != 1 || (writable.revents & POLLOUT) == 0) continue;
    SendEntry e;
    e.header.kind = static_cast<uint8_t>(FrameKind::kWaiting);
    e.header.op = op_.code;
    e.header.seq = static_cast<uint32_t>(op_.seq);
    e.header.set_signature(op_.sig);
    e.data = nullptr;
    ssize_t w = ::send(p.out.get(), &e.header, sizeof e.header, MSG_NOSIGNAL | MSG_DONTWAIT);
    // Errors show where they matter: on the reads and writes of the call.
    if (w <= 0 || w == static_cast<ssize_t>(sizeof e.header)) continue;
    // Cut short (hardly ever, with room for a third of the buffer): the rest goes out
    // like any frame, so that the stream stays whole.
    e.done = static_cast<size_t>(w);
    p.sends.push_back(e);
    ++p.sends_posted;
  }
}

void TcpTransport::fail_closed(int peer, const std::string& what) {
  std::string reason = salvage_abort_reason(peer);
  if (!reason.empty()) fail_peer(peer, what + "; it had aborted: " + reason);
  fail_peer(peer, what + " (the peer process died or aborted)" + other_dead_peers(peer));
}

// Peers other than `except` whose streams are closed with nothing left to read: dead.
// Named in a failure report because the peer that broke this rank's stream may only
// have reacted to one of them.
std::string TcpTransport::other_dead_peers(int except) const {
  std::vector<pollfd> fds;
  std::vector<int> who;
  for (int i = 0; i < size_; ++i) {
    if (i == rank_ || i == except || !peers_[i].in.valid() || peers_[i].said_goodbye) continue;
    fds.push_back({peers_[i].in.get(), POLLRDHUP, 0});
    who.push_back(i);
  }
  if (fds.empty() || ::poll(fds.data(), fds.size(), 0) <= 0) return "";
  std::string out;
  for (size_t k = 0; k < fds.size(); ++k) {
    int avail = 0;
    if ((fds[k].revents & (POLLRDHUP | POLLHUP | POLLERR)) &&
        ioctl(fds[k].fd, FIONREAD, &avail) == 0 && avail == 0) {
      out += "; " + peer_name(who[k]) + " has closed its connection too (died?)";
    }
  }
  return out;
}

// A peer that aborts sends an abort frame before closing, possibly behind data this
// rank has not read yet. Once the stream is broken that data is worthless: read past
// it, frame by frame (bounded in bytes and time), looking for the reason.
std::string TcpTransport::salvage_abort_reason(int peer) {
  Peer& p = peers_[peer];
  if (!p.in.valid()) return "";
  const Deadline deadline(std::chrono::milliseconds(200));
  uint64_t skip = 0, budget = uint64_t{256} << 20;
  if (!p.recvs.empty() && p.recvs.front().done > 0) {
    const RecvEntry& e = p.recvs.front();
    if (e.done < sizeof(FrameHeader)) return "";  // lost inside a header: give up
    skip = sizeof(FrameHeader) + e.want.length - e.done;
  }
  try {
    std::vector<uint8_t> sink(64 * 1024);
    while (budget > 0) {
      while (skip > 0) {
        size_t n = static_cast<size_t>(std::min<uint64_t>(skip, sink.size()));
        net::read_full(p.in.get(), sink.data(), n, deadline, "salvage");
        skip -= n;
      }
      FrameHeader h;
      net::read_full(p.in.get(), &h, sizeof h, deadline, "salvage");
      if (h.magic != kFrameMagic) return "";
      if (h.kind == static_cast<uint8_t>(FrameKind::kAbort)) {
        std::string text(std::min<uint64_t>(h.length, kMaxControlPayload), '\0');
        net::read_full(p.in.get(), text.data(), text.size(), deadline, "salvage");
        return text;
      }
      skip = h.length;
      budget = budget > h.length ? budget - h.length : 0;
    }
  } catch (const Error&) {
  }
  return "";
}

void TcpTransport::fail_timeout() const {
  std::ostringstream m;
  m << op_name() << " timed out on " << here() << "; still waiting:";
  std::vector<int> awaited;
  for (int i = 0; i < size_; ++i) {
    const Peer& p = peers_[i];
    if (!p.recvs.empty() || !p.sends.empty()) awaited.push_back(i);
    for (const RecvEntry& e : p.recvs) {
      m << " to receive " << (sizeof(FrameHeader) + e.want.length - e.done) << " bytes from "
        << peer_name(i) << ";";
      break;
    }
    for (const SendEntry& e : p.sends) {
      m << " to send " << (sizeof(FrameHeader) + e.header.length - e.done) << " bytes to "
        << peer_name(i) << " (not reading);";
      break;
    }
  }
  m << " (a peer is stopped, hung, or behind in a different operation)";
  throw TimeoutError(m.str(), std::move(awaited));
}

void TcpTransport::send_control(FrameKind kind, const std::string& text) {
  std::string body = text.substr(0, kMaxControlPayload);
  FrameHeader h;
  h.kind = static_cast<uint8_t>(kind);
  h.length = body.size();
  // Best effort within a short, shared deadline: a peer that does not read must not
  // delay this rank's failure report.
  const Deadline deadline(std::chrono::milliseconds(300));
  for (int i = 0; i < size_; ++i) {
    Peer& p = peers_[i];
    if (i == rank_ || !p.out.valid()) continue;
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
  for (int i = 0; i < size_; ++i) {
    if (i == rank_) continue;
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
  send_control(FrameKind::kAbort, reason);
}

void TcpTransport::close() {
  if (closed_) return;
  closed_ = true;
  send_control(FrameKind::kGoodbye, "");
}

// ---- connection set-up ----

std::string address_key(int rank) { return "tcp/" + std::to_string(rank); }

// The size the first rank to arrive was created with, "SIZE RANK"; and, once a rank
// finds that its own differs, why (every rank waiting for addresses looks at it).
const char kSizeKey[] = "tcp/size";
const char kSizeMismatchKey[] = "tcp/size_mismatch";

// "ip port host size": what each rank publishes.
struct Published {
  std::string ip;
  uint16_t port = 0;
  std::string host;
  int size = 0;
};

Published parse_published(const std::string& value, int rank) {
  std::istringstream in(value);
  Published p;
  in >> p.ip >> p.port >> p.host >> p.size;
  if (p.ip.empty() || p.port == 0 || p.size < 1) {
    throw StoreError("rank " + std::to_string(rank) + " published a malformed address '" +
                     value + "'");
  }
  return p;
}

std::string size_mismatch(int rank, int size, int other_rank, int other_size) {
  return "world size differs: rank " + std::to_string(rank) + " was created with size " +
         std::to_string(size) + ", rank " + std::to_string(other_rank) + " with size " +
         std::to_string(other_size);
}

// Publishes this rank's address and the world size it was created with, and returns
// every rank's. A rank created with another size than the others fails at once, and
// so does every rank that waits with it, naming both sizes: the first rank to arrive
// records its size, a rank whose size differs says so in the store before it fails,
// and the others look for that between the short slices they wait in. (Without it the
// ranks with the larger size waited for addresses that never came, until the connect
// timeout.) Every address carries its size too, checked as it is read.
std::vector<Published> exchange_addresses(Store& store, int rank, int size,
                                          const TcpOptions& opt, const net::SockAddr& bound,
                                          const Deadline& deadline) {
  const std::string where = "connecting communicator '" + opt.comm_id + "' (rank " +
                            std::to_string(rank) + " of " + std::to_string(size) + ")";
  auto fail = [&](const std::string& mismatch) {
    store.set(kSizeMismatchKey, mismatch);
    throw ConfigError(where + ": " + mismatch);
  };
  store.set(address_key(rank), opt.listen_address + " " + std::to_string(bound.port()) + " " +
                                   net::hostname() + " " + std::to_string(size));
  std::string mine = std::to_string(size) + " " + std::to_string(rank);
  Bytes first_bytes = store.compare_set(kSizeKey, Bytes(), Bytes(mine.begin(), mine.end()));
  std::istringstream first(std::string(first_bytes.begin(), first_bytes.end()));
  int first_size = 0, first_rank = 0;
  first >> first_size >> first_rank;
  if (first_size != size) fail(size_mismatch(rank, size, first_rank, first_size));

  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(address_key(r));
  std::vector<Bytes> values;
  try {
    values = store_pages::wait_and_get(store, keys, deadline, [&] {
      if (store.check({kSizeMismatchKey})) {
        throw ConfigError(where + ": " + store.get_string(kSizeMismatchKey));
      }
    });
  } catch (const TimeoutError& e) {
    throw TimeoutError(where + ": not every rank published its address within the connect "
                               "timeout: " + e.what());
  }
  std::vector<Published> out;
  for (int r = 0; r < size; ++r) {
    out.push_back(parse_published(std::string(values[r].begin(), values[r].end()), r));
    if (out.back().size != size) fail(size_mismatch(r, out.back().size, rank, size));
  }
  return out;
}

// A full mesh holds two sockets per peer, and the acceptor up to kMaxUnauthenticated
// more during start-up; kSpareDescriptors is left for the rest of the process (the
// store's connection, shared memory, the program's own files).
constexpr rlim_t kSpareDescriptors = 64;

// Checked before anything is published: a world size the process cannot hold sockets
// for fails here, naming the limit, rather than with EMFILE in the middle of the
// mesh's start-up. Raises the soft limit up to the hard one where that is enough, as
// servers do (Debian's soft limit is 1024).
void reserve_descriptors(int rank, int size, const std::string& comm_id) {
  const rlim_t needed = 2 * static_cast<rlim_t>(size - 1) + kMaxUnauthenticated +
                        kSpareDescriptors;
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) net::throw_errno("getrlimit(RLIMIT_NOFILE)", errno);
  if (limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur >= needed) return;
  if (limit.rlim_max == RLIM_INFINITY || limit.rlim_max >= needed) {
    rlim_t before = limit.rlim_cur;
    limit.rlim_cur = limit.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &limit) == 0) {
      CHORUS_LOG(kInfo, "rank " << rank << ": raised RLIMIT_NOFILE from " << before << " to "
                                << limit.rlim_cur << " (world size " << size << " needs about "
                                << needed << " file descriptors)");
      return;
    }
    limit.rlim_cur = before;
  }
  throw ConfigError(
      "creating communicator '" + comm_id + "' (rank " + std::to_string(rank) +
      "): world size " + std::to_string(size) + " needs about " + std::to_string(needed) +
      " file descriptors per rank (2 per peer for the tcp mesh, " +
      std::to_string(kMaxUnauthenticated) + " for connections during start-up, " +
      std::to_string(kSpareDescriptors) + " spare), but RLIMIT_NOFILE allows " +
      std::to_string(limit.rlim_cur) + " (hard limit " +
      (limit.rlim_max == RLIM_INFINITY ? std::string("unlimited")
                                       : std::to_string(limit.rlim_max)) +
      "; see ulimit -n and ulimit -Hn): raise it, or start fewer ranks");
}

// Every rank opens one connection to each other rank, its `out` stream to that rank,
// and accepts one from each, its `in` stream, on the acceptor's thread; the connecting
// side is the one that sends. Every rank's acceptor runs from before its address is
// published until every peer has connected to it, so a connection to a published
// address always finds its peer accepting: the connections go out in any order (the
// next ranks first, so that the ranks do not all start with the same one), each after
// the one before has its verdict.
void connect_to_peers(std::vector<Peer>& peers, const std::vector<Published>& addrs, int rank,
                      int size, const TcpOptions& opt, const Deadline& deadline) {
  for (int step = 1; step < size; ++step) {
    int r = (rank + step) % size;
    std::string what = "rank " + std::to_string(rank) + " connecting to rank " +
                       std::to_string(r) + " (host " + addrs[r].host + ", " + peers[r].address +
                       ")";
    peers[r].out = net::connect_to(addrs[r].ip, addrs[r].port, deadline, what);
    Hello h;
    h.from_rank = rank;
    h.to_rank = r;
    h.size = size;
    h.comm_id = opt.comm_id;
    h.nonce = auth::make_nonce();
    try {
      client_handshake(peers[r].out.get(), h, opt.token, deadline, what);
    } catch (const TimeoutError& e) {
      throw TimeoutError("connecting communicator '" + opt.comm_id + "': " + e.what() +
                         " (rank " + std::to_string(r) +
                         " did not complete the handshake within the connect timeout)");
    }
  }
}

}  // namespace

std::unique_ptr<Transport> connect_mesh(Store& store, int rank, int size, const TcpOptions& opt) {
  Deadline deadline(opt.connect_timeout);
  // Read first: a bad allow-list, or too few descriptors, fail before this rank
  // publishes an address.
  std::shared_ptr<const net::AllowList> allowlist = opt.allowlist;
  if (!allowlist) allowlist = std::make_shared<const net::AllowList>(net::AllowList::from_env());
  reserve_descriptors(rank, size, opt.comm_id);
  net::Fd listener = net::listen_on(opt.listen_address, 0);
  net::SockAddr bound = net::local_address(listener.get());
  Acceptor acceptor(std::move(listener), Expected{rank, size, opt.comm_id, opt.token}, allowlist,
                    deadline);
  std::vector<Peer> peers(size);
  try {
    std::vector<Published> addrs = exchange_addresses(store, rank, size, opt, bound, deadline);
    for (int r = 0; r < size; ++r) {
      peers[r].host = addrs[r].host;
      peers[r].address = addrs[r].ip + ":" + std::to_string(addrs[r].port);
    }
    connect_to_peers(peers, addrs, rank, size, opt, deadline);
  } catch (const TimeoutError& e) {
    acceptor.stop(e.what());
    std::string accepting = acceptor.unconnected();
    throw TimeoutError(std::string(e.what()) + (accepting.empty() ? "" : "; " + accepting));
  } catch (const Error& e) {
    acceptor.stop(e.what());
    throw;
  }
  std::vector<net::Fd> in = acceptor.wait();
  for (int r = 0; r < size; ++r) peers[r].in = std::move(in[r]);
  return std::make_unique<TcpTransport>(rank, size, std::move(peers));
}

}  // namespace chorus::transport::tcp
