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
  const NicClock idle{0, model.nic_burst};
  egress_.assign(nodes, idle);
  ingress_.assign(nodes, idle);
}

double Network::pass(NicClock& nic, size_t bytes, double start, double line) const {
  const double rate = model_.nic_bandwidth, burst = model_.nic_burst, n = static_cast<double>(bytes);
  start = std::max(start, nic.free);
  double tokens = std::min(burst, nic.tokens + (start - nic.free) * rate), took;
  if (line > 0 && line <= rate) {  // no faster than the refill: the bucket only fills
    took = n / line;
    tokens = std::min(burst, tokens + (rate - line) * took);
  } else {
    // At the line while tokens last (they drain at line - rate; all at once when the
    // line is unlimited), then at the rate with the bucket empty.
    const double drain = line > 0 ? line - rate : 0;
    const double fast = line > 0 ? std::min(n, tokens * line / drain) : std::min(n, tokens);
    took = (line > 0 ? fast / line : 0) + (n - fast) / rate;
    tokens = fast < n ? 0 : tokens - (line > 0 ? drain * fast / line : fast);
  }
  nic.free = start + took;
  nic.tokens = tokens;
  return nic.free;
}

Departure Network::send(int from, int to, size_t bytes, double now, StreamClock& stream) {
  const int a = node_of(from), b = node_of(to);
  Departure d;
  if (a == b) {
    const double start = std::max(now, stream.free);
    d.left = start + transfer(bytes, model_.intra_beta);
    d.delivered = d.left + model_.intra_alpha;
  } else if (model_.nic_burst > 0 && model_.nic_bandwidth > 0) {
    const double start = std::max({now, stream.free, egress_[a].free});
    d.left = pass(egress_[a], bytes, start, model_.inter_beta);
    const double took = d.left - start;
    const double in_end = pass(ingress_[b], bytes, start + model_.inter_alpha,
                               took > 0 ? static_cast<double>(bytes) / took : model_.inter_beta);
    d.delivered = std::max(d.left + model_.inter_alpha, in_end);
  } else {
    const double nic = model_.nic_bandwidth;
    const double start = std::max({now, stream.free, nic > 0 ? egress_[a].free : 0.0});
    d.left = start + transfer(bytes, slower(model_.inter_beta, nic));
    d.delivered = d.left + model_.inter_alpha;
    if (nic > 0) {
      egress_[a].free = start + transfer(bytes, nic);
      const double in_start = std::max(start + model_.inter_alpha, ingress_[b].free);
      ingress_[b].free = in_start + transfer(bytes, nic);
      d.delivered = std::max(d.delivered, ingress_[b].free);
    }
  }
  d.delivered = std::max(d.delivered, stream.last_delivery);
  stream.free = d.left;
  stream.last_delivery = d.delivered;
  return d;
}

}  // namespace chorus::sim
