// connect_mesh (tcp_transport.h): the start-up of the tcp mesh. Checks the descriptor
// limit, starts the acceptor (acceptor.h) on a fresh listening socket, exchanges
// addresses and world sizes through the store, connects to every peer with the
// handshake (handshake.h), sets the streams to ranks of this host up for loopback
// (tune_loopback_stream), and hands the streams to a TcpTransport
// (tcp_transport_impl.h).
#include "comm/transport/tcp/tcp_transport.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "chorus/error.h"
#include "comm/common/allowlist.h"
#include "comm/common/auth.h"
#include "comm/common/logging.h"
#include "comm/common/socket.h"
#include "comm/store/paged.h"
#include "comm/transport/tcp/acceptor.h"
#include "comm/transport/tcp/handshake.h"
#include "comm/transport/tcp/tcp_transport_impl.h"

namespace chorus::transport::tcp {
namespace {

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
    values = store::pages::wait_and_get(store, keys, deadline, [&] {
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

std::unique_ptr<Transport> connect_mesh(Store& store, int rank, int size, const TcpOptions& opt) {
  Deadline deadline(opt.connect_timeout);
  // Too few descriptors fail before this rank publishes an address.
  std::shared_ptr<const net::AllowList> allowlist = opt.allowlist;
  if (!allowlist) allowlist = std::make_shared<const net::AllowList>();
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
  for (int r = 0; r < size; ++r) {
    peers[r].in = std::move(in[r]);
    if (peers[r].out.valid()) tune_loopback_stream(peers[r].out.get());
  }
  return std::make_unique<TcpTransport>(rank, size, std::move(peers));
}

}  // namespace chorus::transport::tcp
