// TcpTransport, the Transport over a full mesh of tcp streams (one Peer per rank,
// peer.h), as connect_mesh (tcp_transport.h, defined in mesh.cc) returns it. Internal
// to the tcp transport: nothing outside src/comm/transport/tcp/ includes it.
//
// One class, its members defined in two files by concern:
// - stream.cc: posting sends and receives, driving the streams (non-blocking I/O,
//   frame headers, poll()), interrupt, and the control frames of abort and close;
// - diagnosis.cc: turning what went wrong into an error that names both sides: calls
//   that disagree (the call history, waiting frames, the first frame of idle streams),
//   peers that closed, died or aborted, and deadlines that passed.
#pragma once


#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "chorus/defaults.h"
#include "chorus/error.h"
#include "comm/common/deadline.h"
#include "comm/common/socket.h"
#include "comm/transport/tcp/acceptor.h"
#include "comm/transport/tcp/frame.h"
#include "comm/transport/tcp/peer.h"
#include "comm/transport/call_history.h"
#include "comm/transport/stream_transport.h"
#include "comm/transport/transport.h"

namespace chorus::transport::tcp {

using Clock = std::chrono::steady_clock;

// How long a rank about to fail for a peer's frame it cannot explain (a peer already in
// a later call) waits for frames from other peers that name the disagreement.
constexpr auto kExplainWithin = std::chrono::milliseconds(200);

// What a rank needs to open a connection to a peer on first use.
struct ConnectSettings {
  std::string comm_id;
  std::string token;
  std::chrono::milliseconds connect_timeout{kDefaultConnectTimeout};
};

class TcpTransport final : public StreamTransport<TcpTransport> {
 public:
  // `peers` hold their addresses and hosts, no sockets yet; `acceptor` accepts theirs.
  TcpTransport(int rank, int size, std::vector<Peer> peers, std::unique_ptr<Acceptor> acceptor,
               ConnectSettings settings)
      : rank_(rank), size_(size), peers_(std::move(peers)), acceptor_(std::move(acceptor)),
        settings_(std::move(settings)), wakeup_(net::make_wakeup("tcp transport")) {}
  ~TcpTransport() override { close(); }
  // The sockets this rank holds to its peers now (`out` and `in` streams).
  int open_streams() const;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& host_of(int rank) const override { return peers_[rank].host; }
  void begin(const OpInfo& op) override;

  Request isend(int peer, const void* data, size_t len) override;
  Request irecv(int peer, void* data, size_t len) override {
    return irecv_message(peer, data, len, op_.sig);
  }
  Arrival probe(const std::vector<int>& peers, Clock::time_point until, bool shared_claim) override;
  Request irecv_message(int peer, void* data, size_t len, const Signature& sig) override;
  // wait(), test(), wait_all() and wait_for() are StreamTransport's, over drive_until().
  void interrupt(const std::string& reason) override;
  void abort(const std::string& reason) override;
  void close() override;

 private:
  friend class StreamTransport<TcpTransport>;
  const Peer& stream_of(int peer) const { return peers_[peer]; }
  const std::vector<Peer>& streams() const { return peers_; }

  // ---- mesh.cc: connections by use ----
  // Opens `out` to `peer` when it is not open: connects, proves the job token
  // (handshake.h) and sets a stream within this host up for loopback. Throws naming the
  // operation, both ranks and the peer's address when the peer cannot be reached
  // (refused: it died or left), refuses, or does not answer by `deadline`.
  // `refusals`: how many times a refused connection is tried again (net::connect_to_listener).
  void connect_out(int peer, const Deadline& deadline, int refusals = 3);
  // Takes the connections the acceptor has authenticated since the last call.
  void adopt_arrivals() {
    if (acceptor_ && acceptor_->delivered() != adopted_) adopt_arrivals_slow();
  }
  void adopt_arrivals_slow();
  void link(int peer) {
    if (!peers_[peer].linked) {
      peers_[peer].linked = true;
      linked_.push_back(peer);
    }
  }
  void activate(int peer) {
    if (!peers_[peer].listed) {
      peers_[peer].listed = true;
      active_.push_back(peer);
    }
  }

  // ---- stream.cc ----
  void check_interrupt();
  // Drives the streams until pred() (true) or `until` (false; max(): no end but the
  // operation's deadline). Inlined into each wait (stream_transport.h), the hot path,
  // with its predicate: the waits' lambdas have linkage, so the compiler would keep the
  // two of wait_for() out of line.
  template <class Pred>
  [[gnu::always_inline]] inline bool drive_until(Pred pred, Clock::time_point until);
  bool progress_all();
  bool progress_sends(int peer);
  bool progress_recvs(int peer);
  // One poll() of the streams, returning by `until` at the latest.
  void poll_once(Clock::time_point until);
  void finish_header(int peer, RecvEntry& e, size_t payload_bytes_read);
  // probe(): the header of the next message from `peer`, waiting frames consumed and
  // checked; false while it has not arrived whole (or the peer has left).
  // Whether the next frame from `peer` is a send/recv message (its header in `h`).
  // A frame of another operation is a mismatch, or, with `later`, sets *later and
  // stays unread.
  bool peek_message(int peer, FrameHeader& h, bool* later = nullptr);
  [[noreturn]] void fail_probe_timeout(const std::vector<int>& peers) const;
  void send_control(FrameKind kind, const std::string& text);

  // ---- diagnosis.cc ----
  void check_idle_peer(int peer, short revents);
  [[noreturn]] void fail_mismatched(int peer, const RecvEntry& e);
  const Call* call_of(uint32_t seq) const { return calls_.of(seq); }
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
  [[noreturn]] void fail_timeout() const;
  // The stream to `peer` broke: reports `what` with the peer's own reason when it sent
  // an abort frame before closing, else as a dead peer.
  [[noreturn]] void fail_closed(int peer, const std::string& what);
  std::string salvage_abort_reason(int peer);
  std::string other_dead_peers(int except) const;

  // ---- the names in every message ----
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

  int rank_, size_;
  std::vector<Peer> peers_;
  // The peers with sends or receives posted (a peer leaves when both queues are empty),
  // and those with a stream open: what the driving loops look at, instead of every rank.
  std::vector<int> active_, linked_;
  std::unique_ptr<Acceptor> acceptor_;
  uint64_t adopted_ = 0;  // connections taken from the acceptor
  ConnectSettings settings_;
  OpInfo op_;
  uint64_t serial_ = 0;  // operations begun, this one included
  CallHistory calls_;
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

}  // namespace chorus::transport::tcp

// Instantiated in stream.cc, beside drive_until() (stream_transport.h).
extern template class chorus::transport::StreamTransport<chorus::transport::tcp::TcpTransport>;
