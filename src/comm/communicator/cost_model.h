// Chooses an algorithm by predicted time: each algorithm's cost is latency (alpha, per
// message or per shared-memory phase) plus bytes over bandwidth (per transport), plus
// the bytes it reduces over the reduction speed, for the communicator's shape. The
// parameters default to what chorus-bench measured on a 2-core VM over loopback and
// /dev/shm; CHORUS_COST_MODEL sets them for other machines. The model also owns the
// table of every measured threshold (algorithms/tuning.h), which selection and the
// algorithms read. CHORUS_ALGO and CHORUS_TRANSPORT override the choice
// (communicator.cc).
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include "chorus/communicator.h"
#include "comm/algorithms/tuning.h"

namespace chorus::communicator {

struct CostParams {
  double tcp_alpha_us = 9.0;   // one message over tcp, including the operation's overhead
  double tcp_gbps = 2.5;       // tcp stream bandwidth, GB/s
  double shm_alpha_us = 1.5;   // one shared-memory phase (arrive + wait)
  double shm_gbps = 8.0;       // memcpy into or out of the segment, GB/s
  double reduce_gbps = 8.0;    // reduction of two streams into a third, GB/s of output
  // Every measured threshold: where the algorithms change path, chunk and piece sizes.
  // Selection and the algorithms (through Context::tuning) read them from here.
  algorithms::Tuning tuning;
};

// CHORUS_COST_MODEL: comma-separated key=value pairs overriding the defaults, keys
// tcp_alpha_us, tcp_gbps, shm_alpha_us, shm_gbps, reduce_gbps (positive numbers) and
// the fields of the tuning table by name (whole_bytes=16384: whole numbers of bytes, at
// least Tuning::kMinChunkBytes for the chunk sizes). Throws ConfigError on an unknown
// key or a bad value.
CostParams parse_cost_params(const std::string& text);

struct Shape {
  int size = 1;          // ranks
  int nodes = 1;
  int local_size = 1;    // ranks per node (uniform when hierarchical is possible)
  bool shm = false;      // the ranks of a node share a segment
  bool hierarchical = false;  // uniform, several nodes, several ranks per node
  size_t shm_chunk = 256 * 1024;  // bytes per shared-memory buffer
  size_t segment_bytes = kDefaultSegmentBytes;  // pipelining unit of the tcp rings and chains
};

// Predicted microseconds of `collective` on `bytes` (Call::bytes: for allgather and
// alltoall the whole result; reduce_scatter: the whole input; gather and scatter: one
// rank's block) with `algorithm`: the formula of its row in the
// algorithm table (algorithm_table.h); infinity where the row has none or the shape
// cannot run it. Defined with the table (algorithm_table.cc).
double predicted_us(Collective collective, Algorithm algorithm, size_t bytes, const Shape& shape,
                    const CostParams& p);

// Predicted microseconds of `collective` (allreduce, reduce_scatter, allgather,
// broadcast) on node-shared buffers, the direct path (include/chorus/shared_memory.h);
// infinity where the shape has no such path (several nodes, no shared memory, one rank).
double predicted_shared_us(Collective collective, size_t bytes, const Shape& shape,
                           const CostParams& p);

// The candidate with the lowest predicted time, and the measured cut-off of two ranks
// (Tuning::pair_rd_max_bytes). Defined with the table (algorithm_table.cc).
Algorithm cheapest(Collective collective, size_t bytes, const Shape& shape, const CostParams& p,
                   std::span<const Algorithm> candidates);

// The formulas the algorithm table names, one per collective and algorithm: predicted
// microseconds on `n` bytes (as predicted_us() counts them) for the shape, infinity
// where the shape cannot run the algorithm (shared memory off one node, hierarchical
// off a uniform shape of several nodes with several ranks each). On a uniform shape of
// several nodes the algorithms whose every rank sends to another node in the same step
// (recursive doubling and halving, Bruck's, the pairwise alltoall, the exchanges
// between nodes of the hierarchical calls) share the node's link among its ranks (tcp_gbps / local_size
// each); the others' formulas, and every formula on other shapes, do not model the
// link's sharing.
namespace cost {
using Formula = double (*)(double n, const Shape& s, const CostParams& p);
double allreduce_rd(double n, const Shape& s, const CostParams& p);
double allreduce_hd(double n, const Shape& s, const CostParams& p);
double allreduce_ring(double n, const Shape& s, const CostParams& p);
double allreduce_shm(double n, const Shape& s, const CostParams& p);
double allreduce_hier(double n, const Shape& s, const CostParams& p);
double reduce_scatter_shm(double n, const Shape& s, const CostParams& p);
double broadcast_tree(double n, const Shape& s, const CostParams& p);
double broadcast_chain(double n, const Shape& s, const CostParams& p);
double broadcast_shm(double n, const Shape& s, const CostParams& p);
double broadcast_hier(double n, const Shape& s, const CostParams& p);
double allgather_ring(double n, const Shape& s, const CostParams& p);
double allgather_bruck(double n, const Shape& s, const CostParams& p);
double allgather_shm(double n, const Shape& s, const CostParams& p);
double allgather_hier(double n, const Shape& s, const CostParams& p);
double reduce_tree(double n, const Shape& s, const CostParams& p);
double reduce_ring(double n, const Shape& s, const CostParams& p);
double reduce_scatter_ring(double n, const Shape& s, const CostParams& p);
double reduce_scatter_hd(double n, const Shape& s, const CostParams& p);
double gather_direct(double n, const Shape& s, const CostParams& p);
double gather_tree(double n, const Shape& s, const CostParams& p);
double scatter_direct(double n, const Shape& s, const CostParams& p);
double scatter_tree(double n, const Shape& s, const CostParams& p);
double alltoall_pairwise(double n, const Shape& s, const CostParams& p);
double alltoall_bruck(double n, const Shape& s, const CostParams& p);
double barrier_dissemination(double n, const Shape& s, const CostParams& p);

// The allreduce among `ranks` over tcp (recursive doubling, halving-doubling, ring) on
// `n` bytes that the model predicts fastest; ties go to the first of rd, hd, ring.
Algorithm cheapest_tcp_allreduce(int ranks, double n, const Shape& s, const CostParams& p);
// What a hierarchical allreduce on `n` bytes runs between its nodes by the model, and
// its predicted time (allreduce_hier's): the node phases, then the cheapest allreduce
// among the nodes (rd, hd, ring) on a rank's block, the node's ranks sharing its one
// link (each crossing at tcp_gbps / local_size); or, where that is faster, the ring
// pipelined with the node phases in chunks of `chunk` bytes. plan.cc's
// hierarchical_choice() takes it on more than two nodes.
struct HierarchicalPlan {
  Algorithm cross = Algorithm::kRecursiveDoubling;
  bool pipelined = false;
  double us = 0;
};
HierarchicalPlan hierarchical_plan(double n, double chunk, const Shape& s, const CostParams& p);
}  // namespace cost

}  // namespace chorus::communicator
