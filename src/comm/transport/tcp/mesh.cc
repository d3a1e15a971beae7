// connect_mesh (tcp_transport.h): the start-up of the tcp transport, and its
// connections by use. Start-up checks the descriptor limit, starts the acceptor
// (acceptor.h) on a fresh listening socket, and exchanges every rank's address, host and
// node through the roster (roster.h): a constant number of store requests per rank. It
// opens no connection: TcpTransport::connect_out opens a rank's stream to a peer when
// the rank first sends to it, and the acceptor hands over the peer's stream to this rank
// when the peer first sends here. A rank holds sockets only to the peers its algorithms
// use (docs/architecture.md, "Connections by use").
#include "comm/transport/tcp/tcp_transport.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "chorus/error.h"
#include "comm/common/allowlist.h"
#include "comm/common/auth.h"
#include "comm/common/logging.h"
#include "comm/common/socket.h"
#include "comm/transport/tcp/acceptor.h"
#include "comm/transport/tcp/handshake.h"
#include "comm/transport/tcp/tcp_transport_impl.h"
#include "comm/transport/roster.h"

namespace chorus::transport::tcp {
namespace {

// A rank holds up to two sockets per peer it exchanges with (an alltoall: every peer),
// and the acceptor up to kMaxUnauthenticated more; kSpareDescriptors is left for the
// rest of the process (the store's connection, shared memory, the program's own files).
constexpr rlim_t kSpareDescriptors = 64;
// What creation requires at least: the streams of this many peers. A rank whose
// algorithms use more peers opens them as it needs them, and one that runs out of
// descriptors then fails naming the limit (connect_out).
constexpr rlim_t kReservedPeers = 64;

// Checked before anything is published. Raises the soft limit up to the hard one where
// it is below what a full mesh would take, as servers do (Debian's soft limit is 1024);
// fails, naming the limit, only when even the streams of kReservedPeers peers do not fit.
void reserve_descriptors(int rank, int size, const std::string& comm_id) {
  const rlim_t peers = static_cast<rlim_t>(size - 1);
  const rlim_t wanted = 2 * peers + kMaxUnauthenticated + kSpareDescriptors;
  const rlim_t needed = 2 * std::min(peers, kReservedPeers) + kMaxUnauthenticated + kSpareDescriptors;
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) net::throw_errno("getrlimit(RLIMIT_NOFILE)", errno);
  if (limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur >= wanted) return;
  if (limit.rlim_max == RLIM_INFINITY || limit.rlim_max > limit.rlim_cur) {
    rlim_t before = limit.rlim_cur;
    limit.rlim_cur = limit.rlim_max == RLIM_INFINITY ? wanted : limit.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &limit) == 0) {
      CHORUS_LOG(kInfo, "rank " << rank << ": raised RLIMIT_NOFILE from " << before << " to "
                                << limit.rlim_cur << " (world size " << size << " takes up to "
                                << wanted << " file descriptors if every peer is used)");
      if (limit.rlim_cur >= needed) return;
    } else {
      limit.rlim_cur = before;
    }
  }
  if (limit.rlim_cur >= needed) return;
  throw ConfigError(
      "creating communicator '" + comm_id + "' (rank " + std::to_string(rank) +
      "): world size " + std::to_string(size) + " needs at least " + std::to_string(needed) +
      " file descriptors per rank (2 per peer for the streams of up to " +
      std::to_string(kReservedPeers) + " peers, " + std::to_string(kMaxUnauthenticated) +
      " for connections being accepted, " + std::to_string(kSpareDescriptors) +
      " spare), but RLIMIT_NOFILE allows " + std::to_string(limit.rlim_cur) + " (hard limit " +
      (limit.rlim_max == RLIM_INFINITY ? std::string("unlimited")
                                       : std::to_string(limit.rlim_max)) +
      "; see ulimit -n and ulimit -Hn): raise it, or start fewer ranks");
}

// Streams between ranks of one host cross the loopback device: nothing is lost there
// and no link is shared, and every byte costs the sending core a copy into freshly
// allocated socket pages (plus the receive path, which loopback runs on the sender's
// core) and the receiving core a copy out. Two settings of the sending side made
// allreduce between such ranks faster:
// - Congestion control reno rather than the host's default when that is BBR (it is
//   here): BBR paces a stream at its estimate of the bandwidth, which on loopback only
//   holds bursts back behind a timer. Reno is the one every process may choose
//   (net.ipv4.tcp_allowed_congestion_control lists it unless an administrator removed
//   it; then the default stays).
// - A fixed send buffer, kLoopbackSendBuffer (the kernel doubles it: 1 MiB), instead of
//   the autotuned one, which grew to tcp_wmem's maximum (4 MiB here): fewer bytes in
//   flight, so fewer socket pages in use at once and more of them still in cache. In
//   perf profiles of slow runs, the time that grew was the sender's copy into those
//   pages (_copy_from_iter: 2-4x its time in fast runs).
// Allreduce in place, f32, 2 ranks on loopback, chorus-bench, best / median us of 12
// interleaved runs of 60 iterations (a noisy 2-core VM: single runs vary by up to 2x):
// default 470/584 at 2 MiB, 1276/1569 at 4 MiB, 3860/4394 at 8 MiB; reno 441/498,
// 1049/1454, 3107/3774; the send buffer alone 426/522, 1137/1335, 3064/3494; both
// 428/484, 1006/1342, 3043/3244. The send buffer's size, best us at 2 MiB (10 runs
// each, without reno): 128 KiB 738 against the default's 521, 256 KiB 525; in another
// set 384 KiB 447, 512 KiB 393, 768 KiB 422, 1 MiB 470, 2 MiB 502, the default 535.
constexpr int kLoopbackSendBuffer = 512 * 1024;
constexpr char kLoopbackCongestion[] = "reno";

}  // namespace

