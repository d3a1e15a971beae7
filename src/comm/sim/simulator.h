// The simulator: runs the real algorithms of src/comm/algorithms for up to thousands
// of ranks in this process, in virtual time, over a modelled network
// (docs/simulator.md). Each rank's body is a fiber on the calling thread (engine.h),
// its transport a SimTransport whose messages take the times of the LinkModel
// (network.h); the bytes are really copied, so results can be checked.
//
//   sim::Simulator s;
//   sim::Result r = s.run(1024, 8, sim::LinkModel{}, [&](sim::RankEnv& env) {
//     algorithms::allreduce_ring(env.begin("allreduce", DataType::kFloat32, true,
//                                          ReduceOp::kSum, n), in, out, n);
//   });
//   r.time  // simulated seconds until the last rank returned
//
// Memory: a rank costs its touched stack pages (a few KiB of Options::stack_bytes),
// its RankEnv (scratch grows to what its algorithms ask for) and its buffers; streams
// are made on first use, one per ordered pair that talks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "chorus/defaults.h"
#include "chorus/error.h"
#include "chorus/topology.h"
#include "chorus/types.h"
#include "comm/algorithms/context.h"
#include "comm/sim/engine.h"
#include "comm/sim/network.h"

namespace chorus::sim {

// What a rank's body gets: its transport, its place, and contexts for the algorithms.
class RankEnv {
 public:
  RankEnv(Engine& engine, int rank);

  transport::Transport& transport() { return t_; }
  int rank() const { return rank_; }
  int size() const { return e_.size(); }
  // This rank's view of the nodes (consecutive ranks, ranks_per_node each; the last
  // node may be smaller). Built on first use: it holds two vectors of `size` ints.
  const Topology& topology();
  // Simulated seconds now (this rank's clock while it runs).
  double now() const { return e_.now(); }

  // Begins operation `name` (a collective_name()) as the communicator does: the next
  // sequence number, its OpInfo on the transport, and a Context with the reduce
  // kernels (charged at LinkModel::reduce_rate), this rank's scratch and topology.
  // `count` and `root` go into the signature that receivers compare.
  algorithms::Context begin(const char* name, DataType dtype, bool reduces, ReduceOp op,
                            uint64_t count, int root = -1,
                            size_t segment_bytes = kDefaultSegmentBytes);
  // The thresholds of the operations begun from now on (must outlive them).
  void use_tuning(const algorithms::Tuning& tuning) { tuning_ = &tuning; }

 private:
  Engine& e_;
  int rank_;
  SimTransport t_;
  std::optional<Topology> topology_;
  algorithms::Scratch scratch_;
  uint64_t seq_ = 0;
  const algorithms::Tuning* tuning_ = &algorithms::kDefaultTuning;
};

struct Result {
  double time = 0;                  // simulated seconds until the last rank returned
  std::vector<double> rank_time;    // per rank: when its body returned
  std::vector<RankTraffic> traffic;  // per rank
  uint64_t messages = 0, bytes = 0;  // sent by all ranks
  uint32_t max_peers = 0;            // the most distinct peers of one rank
  uint32_t max_streams = 0;          // the most one-way streams of one rank (RankTraffic)
  uint64_t events = 0;               // scheduler events
  size_t streams = 0;                // ordered pairs that talked
};

// Thrown by Simulator::run when ranks failed: what() is a headline (a deadlock or
// limit, if that was the cause) and every failed rank's message, root causes first.
class SimulationError : public Error {
 public:
  SimulationError(ErrorKind kind, const std::string& message, std::vector<int> ranks)
      : Error(kind, message), ranks_(std::move(ranks)) {}
  const std::vector<int>& failed_ranks() const { return ranks_; }

 private:
  std::vector<int> ranks_;
};

class Simulator {
 public:
  explicit Simulator(Options options = {}) : options_(options) {}

  // Runs body(env) on `ranks` ranks in nodes of `ranks_per_node` consecutive ranks.
  // Throws SimulationError when a rank's body throws (its peers then fail too), on a
  // deadlock and past the limits of Options.
  Result run(int ranks, int ranks_per_node, const LinkModel& model,
             const std::function<void(RankEnv&)>& body) const;

 private:
  Options options_;
};

// "1.5 us", "2.03 ms", "1.2 s": simulated times for people.
std::string format_time(double seconds);

}  // namespace chorus::sim
