// How TcpTransport (tcp_transport_impl.h) explains a failure, naming the operation,
// both ranks and their hosts: frames of another call or size (fail_mismatched, the call
// history: call_of, check_against_call, look_for_mismatch, describe_*), the waiting
// frames a slow wait sends and the idle streams it checks, a stream that closed
// (fail_closed: the peer's abort reason when one can be salvaged, else a dead peer, with
// other dead peers named), and a deadline that passed (fail_timeout: what is still
// awaited, from whom).
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <sstream>
#include <vector>

#include "chorus/error.h"
#include "comm/common/socket.h"
#include "comm/transport/tcp/frame.h"
#include "comm/transport/tcp/tcp_transport_impl.h"

namespace chorus::transport::tcp {

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
  std::vector<int> looked;
  while (true) {
    std::vector<pollfd> fds;
    for (int i : linked_) {
      Peer& p = peers_[i];
      if (i == except || !p.in.valid() || p.said_goodbye) continue;
      if (std::find(looked.begin(), looked.end(), i) != looked.end()) continue;
      if (!p.recvs.empty() && p.recvs.front().done > 0) continue;  // inside a frame
      int avail = 0;
      FrameHeader h;
      if (ioctl(p.in.get(), FIONREAD, &avail) == 0 && avail >= static_cast<int>(sizeof h) &&
          ::recv(p.in.get(), &h, sizeof h, MSG_PEEK | MSG_DONTWAIT) ==
              static_cast<ssize_t>(sizeof h)) {
        looked.push_back(i);
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
//
// A peer waited for that has no stream from this rank yet gets one (connections by use:
// this rank never sent to it): a peer that is gone refuses it, and the wait fails at
// once naming it, where it would otherwise last until the deadline. One that is alive
// but slow to answer is left for the deadline.
void TcpTransport::send_waiting_frames() {
  if (op_.kind != FrameKind::kCollective) return;
  const std::vector<int> active = active_;  // connect_out may link peers
  for (int i : active) {
    Peer& p = peers_[i];
    if (p.recvs.empty() || !p.sends.empty()) continue;
    if (!p.out.valid()) {
      try {
        connect_out(i, op_.deadline.earlier(Deadline(kHandshakeTimeout)));
      } catch (const TimeoutError&) {
        continue;
      }
    }
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
  for (int i : linked_) {
    if (i == except || !peers_[i].in.valid() || peers_[i].said_goodbye) continue;
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

void TcpTransport::fail_probe_timeout(const std::vector<int>& peers) const {
  std::vector<std::string> names;
  for (int peer : peers) names.push_back(peer_name(peer));
  throw TimeoutError(probe_timeout_text(op_name(), here(), "", op_.sig.tag, names), peers);
}

void TcpTransport::fail_timeout() const {
  std::ostringstream m;
  m << op_name() << " timed out on " << here() << "; still waiting:";
  std::vector<int> awaited;
  std::vector<int> active = active_;
  std::sort(active.begin(), active.end());
  for (int i : active) {
    const Peer& p = peers_[i];
    if (!p.recvs.empty() || !p.sends.empty()) awaited.push_back(i);
    for (const RecvEntry& e : p.recvs) {
      m << " to receive " << (sizeof(FrameHeader) + e.want.length - e.done) << " bytes from "
        << peer_name(i)
        << (p.in.valid() ? ""
                         : " (it never connected to this rank" +
                               std::string(acceptor_ ? ", on " + acceptor_->listening() +
                                                           ", the address this rank published: "
                                                           "can it reach it? CHORUS_IF_IP, "
                                                           "CHORUS_SOCKET_IFNAME and HCCL_IF_IP "
                                                           "choose it"
                                                     : "") +
                               ")")
        << ";";
      break;
    }
    for (const SendEntry& e : p.sends) {
      m << " to send " << (sizeof(FrameHeader) + e.header.length - e.done) << " bytes to "
        << peer_name(i) << " (not reading);";
      break;
    }
  }
  m << " (a peer is stopped, hung, or behind in a different operation)";
  if (acceptor_) {
    std::string refusal = acceptor_->last_refusal();
    if (!refusal.empty()) m << "; last connection refused: " << refusal;
  }
  throw TimeoutError(m.str(), std::move(awaited));
}

}  // namespace chorus::transport::tcp
