// The TCP transport: non-blocking sockets, one per direction between two ranks that
// exchange data, each opened when it is first used (mesh.cc), to addresses gathered
// through the store at creation (roster.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

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
  std::string node_id;         // this rank's node (topology.h local_node_id), in the roster
  std::chrono::milliseconds connect_timeout{kDefaultConnectTimeout};
  // Addresses whose connections this rank accepts. Null: every address. The
  // communicator passes the one of CommOptions::allowlist_file.
  std::shared_ptr<const net::AllowList> allowlist;
};

// Defined in mesh.cc; the transport it returns is TcpTransport (tcp_transport_impl.h).
//
// Collective: every rank of the group calls it with the same store (already scoped to
// the communicator) and options. Returns once every rank's address is known
// (exchange_roster, roster.h), with no connection open: a rank connects to a peer when
// it first sends to it, authenticated by the same handshake, and accepts the peer's
// connections from before it publishes its address until the transport closes
// (acceptor.h). `nodes`, when given, receives every rank's node id, in rank order.
// Throws TimeoutError naming the ranks that never published, ConfigError for a bad
// allow-list, for a world size that differs between ranks (every rank fails at once,
// naming both sizes and their ranks) and, before anything is published, for a
// descriptor limit that cannot hold the streams of 64 peers (the soft limit is raised
// towards what every peer would take, up to the hard one). Connections from addresses
// the allow-list does not name, and ones that fail the handshake or stay silent past
// theirs, are closed and logged with their address.
std::unique_ptr<Transport> connect_mesh(Store& store, int rank, int size,
                                        const TcpOptions& options,
                                        std::vector<std::string>* nodes = nullptr);

// Defined in mesh.cc, which calls it on every rank's sending stream (`out`, peer.h).
// Sets a connected socket whose peer is on this host (net::same_host) up for the
// loopback device: congestion control reno and a fixed send buffer (mesh.cc says why).
// Returns false, changing nothing, for any other socket. Best effort: a setting the
// kernel refuses is left as it was.
bool tune_loopback_stream(int fd);

}  // namespace chorus::transport::tcp
