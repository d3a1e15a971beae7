// Drives the algorithms of src/comm/algorithms on the ranks of a FakeHub the way the
// communicator does (src/comm/communicator/communicator.cc, CommunicatorImpl::run): every
// operation gets the next sequence number, begin() on the transport with its OpInfo,
// and a Context with the reduce kernels of comm/reduce/reduce.h, the rank's own
// scratch memory (kept across operations, as the communicator keeps it) and the
// rank's topology. No shared-memory group: the algorithms see only the transport.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>

#include "chorus/defaults.h"
#include "chorus/topology.h"
#include "chorus/types.h"
#include "comm/algorithms/context.h"
#include "fake_transport.h"

namespace chorus::test {

class RankContext {
 public:
  // `topology`: this rank's view (a single node of every rank when defaulted).
  RankContext(transport::Transport& t, Topology topology);
  explicit RankContext(transport::Transport& t);

  // Begins operation `name` ("allreduce": a collective_name()) and returns
  // its context. `op` is used only when `reduces`; count and root go into the
  // signature the receivers compare.
  algorithms::Context begin(const char* name, DataType dtype, bool reduces, ReduceOp op,
                            uint64_t count, int root = -1,
                            size_t segment_bytes = kDefaultSegmentBytes);

  int rank() const { return t_.rank(); }
  int size() const { return t_.size(); }

  // The thresholds of the operations begun from now on (must outlive them); the
  // measured defaults until set.
  void use_tuning(const algorithms::Tuning& tuning) { tuning_ = &tuning; }

 private:
  transport::Transport& t_;
  Topology topology_;
  algorithms::Scratch scratch_;
  uint64_t seq_ = 0;
  const algorithms::Tuning* tuning_ = &algorithms::kDefaultTuning;
};

// The deadline of every operation begun by RankContext: far above any healthy
// operation here, and below run_ranks' own deadline, so a hang ends in TimeoutError.
inline constexpr std::chrono::milliseconds kOperationTimeout{120000};

// Runs body(transport) for every rank of `hub` on its own thread and joins them. A
// rank that throws aborts its transport, so that the others fail at once instead of at
// their deadline; the failures are rethrown in the calling thread as test::RankFailure.
void run_ranks(FakeHub& hub, const std::function<void(FakeTransport&)>& body);

// CHORUS_SWEEP=quick (scripts/sanitize.sh): the sweeps' smaller variant.
bool quick_sweep();

}  // namespace chorus::test
