#include "chorus/error.h"
#include "chorus/store.h"
#include "comm/common/settings.h"

namespace chorus {
namespace {

// Owns the server so that it is built before, and outlives, the client connection
// of the store that hosts it (bases are constructed first and destroyed last).
struct ServerOwner {
  std::unique_ptr<TcpStoreServer> server;
};

// The store of rank 0 when no launcher hosts one: a client of its own server.
class HostingTcpStore : private ServerOwner, public TcpStore {
 public:
  HostingTcpStore(std::unique_ptr<TcpStoreServer> server, std::chrono::milliseconds connect_timeout)
      : ServerOwner{std::move(server)},
        TcpStore(ServerOwner::server->host(), ServerOwner::server->port(), connect_timeout) {}
};

}  // namespace

std::shared_ptr<Store> store_from_env(int rank) {
  return store_from_env(rank, settings::connect_timeout());
}

std::shared_ptr<Store> store_from_env(int rank, std::chrono::milliseconds connect_timeout) {
  if (rank < 0) {
    throw InvalidArgumentError("store_from_env: rank " + std::to_string(rank) + " is negative");
  }
  std::string host = settings::store_addr();
  uint16_t port = settings::store_port();
  std::shared_ptr<Store> store;
  if (rank == 0 && !settings::store_hosted()) {
    // Bound to the store address itself, so the other ranks reach it where they look for it.
    auto server = std::make_unique<TcpStoreServer>(host, port);
    store = std::make_shared<HostingTcpStore>(std::move(server), connect_timeout);
  } else {
    store = std::make_shared<TcpStore>(host, port, connect_timeout);
  }
  store->set_timeout(connect_timeout);
  return store;
}

}  // namespace chorus
