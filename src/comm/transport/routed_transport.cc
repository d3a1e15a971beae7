#include "comm/transport/routed_transport.h"

#include <stdexcept>
#include <string>

namespace chorus::transport {

using Clock = std::chrono::steady_clock;

RoutedTransport::RoutedTransport(std::unique_ptr<Transport> network, std::unique_ptr<Transport> node,
                                 std::vector<bool> on_node)
    : network_(std::move(network)), node_(std::move(node)), on_node_(std::move(on_node)) {
  if (on_node_.size() != static_cast<size_t>(network_->size())) {
    throw std::logic_error("RoutedTransport: " + std::to_string(on_node_.size()) +
                           " routes for " + std::to_string(network_->size()) + " ranks");
  }
}

RoutedTransport::~RoutedTransport() = default;

Transport& RoutedTransport::part(int peer) const {
  const bool node = peer >= 0 && static_cast<size_t>(peer) < on_node_.size() && on_node_[peer];
  return node ? *node_ : *network_;
}

void RoutedTransport::begin(const OpInfo& op) {
  network_->begin(op);
  node_->begin(op);
}

Request RoutedTransport::isend(int peer, const void* data, size_t len) {
  return part(peer).isend(peer, data, len);
}

Request RoutedTransport::irecv(int peer, void* data, size_t len) {
  return part(peer).irecv(peer, data, len);
}

Arrival RoutedTransport::probe(const std::vector<int>& peers, Clock::time_point until, bool shared_claim) {
  std::vector<int> local, remote;
  for (int peer : peers) (&part(peer) == node_.get() ? local : remote).push_back(peer);
  if (remote.empty()) return node_->probe(local, until, shared_claim);
  if (local.empty()) return network_->probe(remote, until, shared_claim);
  while (true) {
    // Without waiting first, so that neither part's arrivals wait out the other's turn.
    Arrival a = node_->probe(local, Clock::now(), shared_claim);
    if (a.peer >= 0) return a;
    const auto now = Clock::now();
    if (now >= until) return a;
    a = network_->probe(remote, std::min(until, now + kTurn), shared_claim);
    if (a.peer >= 0) return a;
    a = node_->probe(local, std::min(until, Clock::now() + kTurn), shared_claim);
    if (a.peer >= 0 || Clock::now() >= until) return a;
  }
}

void RoutedTransport::wait(const Request& request) { drive(&request, Clock::time_point::max()); }

void RoutedTransport::wait_all() { drive(nullptr, Clock::time_point::max()); }

bool RoutedTransport::wait_for(const Request* request, std::chrono::microseconds slice) {
  return drive(request, Clock::now() + slice);
}

bool RoutedTransport::drive(const Request* request, Clock::time_point until) {
  constexpr std::chrono::microseconds kNoWait{0};
  while (true) {
    // One pass over each part, without waiting: whether it has anything pending.
    const bool node_idle = node_->wait_for(nullptr, kNoWait);
    const bool network_idle = network_->wait_for(nullptr, kNoWait);
    if (request != nullptr ? test(*request) : node_idle && network_idle) return true;
    const auto now = Clock::now();
    if (now >= until) return false;
    const auto left = until == Clock::time_point::max()
                          ? std::chrono::microseconds::max()
                          : std::chrono::ceil<std::chrono::microseconds>(until - now);
    if (node_idle || network_idle) {
      // Only one part has work: it waits on its own, with no turns to take.
      Transport& busy = node_idle ? *network_ : *node_;
      if (left == std::chrono::microseconds::max()) {
        if (request != nullptr) busy.wait(*request);
        else busy.wait_all();
        return true;
      }
      return busy.wait_for(request, left);
    }
    Transport& own = request != nullptr ? part(request->peer) : *node_;
    Transport& other = &own == node_.get() ? *network_ : *node_;
    if (own.wait_for(request, std::min(kTurn, left))) {
      if (request != nullptr) return true;
    }
    other.wait_for(nullptr, std::min(kTurn, left));
  }
}

void RoutedTransport::interrupt(const std::string& reason) {
  node_->interrupt(reason);
  network_->interrupt(reason);
}

void RoutedTransport::abort(const std::string& reason) {
  node_->abort(reason);
  network_->abort(reason);
}

void RoutedTransport::close() {
  node_->close();
  network_->close();
}

}  // namespace chorus::transport
