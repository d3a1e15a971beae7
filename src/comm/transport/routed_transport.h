// The transport of a communicator whose node's ranks share memory: every message goes
// by its peer, to a rank of this node through the node's transport (shm/
// shm_transport.h), to any other through the network's (tcp/). Algorithms, the issuing
// calls' send and recv, and the views of subset_transport.h see one Transport and never
// choose.
//
// Requests are those of the part that carries them (the peer says which). wait() on a
// request drives only its part while the other has nothing pending, which is the case
// for every operation whose peers all sit on one side; otherwise it drives both in
// turns of kTurn, so that a ring whose left neighbour is local and whose right is
// remote moves both ways. Errors are those of the parts; abort() and close() tell the
// node's ranks first (at once through shared memory), then the others.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "comm/transport/transport.h"

namespace chorus::transport {

class RoutedTransport final : public Transport {
 public:
  // `network` reaches every rank; `node` the ranks marked in `on_node` (indexed by rank),
  // this one's included. Both number ranks alike.
  RoutedTransport(std::unique_ptr<Transport> network, std::unique_ptr<Transport> node,
                  std::vector<bool> on_node);
  ~RoutedTransport() override;

  // How long one part is driven before the other's turn, while both have work pending.
  static constexpr std::chrono::microseconds kTurn{200};

  int rank() const override { return network_->rank(); }
  int size() const override { return network_->size(); }
  const std::string& host_of(int rank) const override { return network_->host_of(rank); }
  void begin(const OpInfo& op) override;
  Request isend(int peer, const void* data, size_t len) override;
  Request irecv(int peer, void* data, size_t len) override;
  // Asks each part about its own peers; in turns of kTurn while both have some.
  Arrival probe(const std::vector<int>& peers, std::chrono::steady_clock::time_point until,
                bool shared_claim) override;
  Request irecv_message(int peer, void* data, size_t len, const Signature& sig) override {
    return part(peer).irecv_message(peer, data, len, sig);
  }
  void wait(const Request& request) override;
  bool test(const Request& request) const override { return part(request.peer).test(request); }
  void wait_all() override;
  bool wait_for(const Request* request, std::chrono::microseconds slice) override;
  void interrupt(const std::string& reason) override;
  void abort(const std::string& reason) override;
  void close() override;

 private:
  Transport& part(int peer) const;
  bool drive(const Request* request, std::chrono::steady_clock::time_point until);

  std::unique_ptr<Transport> network_, node_;
  std::vector<bool> on_node_;
};

}  // namespace chorus::transport
