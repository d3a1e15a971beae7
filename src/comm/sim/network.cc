#include "comm/sim/network.h"

#include <algorithm>

namespace chorus::sim {

namespace {

// Seconds to move `bytes` at `rate` (0: unlimited).
double transfer(size_t bytes, double rate) { return rate > 0 ? static_cast<double>(bytes) / rate : 0; }

// The smaller of two rates, 0 meaning unlimited.
double slower(double a, double b) {
  if (a <= 0) return b;
  if (b <= 0) return a;
  return std::min(a, b);
}

}  // namespace

Network::Network(const LinkModel& model, int ranks, int ranks_per_node)
    : model_(model), ranks_per_node_(ranks_per_node) {
  const int nodes = (ranks + ranks_per_node - 1) / ranks_per_node;
  egress_free_.assign(nodes, 0);
  ingress_free_.assign(nodes, 0);
}

Departure Network::send(int from, int to, size_t bytes, double now, StreamClock& stream) {
  const int a = node_of(from), b = node_of(to);
  Departure d;
  if (a == b) {
    const double start = std::max(now, stream.free);
    d.left = start + transfer(bytes, model_.intra_beta);
    d.delivered = d.left + model_.intra_alpha;
  } else {
    const double nic = model_.nic_bandwidth;
    const double start = std::max({now, stream.free, nic > 0 ? egress_free_[a] : 0.0});
    d.left = start + transfer(bytes, slower(model_.inter_beta, nic));
    d.delivered = d.left + model_.inter_alpha;
    if (nic > 0) {
      egress_free_[a] = start + transfer(bytes, nic);
      const double in_start = std::max(start + model_.inter_alpha, ingress_free_[b]);
      ingress_free_[b] = in_start + transfer(bytes, nic);
      d.delivered = std::max(d.delivered, ingress_free_[b]);
    }
  }
  d.delivered = std::max(d.delivered, stream.last_delivery);
  stream.free = d.left;
  stream.last_delivery = d.delivered;
  return d;
}

}  // namespace chorus::sim
