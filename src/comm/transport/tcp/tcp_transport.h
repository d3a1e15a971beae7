// The TCP transport: a full mesh of non-blocking sockets, two per pair of ranks (one
// per direction), set up through addresses published in the store.
#pragma once

#include <memory>
#include <string>

#include "chorus/store.h"
#include "comm/common/deadline.h"
#include "comm/transport/transport.h"

namespace chorus::net {
class AllowList;
}

namespace chorus::transport::tcp {

struct TcpOptions {
  std::string listen_address;  // IP to listen on and publish
  std::string comm_id;         // checked in the handshake
  std::string token;           // job token, proven (never sent) in the handshake
  std::chrono::milliseconds connect_timeout{kDefaultConnectTimeout};
  // Addresses whose connections this rank accepts. Null: every address. The
  // communicator passes the one of CommOptions::allowlist_file.
  std::shared_ptr<const net::AllowList> allowlist;
};

// Defined in mesh.cc; the transport it returns is TcpTransport (tcp_transport_impl.h).
//
// Collective: every rank of the group calls it with the same store (already scoped to
// the communicator) and options. Returns once this rank is connected to every other.
// Throws TimeoutError naming the ranks that never published or connected, PeerError
// when a peer refuses the handshake (naming the field, or the job token), ConfigError
// for a bad allow-list, for a world size that differs between ranks (every rank fails
// at once, naming both sizes and their ranks) and, before anything is published, for
// a world size RLIMIT_NOFILE cannot hold (2 descriptors per peer, and up to
// kMaxUnauthenticated more during start-up; the soft limit is raised to the hard one
// where that is enough). Connections from addresses the allow-list does not name, and
// ones that fail the handshake or stay silent past theirs, are closed and logged with
// their address; this rank accepts, all connections at once (acceptor.h), from
// before it publishes its address until every other rank has connected to it.
std::unique_ptr<Transport> connect_mesh(Store& store, int rank, int size,
                                        const TcpOptions& options);

// Defined in mesh.cc, which calls it on every rank's sending stream (`out`, peer.h).
// Sets a connected socket whose peer is on this host (net::same_host) up for the
// loopback device: congestion control reno and a fixed send buffer (mesh.cc says why).
// Returns false, changing nothing, for any other socket. Best effort: a setting the
// kernel refuses is left as it was.
bool tune_loopback_stream(int fd);

}  // namespace chorus::transport::tcp
