// The TCP transport: a full mesh of non-blocking sockets, one per pair of ranks,
// set up through addresses published in the store.
#pragma once

#include <memory>
#include <string>

#include "chorus/store.h"
#include "comm/common/deadline.h"
#include "comm/transport/transport.h"

namespace chorus::transport::tcp {

struct TcpOptions {
  std::string listen_address;  // IP to listen on and publish
  std::string comm_id;         // checked in the handshake
  std::string token;           // job token, checked in the handshake
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(120)};
};

// Collective: every rank of the group calls it with the same store (already scoped to
// the communicator) and options. Returns once this rank is connected to every other.
// Throws TimeoutError naming the ranks that never published or connected, PeerError
// when a peer refuses the handshake (naming the field).
std::unique_ptr<Transport> connect_mesh(Store& store, int rank, int size,
                                        const TcpOptions& options);

}  // namespace chorus::transport::tcp