bool tune_loopback_stream(int fd) {
  if (!net::same_host(fd)) return false;
  // Both best effort: the stream works, only slower, with the kernel's choices.
  setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, kLoopbackCongestion,
             sizeof kLoopbackCongestion - 1);
  int bytes = kLoopbackSendBuffer;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
  return true;
}

std::unique_ptr<Transport> connect_mesh(Store& store, int rank, int size, const TcpOptions& opt,
                                        std::vector<std::string>* nodes) {
  Deadline deadline(opt.connect_timeout);
  // Too few descriptors fail before this rank publishes an address.
  std::shared_ptr<const net::AllowList> allowlist = opt.allowlist;
  if (!allowlist) allowlist = std::make_shared<const net::AllowList>();
  reserve_descriptors(rank, size, opt.comm_id);
  net::Fd listener = net::listen_on(opt.listen_address, 0);
  Member mine{opt.listen_address, net::local_address(listener.get()).port(), net::hostname(),
              opt.node_id};
  // Accepting from before the address is published: a peer that reads it may connect
  // at once.
  auto acceptor = std::make_unique<Acceptor>(
      std::move(listener), Expected{rank, size, opt.comm_id, opt.token}, allowlist);
  std::vector<Member> roster;
  try {
    roster = exchange_roster(store, rank, size, mine, deadline, opt.comm_id);
  } catch (const Error& e) {
    acceptor->stop(e.what());
    throw;
  }
  std::vector<Peer> peers(size);
  for (int r = 0; r < size; ++r) {
    Member& m = roster[static_cast<size_t>(r)];
    peers[r].host = m.host;
    peers[r].ip = m.ip;
    peers[r].port = m.port;
    peers[r].address = m.ip + ":" + std::to_string(m.port);
    if (nodes != nullptr) nodes->push_back(std::move(m.node));
  }
  return std::make_unique<TcpTransport>(
      rank, size, std::move(peers), std::move(acceptor),
      ConnectSettings{opt.comm_id, opt.token, opt.connect_timeout});
}

int TcpTransport::open_streams() const {
  int n = 0;
  for (int i : linked_) n += peers_[i].out.valid() + peers_[i].in.valid();
  return n;
}

void TcpTransport::adopt_arrivals_slow() {
  std::vector<std::pair<int, net::Fd>> arrived;
  try {
    acceptor_->take(arrived);
  } catch (const Error& e) {
    throw SystemError(op_name() + " on " + here() + ": accepting connections failed: " + e.what());
  }
  for (auto& [peer, fd] : arrived) {
    ++adopted_;
    peers_[peer].in = std::move(fd);
    link(peer);
  }
}

void TcpTransport::connect_out(int peer, const Deadline& deadline, int refusals) {
  Peer& p = peers_[peer];
  if (p.out.valid()) return;
  const std::string what = "rank " + std::to_string(rank_) + " connecting to " + peer_name(peer);
  try {
    p.out = net::connect_to_listener(p.ip, p.port, deadline, what, refusals);
  } catch (const TimeoutError& e) {
    throw TimeoutError(op_name() + ": " + e.what(), {peer});
  } catch (const PeerError& e) {
    // Every peer listens from before its address is published until it exits. One that
    // aborted may have opened a stream here to say why before it went: that reason, or
    // a dead peer.
    try {
      adopt_arrivals();
    } catch (const Error&) {
    }
    fail_closed(peer, e.what());
  } catch (const SystemError& e) {
    rlimit limit{};
    ::getrlimit(RLIMIT_NOFILE, &limit);
    throw ConfigError(op_name() + ": " + e.what() + " (RLIMIT_NOFILE " +
                      std::to_string(limit.rlim_cur) + ", with " + std::to_string(open_streams()) +
                      " streams open to peers): raise ulimit -n, or start fewer ranks");
  }
  Hello h;
  h.from_rank = rank_;
  h.to_rank = peer;
  h.size = size_;
  h.comm_id = settings_.comm_id;
  h.nonce = auth::make_nonce();
  std::string refusal;
  try {
    client_handshake(p.out.get(), h, settings_.token, deadline, what, &refusal);
  } catch (const TimeoutError& e) {
    p.out.reset();
    throw TimeoutError(op_name() + ": " + e.what() + " (" + peer_name(peer) +
                           " did not complete the handshake in time)",
                       {peer});
  } catch (const Error& e) {
    p.out.reset();
    // A peer that aborted or closed says so in its refusal (Acceptor::refuse_all).
    const size_t prefix = sizeof kAbortedRefusal - 1;
    if (refusal.compare(0, prefix, kAbortedRefusal) == 0) {
      fail_peer(peer, peer_name(peer) + " aborted: " + refusal.substr(prefix));
    }
    if (refusal == kClosedRefusal) {
      fail_peer(peer, peer_name(peer) + " left the communicator" +
                          (p.recvs.empty() ? std::string(" while this rank was to send to it")
                                           : " while this rank expected " +
                                                 std::to_string(p.recvs.front().want.length) +
                                                 " bytes from it") +
                          " (did the ranks issue different operations?)");
    }
    fail_peer(peer, e.what());
  }
  tune_loopback_stream(p.out.get());
  link(peer);
}

}  // namespace chorus::transport::tcp
