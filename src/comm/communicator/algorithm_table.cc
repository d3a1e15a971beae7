// The table of algorithms (plan.h): per collective and algorithm, its body, its cost
// formula and what it can run at issue; the names CHORUS_ALGO takes. Adding an
// algorithm is its file in algorithms/ (declared in algorithms.h), its value in the
// public `Algorithm` enum, and rows here (docs/architecture.md, "Adding an algorithm").
#include <algorithm>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>

#include "comm/algorithms/algorithms.h"
#include "comm/communicator/plan.h"

namespace chorus {

namespace communicator {
namespace {

namespace alg = chorus::algorithms;
using alg::Context;

int polls(const Context& ctx) {
  return static_cast<int>(std::min<size_t>(ctx.tuning.inline_polls, std::numeric_limits<int>::max()));
}

// The broadcast's root copies its `send` into `recv` before a tcp algorithm sends it
// from there (the shared-memory one reads `send` itself).
void copy_at_root(const Context& ctx, const Call& k) {
  const size_t bytes = k.count * ctx.elem;
  if (ctx.rank == k.root && k.send != k.recv && bytes > 0) std::memcpy(k.recv, k.send, bytes);
}

// Equal blocks of `count` elements, one per rank, in rank order.
void uniform_blocks(const Context& ctx, size_t count, std::vector<size_t>& counts, std::vector<size_t>& displs) {
  counts.assign(ctx.size, count);
  displs.resize(ctx.size);
  for (int r = 0; r < ctx.size; ++r) displs[r] = static_cast<size_t>(r) * count;
}

// ---- bodies at issue (the inline path, plan.cc decides when)

// A small allreduce through the segment: one chunk reduced whole.
bool allreduce_shm_at_issue(const Context& ctx, const Call& k, OpBody& rest) {
  int b = 0;
  if (alg::shm_allreduce_small_start(ctx, *ctx.node, k.send, k.recv, k.count, ctx.average, polls(ctx), b)) {
    return true;
  }
  rest = [b, recv = k.recv, count = k.count](const Context& c) {
    alg::shm_allreduce_small_finish(c, *c.node, b, recv, count, c.average);
  };
  return false;
}

// An allreduce on node-shared buffers: whole up to shared_allreduce_at_issue_bytes once
// every rank has entered it; larger (where the node has no core to spare) only entered,
// its pieces left to the queue's first runner on any rank.
bool allreduce_shared_at_issue(const Context& ctx, const Call& k, OpBody& rest) {
  const size_t count = k.count;
  if (k.bytes > ctx.tuning.shared_allreduce_at_issue_bytes) {
    alg::shared_allreduce_arrive(*ctx.node, k.in_ref, k.out_ref, count);
  } else if (alg::shared_allreduce_start(ctx, *ctx.node, k.in_ref, k.out_ref, count, ctx.average, polls(ctx))) {
    return true;
  }
  rest = [count](const Context& c) { alg::shared_allreduce_finish(c, *c.node, count, c.average); };
  return false;
}

using A = Algorithm;
using C = Collective;

// Rows of one collective stay together, in the order the choice tries them (plan.cc:
// the cheapest of equal predictions is the first, the default over tcp the first row
// that is neither shm nor hier where the choice is not by cost).
const AlgorithmEntry kTable[] = {
    // ---- allreduce: chosen by cost (cheapest())
    {C::kAllreduce, A::kRecursiveDoubling, cost::allreduce_rd,
     [](const Context& c, const Call& k) { alg::allreduce_recursive_doubling(c, k.send, k.recv, k.count); }},
    {C::kAllreduce, A::kHalvingDoubling, cost::allreduce_hd,
     [](const Context& c, const Call& k) { alg::allreduce_halving_doubling(c, k.send, k.recv, k.count); }},
    {C::kAllreduce, A::kRing, cost::allreduce_ring,
     [](const Context& c, const Call& k) { alg::allreduce_ring(c, k.send, k.recv, k.count); }},
    {C::kAllreduce, A::kShmDirect, cost::allreduce_shm,
     [](const Context& c, const Call& k) { alg::shm_allreduce(c, *c.node, k.send, k.recv, k.count, c.average); },
     allreduce_shm_at_issue,
     [](const Context& c, const Call& k) {
       alg::shared_allreduce(c, *c.node, k.in_ref, k.out_ref, k.count, c.average);
     },
     allreduce_shared_at_issue},
    {C::kAllreduce, A::kHierarchical, cost::allreduce_hier,
     [](const Context& c, const Call& k) { alg::allreduce_hierarchical(c, k.hierarchical, k.send, k.recv, k.count); }},

    // ---- broadcast
    {C::kBroadcast, A::kShmDirect, cost::broadcast_shm,
     [](const Context& c, const Call& k) { alg::shm_broadcast(c, *c.node, k.send, k.recv, k.count, k.root); },
     nullptr,
     [](const Context& c, const Call& k) {
       alg::shared_broadcast(c, *c.node, k.in_ref, k.out_ref, k.count, k.root);
     }},
    {C::kBroadcast, A::kBinomialTree, cost::broadcast_tree,
     [](const Context& c, const Call& k) {
       copy_at_root(c, k);
       alg::broadcast_binomial(c, k.recv, k.count, k.root);
     }},
    {C::kBroadcast, A::kRing, cost::broadcast_chain,  // a pipelined chain: the ring, cut open at the root
     [](const Context& c, const Call& k) {
       copy_at_root(c, k);
       alg::broadcast_chain(c, k.recv, k.count, k.root);
     }},
    {C::kBroadcast, A::kHierarchical, cost::broadcast_hier,
     [](const Context& c, const Call& k) {
       copy_at_root(c, k);
       alg::broadcast_hierarchical(c, k.hierarchical, k.recv, k.count, k.root);
     }},

    // ---- reduce: tree or ring (plan.cc: by tree_limit_bytes on small groups, by cost beyond)
    {C::kReduce, A::kShmDirect, nullptr,
     [](const Context& c, const Call& k) { alg::shm_reduce(c, *c.node, k.send, k.recv, k.count, k.root); }},
    {C::kReduce, A::kBinomialTree, cost::reduce_tree,
     [](const Context& c, const Call& k) { alg::reduce_binomial(c, k.send, k.recv, k.count, k.root); }},
    {C::kReduce, A::kRing, cost::reduce_ring,
     [](const Context& c, const Call& k) { alg::reduce_ring(c, k.send, k.recv, k.count, k.root); }},

    // ---- allgather: over tcp chosen by cost (ring, bruck, hierarchical)
    {C::kAllgather, A::kShmDirect, cost::allgather_shm,
     [](const Context& c, const Call& k) {
       alg::shm_allgather_blocks(c, *c.node, k.send, k.recv, k.count * static_cast<size_t>(c.size));
     },
     nullptr,
     [](const Context& c, const Call& k) { alg::shared_allgather(c, *c.node, k.in_ref, k.out_ref, k.count); }},
    {C::kAllgather, A::kRing, cost::allgather_ring,
     [](const Context& c, const Call& k) {
       std::vector<size_t> counts, displs;
       uniform_blocks(c, k.count, counts, displs);
       alg::allgatherv_ring(c, k.send, k.recv, counts, displs);
     }},
    {C::kAllgather, A::kBruck, cost::allgather_bruck,
     [](const Context& c, const Call& k) { alg::allgather_bruck(c, k.send, k.recv, k.count); }},
    {C::kAllgather, A::kHierarchical, cost::allgather_hier,
     [](const Context& c, const Call& k) { alg::allgather_hierarchical(c, k.send, k.recv, k.count); }},

    // ---- allgatherv
    {C::kAllgatherv, A::kShmDirect, nullptr,
     [](const Context& c, const Call& k) {
       alg::shm_allgatherv(c, *c.node, k.send, k.recv, k.recv_counts, k.recv_displs);
     }},
    {C::kAllgatherv, A::kRing, nullptr,
     [](const Context& c, const Call& k) { alg::allgatherv_ring(c, k.send, k.recv, k.recv_counts, k.recv_displs); }},

    // ---- reduce_scatter: over tcp by cost (ring, recursive halving)
    {C::kReduceScatter, A::kShmDirect, cost::reduce_scatter_shm,
     [](const Context& c, const Call& k) {
       alg::shm_reduce_scatter_blocks(c, *c.node, k.send, k.recv, k.count * static_cast<size_t>(c.size), c.average);
     },
     nullptr,
     [](const Context& c, const Call& k) {
       alg::shared_reduce_scatter(c, *c.node, k.in_ref, k.out_ref, k.count, c.average);
     }},
    {C::kReduceScatter, A::kRing, cost::reduce_scatter_ring,
     [](const Context& c, const Call& k) { alg::reduce_scatter_ring(c, k.send, k.recv, k.count); }},
    {C::kReduceScatter, A::kHalvingDoubling, cost::reduce_scatter_hd,
     [](const Context& c, const Call& k) { alg::reduce_scatter_halving(c, k.send, k.recv, k.count); }},

    // ---- gather, scatter: over tcp by cost, direct (kAuto: the root talks to every rank)
    // or the binomial tree
    {C::kGather, A::kShmDirect, nullptr,
     [](const Context& c, const Call& k) { alg::shm_gather(c, *c.node, k.send, k.recv, k.count, k.root); }},
    {C::kGather, A::kAuto, cost::gather_direct,
     [](const Context& c, const Call& k) { alg::gather_direct(c, k.send, k.recv, k.count, k.root); }},
    {C::kGather, A::kBinomialTree, cost::gather_tree,
     [](const Context& c, const Call& k) { alg::gather_binomial(c, k.send, k.recv, k.count, k.root); }},
    {C::kScatter, A::kShmDirect, nullptr,
     [](const Context& c, const Call& k) { alg::shm_scatter(c, *c.node, k.send, k.recv, k.count, k.root); }},
    {C::kScatter, A::kAuto, cost::scatter_direct,
     [](const Context& c, const Call& k) { alg::scatter_direct(c, k.send, k.recv, k.count, k.root); }},
    {C::kScatter, A::kBinomialTree, cost::scatter_tree,
     [](const Context& c, const Call& k) { alg::scatter_binomial(c, k.send, k.recv, k.count, k.root); }},

    // ---- alltoall: over tcp by cost, the pairwise exchange (kAuto) or Bruck's;
    // alltoallv: the pairwise exchange
    {C::kAlltoall, A::kShmDirect, nullptr,
     [](const Context& c, const Call& k) { alg::shm_alltoall(c, *c.node, k.send, k.recv, k.count); }},
    {C::kAlltoall, A::kAuto, cost::alltoall_pairwise,
     [](const Context& c, const Call& k) {
       std::vector<size_t> counts, displs;
       uniform_blocks(c, k.count, counts, displs);
       const size_t total_bytes = k.count * static_cast<size_t>(c.size) * c.elem;
       const void* src = k.send;
       if (k.send == k.recv && total_bytes > 0) {  // in place: keep a copy of what goes out
         uint8_t* copy = c.scratch.get(total_bytes, 1);
         std::memcpy(copy, k.send, total_bytes);
         src = copy;
       }
       alg::alltoallv_pairwise(c, src, counts, displs, k.recv, counts, displs);
     }},
    {C::kAlltoall, A::kBruck, cost::alltoall_bruck,
     [](const Context& c, const Call& k) { alg::alltoall_bruck(c, k.send, k.recv, k.count); }},
    {C::kAlltoallv, A::kShmDirect, nullptr,
     [](const Context& c, const Call& k) {
       alg::alltoallv_agreed(c, c.node, k.send, k.send_counts, k.send_displs, k.recv, k.recv_counts,
                             k.recv_displs);
     }},
    {C::kAlltoallv, A::kAuto, nullptr,
     [](const Context& c, const Call& k) {
       alg::alltoallv_agreed(c, nullptr, k.send, k.send_counts, k.send_displs, k.recv, k.recv_counts,
                             k.recv_displs);
     }},

    // ---- barrier: dissemination over tcp (kAuto)
    {C::kBarrier, A::kShmDirect, nullptr, [](const Context& c, const Call&) { alg::shm_barrier(c, *c.node); }},
    {C::kBarrier, A::kAuto, cost::barrier_dissemination,
     [](const Context& c, const Call&) { alg::barrier_dissemination(c); }},
};

// CHORUS_ALGO's names: the short one first, then the long one.
struct AlgorithmName {
  Algorithm algorithm;
  const char* name;
  const char* long_name;
};

constexpr AlgorithmName kNames[] = {
    {A::kAuto, "auto", "auto"},
    {A::kRing, "ring", "ring"},
    {A::kRecursiveDoubling, "rd", "recursive_doubling"},
    {A::kHalvingDoubling, "hd", "halving_doubling"},
    {A::kShmDirect, "shm", "direct"},
    {A::kHierarchical, "hier", "hierarchical"},
    {A::kBinomialTree, "tree", "binomial_tree"},
    {A::kBruck, "bruck", "bruck"},
};

}  // namespace

std::span<const AlgorithmEntry> algorithm_table() { return kTable; }

const AlgorithmEntry* find_entry(Collective collective, Algorithm algorithm) {
  for (const AlgorithmEntry& e : kTable) {
    if (e.collective == collective && e.algorithm == algorithm) return &e;
  }
  return nullptr;
}

OpBody Plan::body(Call call) const {
  auto run = direct ? entry->run_shared : entry->run;
  return [run, call = std::move(call)](const algorithms::Context& ctx) { run(ctx, call); };
}

double predicted_us(Collective c, Algorithm a, size_t bytes, const Shape& s, const CostParams& p) {
  const AlgorithmEntry* e = find_entry(c, a);
  if (e == nullptr || e->cost == nullptr) return std::numeric_limits<double>::infinity();
  return e->cost(static_cast<double>(bytes), s, p);
}

Algorithm cheapest(Collective collective, size_t bytes, const Shape& shape, const CostParams& p,
                   std::span<const Algorithm> candidates) {
  Algorithm best = candidates.front();
  double best_us = std::numeric_limits<double>::infinity();
  for (Algorithm a : candidates) {
    double us = predicted_us(collective, a, bytes, shape, p);
    if (us < best_us) {
      best_us = us;
      best = a;
    }
  }
  // Measured cut-off (Tuning::pair_rd_max_bytes): between two ranks the second exchange
  // of halving-doubling costs more than the formulas' alpha up to it.
  const bool rd_allowed = std::find(candidates.begin(), candidates.end(),
                                    Algorithm::kRecursiveDoubling) != candidates.end();
  if (collective == Collective::kAllreduce && shape.size == 2 && rd_allowed &&
      best == Algorithm::kHalvingDoubling && bytes <= p.tuning.pair_rd_max_bytes) {
    return Algorithm::kRecursiveDoubling;
  }
  return best;
}

}  // namespace communicator

const char* algorithm_name(Algorithm algorithm) {
  for (const communicator::AlgorithmName& n : communicator::kNames) {
    if (n.algorithm == algorithm) return n.name;
  }
  return "?";
}

std::optional<Algorithm> parse_algorithm(std::string_view name) {
  for (const communicator::AlgorithmName& n : communicator::kNames) {
    if (name == n.name || name == n.long_name) return n.algorithm;
  }
  return std::nullopt;
}

}  // namespace chorus
