// plan_for(): the one place a call is decided (plan.h). In order:
//   1. the direct path: every rank's buffers are node-shared and the model predicts
//      it no slower than the segment path (the row's run_shared);
//   2. otherwise the algorithm: a forced one (CHORUS_ALGO) that the collective has a
//      row for and this communicator's shape can run, else the automatic choice, by
//      cost where the rows have formulas and by measured rules where they do not;
//   3. whether the call starts at issue on the calling thread (the row's at_issue),
//      by the cut-offs of the tuning table.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "chorus/error.h"
#include "comm/algorithms/algorithms.h"
#include "comm/communicator/communicator_impl.h"
#include "comm/communicator/cost_model.h"

namespace chorus {
namespace communicator {

namespace {

bool over_tcp(Algorithm a) { return a != Algorithm::kShmDirect && a != Algorithm::kHierarchical; }

// Forced algorithms that leave shared memory out: ring, rd, hd, tree.
bool tcp_forced(Algorithm forced) { return forced != Algorithm::kAuto && over_tcp(forced); }

// The collectives whose shared-memory algorithm reads the peers' buffers (cross-memory
// attach).
bool reads_peers(Collective c) {
  return c == Collective::kGather || c == Collective::kScatter || c == Collective::kAlltoall ||
         c == Collective::kAlltoallv || c == Collective::kAllgatherv;
}

}  // namespace

bool CommunicatorImpl::hierarchical_possible() const {
  return topology_.nodes > 1 && topology_.local_size > 1 && topology_.uniform();
}

bool CommunicatorImpl::direct_path_possible() const {
  const Algorithm forced = options_.algorithm;
  return options_.shm_direct && all_in_shared_memory() && size_ > 1 &&
         (forced == Algorithm::kAuto || forced == Algorithm::kShmDirect);
}

bool CommunicatorImpl::direct_path(Call& call) const {
  if (!direct_path_possible()) return false;
  // First whether the buffers are node-shared: without the lock, and without the model,
  // where the process has none.
  call.out_ref = shared::find_shared(call.recv, call.out_bytes);
  if (!call.out_ref) return false;
  // The model knows the path (predicted_shared_us): it is taken where it is predicted
  // no slower than the segment path; with the built-in parameters from about 16 KiB
  // (below, its second phase costs more than the copies it saves).
  const size_t bytes = std::max(call.in_bytes, call.out_bytes);
  if (predicted_shared_us(call.what, bytes, shape_, cost_) >
      predicted_us(call.what, Algorithm::kShmDirect, bytes, shape_, cost_)) {
    return false;
  }
  if (call.what == Collective::kBroadcast && call.root != rank_) return true;  // no input off the root
  call.in_ref = shared::find_shared(call.send, call.in_bytes);
  return static_cast<bool>(call.in_ref);
}

bool CommunicatorImpl::runnable(Collective c, Algorithm a) const {
  if (a == Algorithm::kHierarchical) return hierarchical_possible();
  if (a != Algorithm::kShmDirect) return true;
  if (!all_in_shared_memory()) return false;
  if (!reads_peers(c)) return true;
  // The ranks read each other's buffers; alltoallv's also need their tables of counts
  // to fit in a segment buffer.
  const bool table_fits = c != Collective::kAlltoallv || (1 + 3 * static_cast<size_t>(size_)) * 8 <= shm_->buffer_bytes();
  return shm_->cma() && table_fits;
}

Algorithm CommunicatorImpl::cheapest_allreduce(size_t bytes, bool tcp_only) const {
  if (size_ == 1) return Algorithm::kRecursiveDoubling;
  // The choice depends only on the size here: remembered per size (training issues the
  // same few sizes over and over), it costs a small collective nothing.
  std::atomic<uint64_t>& memo = allreduce_choice_[(bytes * 0x9E3779B97F4A7C15u) >> 60];
  const uint64_t seen = memo.load(std::memory_order_relaxed);
  if (!tcp_only && seen != 0 && (seen >> 8) == bytes) return static_cast<Algorithm>((seen & 0xff) - 1);
  const std::vector<Algorithm> candidates =
      costed_rows(Collective::kAllreduce, !tcp_only && runnable(Collective::kAllreduce, Algorithm::kHierarchical),
                  !tcp_only && runnable(Collective::kAllreduce, Algorithm::kShmDirect));
  const Algorithm best = cheapest(Collective::kAllreduce, bytes, shape_, cost_, candidates);
  if (!tcp_only && bytes < (uint64_t{1} << 56)) {
    memo.store(bytes << 8 | (static_cast<uint64_t>(best) + 1), std::memory_order_relaxed);
  }
  return best;
}

Algorithm CommunicatorImpl::algorithm_for(Collective c, size_t bytes) const {
  if (c == Collective::kSend || c == Collective::kRecv) {
    // The transport routes: a peer on this node through shared memory (whatever
    // CHORUS_ALGO says), the others over tcp; "shm" when every peer is on this node.
    return all_in_shared_memory() ? Algorithm::kShmDirect : Algorithm::kAuto;
  }
  // A forced algorithm that this collective has no row for, or that this
  // communicator's shape cannot run, leaves the choice automatic, so that one
  // CHORUS_ALGO serves every collective and communicator of a job; a forced tcp
  // algorithm keeps the choice over tcp.
  const Algorithm forced = options_.algorithm;
  if (forced != Algorithm::kAuto && find_entry(c, forced) != nullptr && runnable(c, forced)) return forced;
  const bool tcp_only = tcp_forced(forced);
  if (c == Collective::kAllreduce) return cheapest_allreduce(bytes, tcp_only);
  // Every other collective takes shared memory where it runs: one node, whole.
  if (!tcp_only && find_entry(c, Algorithm::kShmDirect) != nullptr && runnable(c, Algorithm::kShmDirect)) {
    return Algorithm::kShmDirect;
  }
  // Hierarchical is a candidate where the shape runs it and nothing is forced.
  return tcp_choice(c, bytes, shape_, cost_, forced == Algorithm::kAuto && hierarchical_possible());
}

std::vector<Algorithm> costed_rows(Collective c, bool hierarchical, bool shm) {
  std::vector<Algorithm> rows;
  for (const AlgorithmEntry& e : algorithm_table()) {
    const bool runs = over_tcp(e.algorithm) || (hierarchical && e.algorithm == Algorithm::kHierarchical) ||
                      (shm && e.algorithm == Algorithm::kShmDirect);
    if (e.collective == c && e.cost != nullptr && runs) rows.push_back(e.algorithm);
  }
  return rows;
}

Algorithm tcp_choice(Collective c, size_t bytes, const Shape& shape, const CostParams& p, bool hierarchical) {
  const algorithms::Tuning& t = p.tuning;
  const std::vector<Algorithm> candidates = costed_rows(c, hierarchical, false);
  if (candidates.empty()) {
    // No formula (allgatherv, alltoallv): the collective's one algorithm over tcp, its
    // first row that is neither shm nor hier.
    for (const AlgorithmEntry& e : algorithm_table()) {
      if (e.collective == c && over_tcp(e.algorithm)) return e.algorithm;
    }
    return Algorithm::kAuto;
  }
  const Algorithm best = cheapest(c, bytes, shape, p, candidates);
  // Broadcast and reduce over tcp: the binomial tree while latency dominates, the
  // pipelined chain beyond (Tuning::tree_limit_bytes, measured with chorus-bench, 2-8
  // ranks over loopback), on groups of the size it was measured on; larger groups by
  // cost, where the chain's N - 1 latencies show (hierarchical wherever it is cheapest).
  if ((c == Collective::kBroadcast || c == Collective::kReduce) && best != Algorithm::kHierarchical) {
    if (bytes <= t.tree_limit_bytes) return Algorithm::kBinomialTree;
    if (static_cast<size_t>(shape.size) <= t.tree_limit_max_ranks) return Algorithm::kRing;
  }
  // Gather, scatter and reduce_scatter on the groups they were measured on
  // (Tuning::reduce_scatter_halving_max_bytes): direct, and halving then the ring.
  if (static_cast<size_t>(shape.size) <= t.tree_limit_max_ranks && best != Algorithm::kHierarchical) {
    if (c == Collective::kGather || c == Collective::kScatter) return Algorithm::kAuto;
    if (c == Collective::kReduceScatter) {
      return bytes <= t.reduce_scatter_halving_max_bytes ? Algorithm::kHalvingDoubling : Algorithm::kRing;
    }
  }
  return best;
}

namespace {

using CrossFn = decltype(algorithms::HierarchicalChoice::cross_allreduce);

CrossFn allreduce_fn(Algorithm a) {
  switch (a) {
    case Algorithm::kRecursiveDoubling: return algorithms::allreduce_recursive_doubling;
    case Algorithm::kHalvingDoubling: return algorithms::allreduce_halving_doubling;
    default: return algorithms::allreduce_ring;
  }
}

// The allreduce between two nodes on `block_bytes` each: the measured cut-offs
// (Tuning::hier_allreduce_*).
Algorithm measured_cross(const algorithms::Tuning& t, size_t block_bytes) {
  if (block_bytes <= t.hier_allreduce_small_bytes) return Algorithm::kRecursiveDoubling;
  return block_bytes <= t.hier_allreduce_halving_bytes ? Algorithm::kHalvingDoubling : Algorithm::kRing;
}

}  // namespace

algorithms::HierarchicalChoice hierarchical_choice(const CostParams& p, const Shape& shape, const Topology& topology,
                                                   size_t count, size_t elem) {
  const algorithms::Tuning& t = p.tuning;
  algorithms::HierarchicalChoice how;
  const size_t bytes = count * elem;
  const int nodes = topology.nodes, local = std::max(1, topology.local_size);
  // The broadcast, between nodes and (without shared memory) inside them: on groups of
  // the size hier_broadcast_small_bytes was measured on, by it; where either group is
  // larger, the tree where the model predicts it faster than the chain on the larger.
  const int group = std::max(nodes, local);
  const double n = static_cast<double>(bytes);
  bool tree = bytes <= t.hier_broadcast_small_bytes;
  if (static_cast<size_t>(group) > t.tree_limit_max_ranks) {
    tree = cost::broadcast_tree(n, Shape{.size = group}, p) <
           cost::broadcast_chain(n, Shape{.size = group, .segment_bytes = shape.segment_bytes}, p);
  }
  how.broadcast = tree ? algorithms::broadcast_binomial : algorithms::broadcast_chain;
  // Pipelined chunks: hier_chunk_bytes, larger ones where there would be more than
  // hier_max_chunks (each chunk pays its node phases, which cost more than they hide
  // where the link is fast: tuning.h).
  const size_t max_chunks = std::max<size_t>(1, t.hier_max_chunks);
  const size_t chunk_count = std::max({size_t{1}, t.hier_chunk_bytes / std::max<size_t>(1, elem),
                                       count / max_chunks + (count % max_chunks != 0)});
  const bool can_pipeline = nodes > 1 && local > 1 && count > chunk_count;
  if (nodes > 2) {
    // By the model: the cheapest allreduce between nodes, or the ring pipelined with the
    // node phases where that is faster; a function of the whole call, so the same on
    // every rank.
    const cost::HierarchicalPlan plan =
        cost::hierarchical_plan(n, static_cast<double>(chunk_count * elem), shape, p);
    how.cross_allreduce = allreduce_fn(plan.cross);
    if (plan.pipelined && can_pipeline) how.chunk_count = chunk_count;
    return how;
  }
  // One or two nodes, as measured there: the rank's block of the node's reduce-scatter
  // (of one size among the ranks of a local rank, which reduce it together) by the
  // hier_allreduce_* cut-offs, pipelined wherever there are chunks.
  const size_t block_bytes = block_count(count, local, topology.local_rank) * elem;
  how.cross_allreduce =
      allreduce_fn(nodes <= 1 ? Algorithm::kRecursiveDoubling : measured_cross(t, block_bytes));
  if (can_pipeline) how.chunk_count = chunk_count;
  return how;
}

Shape shape_of(const algorithms::Context& ctx) {
  const Topology& t = ctx.topology;
  return Shape{.size = ctx.size, .nodes = t.nodes, .local_size = t.local_size, .shm = ctx.node != nullptr,
               .hierarchical = t.nodes > 1 && t.local_size > 1 && t.uniform(), .segment_bytes = ctx.segment_bytes};
}

namespace {

// The choice with the model's built-in parameters and the context's tuning table.
algorithms::HierarchicalChoice planned_choice(const algorithms::Context& ctx, size_t count) {
  CostParams p;
  p.tuning = ctx.tuning;
  return hierarchical_choice(p, shape_of(ctx), ctx.topology, count, ctx.elem);
}

}  // namespace

void planned_allreduce_hierarchical(const algorithms::Context& ctx, const void* in, void* out, size_t count) {
  algorithms::allreduce_hierarchical(ctx, planned_choice(ctx, count), in, out, count);
}

void planned_broadcast_hierarchical(const algorithms::Context& ctx, void* buf, size_t count, int root) {
  algorithms::broadcast_hierarchical(ctx, planned_choice(ctx, count), buf, count, root);
}

Plan CommunicatorImpl::plan_for(Call& call) const {
  Plan plan;
  const AlgorithmEntry* shared = find_entry(call.what, Algorithm::kShmDirect);
  if (shared != nullptr && shared->run_shared != nullptr && direct_path(call)) {
    plan.entry = shared;
    plan.direct = true;
  } else {
    plan.entry = find_entry(call.what, algorithm_for(call.what, call.bytes));
    if (plan.entry == nullptr) {  // a row missing: algorithm_table_test guards against it
      throw std::logic_error(std::string(collective_name(call.what)) + ": no algorithm " +
                          algorithm_name(algorithm_for(call.what, call.bytes)) + " in the table");
    }
  }
  if (plan.entry->algorithm == Algorithm::kHierarchical) {
    // Every rank must choose alike: whether a node's ranks share a segment is this
    // node's (its set-up may fail where another node's succeeded), what was asked for
    // (CHORUS_TRANSPORT, like CHORUS_COST_MODEL the same for every rank) is the job's.
    Shape asked = shape_;
    asked.shm = options_.transport != TransportKind::kTcp;
    call.hierarchical = hierarchical_choice(cost_, asked, topology_, call.count, call.elem);
  }
  if (plan.at_issue() != nullptr && starts_at_issue(plan, call)) plan.start = Start::kAtIssue;
  return plan;
}

bool CommunicatorImpl::inline_allowed() const {
  return options_.shm_inline && !options_.check_consistency && all_in_shared_memory();
}

bool CommunicatorImpl::inline_possible() const {
  // Not with more ranks than cores: a peer that has not arrived is waiting for this
  // core, so the call nearly always left its rest to the queue, and that cost more than
  // queueing it at once (4 ranks on 2 cores, 8 bytes: 10.2-13.3 us against 2.9-4.2).
  return inline_allowed() && !shm_->oversubscribed();
}

bool CommunicatorImpl::starts_at_issue(const Plan& plan, const Call& call) const {
  const algorithms::Tuning& t = cost_.tuning;
  if (!plan.direct) {
    // Through the segment: one chunk reduced whole, small enough to finish at once.
    return call.bytes <= t.inline_bytes && inline_possible() && algorithms::shm_allreduce_small(t, *shm_, call.bytes);
  }
  // On node-shared buffers: whole up to shared_allreduce_at_issue_bytes; larger ones
  // only entered at issue, where the node has no core to spare.
  if (call.bytes > t.shared_allreduce_at_issue_bytes) {
    return inline_allowed() && algorithms::shared_allreduce_arrives_at_issue(t, *shm_, call.bytes);
  }
  return inline_possible();
}

}  // namespace communicator

Algorithm Communicator::algorithm_for(std::string_view collective, size_t bytes) const {
  if (std::optional<Collective> c = parse_collective(collective)) return algorithm_for(*c, bytes);
  std::string names;
  for (Collective c : kAllCollectives) names += std::string(names.empty() ? "" : ", ") + collective_name(c);
  throw InvalidArgumentError("algorithm_for: unknown collective '" + std::string(collective) +
                             "' (one of " + names + ")");
}

}  // namespace chorus
