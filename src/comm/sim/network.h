// The simulator's network: when a message leaves its sender and when it is delivered,
// in virtual seconds. Pure arithmetic over the link model; no scheduling.
//
// Model (LinkModel, simulator.h): nodes of consecutive ranks. A message of n bytes
// from rank s to rank d, posted at time t:
//   * Every ordered pair (s, d) is a stream that carries one message at a time at the
//     pair's bandwidth beta (intra_beta within a node, inter_beta between nodes): a
//     message starts when the stream's previous one has left, and takes n / beta.
//   * Between nodes, the message also passes the sender node's NIC (egress) and the
//     receiver node's NIC (ingress), each a FIFO resource of nic_bandwidth bytes per
//     second shared by all of that node's inter-node messages in that direction: it
//     occupies each for n / nic_bandwidth, in the order the messages were posted (an
//     approximation: a real ingress serves messages in the order they arrive). A
//     message's own rate is min(beta, nic_bandwidth).
//   * Delivery: the last byte arrives alpha (intra_alpha or inter_alpha) after it left,
//     and never before the stream's previous message (streams are ordered).
// So a lone message takes alpha + n / min(beta, nic) between nodes and
// alpha + n / intra_beta within one: the alpha-beta model.
//
// With nic_burst > 0 each NIC direction is instead a token bucket, as Linux's tbf
// shapes a link: nic_burst bytes of tokens, refilled at nic_bandwidth. A message
// passes at inter_beta (the line) while the bucket holds tokens, which drain at
// inter_beta - nic_bandwidth, and at nic_bandwidth once it is empty; still one message
// at a time per NIC, in the order posted. The receiver's bucket sees the message at the
// rate it left the sender's. So a message shorter than the tokens a quiet link has
// saved crosses at the line's speed, while a long run of traffic averages
// nic_bandwidth.
#pragma once

#include <cstddef>
#include <vector>

namespace chorus::sim {

// Times in seconds, rates in bytes per second; a rate of 0 means unlimited.
struct LinkModel {
  double intra_alpha = 1e-6;    // latency of one message within a node (shared memory)
  double intra_beta = 10e9;     // bandwidth of one stream within a node
  double inter_alpha = 10e-6;   // latency of one message between nodes (tcp, one switch)
  double inter_beta = 5e9;      // bandwidth of one stream between nodes (40 Gb/s)
  double nic_bandwidth = 12.5e9;  // per node and direction (100 GbE); 0: unlimited
  // Reductions (Context::reduce/reduce_many, charged by the simulator): output bytes
  // per second per rank; 0: reductions take no simulated time. Copies are free.
  double reduce_rate = 8e9;
  // Bytes of each NIC direction's token bucket (tbf's burst; needs nic_bandwidth > 0 and
  // inter_beta above it to matter); 0: no bucket, the NIC passes nic_bandwidth.
  double nic_burst = 0;
};

// A stream's timing state (see the model above).
struct StreamClock {
  double free = 0;           // when the stream's last message has left the sender
  double last_delivery = 0;  // when its last message was delivered
};

struct Departure {
  double left = 0;       // the last byte left the sender
  double delivered = 0;  // the last byte reached the receiver
};

// One direction of a node's NIC.
struct NicClock {
  double free = 0;    // when its last message has passed
  double tokens = 0;  // with a bucket: the tokens left at `free`
};

class Network {
 public:
  Network(const LinkModel& model, int ranks, int ranks_per_node);

  int node_of(int rank) const { return rank / ranks_per_node_; }
  int nodes() const { return static_cast<int>(egress_.size()); }

  // The times of a message of `bytes` from `from` to `to` posted at `now` on the
  // stream whose clock is `stream`; reserves the stream and the NICs it passes.
  Departure send(int from, int to, size_t bytes, double now, StreamClock& stream);

 private:
  // With a bucket: when `bytes` that reach `nic` from `start` at `line` bytes per second
  // (0: unlimited) have passed it; reserves it.
  double pass(NicClock& nic, size_t bytes, double start, double line) const;

  LinkModel model_;
  int ranks_per_node_;
  std::vector<NicClock> egress_, ingress_;  // per node
};

}  // namespace chorus::sim
