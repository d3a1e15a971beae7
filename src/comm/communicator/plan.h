// One plan per call. An issued collective is validated into a Call; plan_for()
// (plan.cc) decides, in one place, what runs: which algorithm, on which buffers (the
// segment path, or the direct path on node-shared buffers), and whether it starts on
// the calling thread at issue or waits in the queue. The algorithms themselves are
// rows of one table (algorithm_table.cc): per collective and algorithm, its body, its
// cost formula and what it can run at issue. collectives.cc validates, plans and issues.
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <vector>

#include "chorus/communicator.h"
#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/context.h"
#include "comm/communicator/cost_model.h"
#include "comm/shared/memory_file.h"

namespace chorus::communicator {

// How an operation is run on the progress thread: it gets a context whose dtype and
// reduction are already set.
using OpBody = std::function<void(const algorithms::Context&)>;

// One issued collective, validated: what the plan reads and what the body runs on.
struct Call {
  Collective what = Collective::kBarrier;
  const void* send = nullptr;
  void* recv = nullptr;
  // Elements: allreduce, broadcast, reduce: the buffer; allgather, gather, scatter,
  // alltoall: one rank's block; reduce_scatter: the result; allgatherv: this rank's.
  size_t count = 0;
  size_t elem = 1;  // bytes of one element (the dtype's)
  int root = -1;
  // What the choice of algorithm reads (Communicator::algorithm_for()'s `bytes`).
  size_t bytes = 0;
  // The spans the direct path looks up in node-shared memory: send (none off the
  // broadcast's root) and recv.
  size_t in_bytes = 0, out_bytes = 0;
  // allgatherv: recv_counts and their offsets; alltoallv: all four.
  std::vector<size_t> send_counts, send_displs, recv_counts, recv_displs;
  // The direct path's node-shared spans (Plan::direct), found by plan_for().
  shared::SharedRef in_ref, out_ref;
  // The hierarchical rows: what runs between and inside nodes, set by plan_for().
  algorithms::HierarchicalChoice hierarchical;
};

// The automatic choice of `c` on `bytes` among its rows over tcp, and its hierarchical
// row where `hierarchical` (the shape runs it and nothing is forced): the cheapest by
// the rows' formulas (cost_model.h; cheapest() and its measured two-rank cut-off),
// except that broadcast and reduce take the binomial tree up to
// Tuning::tree_limit_bytes and, on groups of up to Tuning::tree_limit_max_ranks, the
// chain beyond (the measured rule), that on those groups gather and scatter are direct
// and reduce_scatter is recursive halving up to Tuning::reduce_scatter_halving_max_bytes
// and the ring beyond (measured too), and that collectives without formulas (allgatherv,
// alltoallv) take their one row over tcp. A function of the shape and the parameters
// only: Communicator::algorithm_for() asks it once shared memory is ruled out, and the
// tests sweep it over shapes no test can start (1,024 to 16,384 ranks).
Algorithm tcp_choice(Collective c, size_t bytes, const Shape& shape, const CostParams& p, bool hierarchical);
// The rows of `c` with a cost formula that run over tcp, with its hierarchical and shm
// rows where asked for, in table order.
std::vector<Algorithm> costed_rows(Collective c, bool hierarchical, bool shm);

// What runs inside a hierarchical call (plan_for() and the algorithm tests use it):
// - between nodes, the allreduce of this rank's block: on two nodes by the cut-offs
//   measured there (Tuning::hier_allreduce_small_bytes: recursive doubling,
//   hier_allreduce_halving_bytes: halving-doubling, the ring beyond), on more by the
//   cost model (cost::cheapest_tcp_allreduce: the ring's 2(nodes - 1) latencies against
//   log2 nodes);
// - the broadcast (binomial tree or chain): on groups of up to
//   Tuning::tree_limit_max_ranks by hier_broadcast_small_bytes, on larger ones by the
//   model;
// - allreduces of more than hier_chunk_bytes pipelined in chunks of that size (at most
//   hier_max_chunks of them), where the exchange between nodes is the ring: always on
//   two nodes, on more where the model chooses the ring.
// A function of the call, the shape and the topology only, so that every rank given
// the same shape makes the same choice (the allreduce between nodes the same among the
// ranks of one local rank, which reduce blocks of one size).
algorithms::HierarchicalChoice hierarchical_choice(const CostParams& p, const Shape& shape, const Topology& topology,
                                                   size_t count, size_t elem);
// The shape of ctx's group as the cost model sees it (its topology, whether its node
// shares a segment, its pipelining segment).
Shape shape_of(const algorithms::Context& ctx);
// The hierarchical allreduce and broadcast with that choice, for ctx's tuning, topology
// and shape and the model's built-in parameters: the algorithms as a communicator runs
// them, for programs that run them without one (the algorithm tests, the simulator's).
void planned_allreduce_hierarchical(const algorithms::Context& ctx, const void* in, void* out, size_t count);
void planned_broadcast_hierarchical(const algorithms::Context& ctx, void* buf, size_t count, int root);

// What a row can run at issue on the calling thread: true when it finished the
// operation, or false after setting `rest` to the body that finishes it from the queue.
using AtIssue = bool (*)(const algorithms::Context& ctx, const Call& call, OpBody& rest);

// One algorithm of one collective: a row of the table (algorithm_table.cc).
struct AlgorithmEntry {
  Collective collective;
  Algorithm algorithm;
  // Predicted time (cost_model.h) where the choice is by cost; null where a measured
  // rule in plan.cc names the algorithm instead.
  cost::Formula cost;
  // The body, on the progress thread (or a caller's wait()), on the call's own buffers.
  void (*run)(const algorithms::Context& ctx, const Call& call);
  // Optional: the start of `run` at issue (the inline path), for calls plan_for()
  // finds small enough.
  AtIssue at_issue = nullptr;
  // Optional: the direct path, on node-shared buffers (call.in_ref, call.out_ref), and
  // its start at issue.
  void (*run_shared)(const algorithms::Context& ctx, const Call& call) = nullptr;
  AtIssue shared_at_issue = nullptr;
};

// Every row, and one algorithm's row for a collective (null: none).
std::span<const AlgorithmEntry> algorithm_table();
const AlgorithmEntry* find_entry(Collective collective, Algorithm algorithm);

// Where a call runs.
enum class Start : uint8_t {
  kQueued,   // in the queue, in issue order, on the progress thread or a waiting caller
  kAtIssue,  // attempted on the calling thread when the engine is idle (entry's at_issue)
};

// The decision for one call.
struct Plan {
  const AlgorithmEntry* entry = nullptr;
  bool direct = false;  // entry->run_shared on call.in_ref / call.out_ref
  Start start = Start::kQueued;

  Algorithm algorithm() const { return entry->algorithm; }
  // The body to queue: the whole operation.
  OpBody body(Call call) const;
  // The attempt at issue (start == kAtIssue).
  AtIssue at_issue() const { return direct ? entry->shared_at_issue : entry->at_issue; }
};

}  // namespace chorus::communicator
