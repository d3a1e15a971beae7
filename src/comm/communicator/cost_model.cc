#include "comm/communicator/cost_model.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <sstream>

#include "chorus/error.h"

namespace chorus::communicator {
namespace {

struct Link {
  double alpha_us, us_per_byte;
  double time(double bytes) const { return alpha_us + bytes * us_per_byte; }
};

Link tcp(const CostParams& p) { return {p.tcp_alpha_us, 1e-3 / p.tcp_gbps}; }
double reduce_us(const CostParams& p, double bytes) { return bytes * 1e-3 / p.reduce_gbps; }
double shm_copy_us(const CostParams& p, double bytes) { return bytes * 1e-3 / p.shm_gbps; }

int floor_log2(int n) {
  int k = 0;
  while ((2 << k) <= n) ++k;
  return k;
}

// ---- allreduce over tcp among `ranks`
double rd_allreduce(int ranks, double n, const CostParams& p) {
  if (ranks < 2) return 0;
  int steps = floor_log2(ranks);
  bool folded = (1 << steps) != ranks;
  Link l = tcp(p);
  return (steps + (folded ? 2 : 0)) * l.time(n) + (steps + folded) * reduce_us(p, n);
}

double hd_allreduce(int ranks, double n, const CostParams& p) {
  if (ranks < 2) return 0;
  int steps = floor_log2(ranks);
  int pow2 = 1 << steps;
  bool folded = pow2 != ranks;
  Link l = tcp(p);
  double part = static_cast<double>(pow2 - 1) / pow2 * n;
  return 2 * steps * l.alpha_us + 2 * part * l.us_per_byte + reduce_us(p, part) +
         (folded ? 2 * l.time(n) + reduce_us(p, n) : 0);
}

double ring_allreduce(int ranks, double n, const Shape& s, const CostParams& p) {
  if (ranks < 2) return 0;
  Link l = tcp(p);
  double part = static_cast<double>(ranks - 1) / ranks * n;
  // Pipelined: a segment is reduced while the next one travels, so only about one
  // segment's reduction shows.
  return 2 * (ranks - 1) * l.alpha_us + 2 * part * l.us_per_byte +
         reduce_us(p, std::min(part, static_cast<double>(s.segment_bytes)));
}

double best_tcp_allreduce(int ranks, double n, const Shape& s, const CostParams& p) {
  return std::min({rd_allreduce(ranks, n, p), hd_allreduce(ranks, n, p), ring_allreduce(ranks, n, s, p)});
}

// ---- reduce_scatter over tcp among `ranks`, n = the whole input
// The ring: N - 1 steps of one block each, its reductions pipelined as the
// allreduce's.
double ring_reduce_scatter(int ranks, double n, const Shape& s, const CostParams& p) {
  if (ranks < 2) return 0;
  Link l = tcp(p);
  double part = static_cast<double>(ranks - 1) / ranks * n;
  return (ranks - 1) * l.alpha_us + part * l.us_per_byte +
         reduce_us(p, std::min(part, static_cast<double>(s.segment_bytes)));
}

// Recursive halving (reduce_scatter_halving.cc): log2 of the largest power of two P
// below N exchanges, of half the remaining data each ((P - 1) / P of it in all, each
// reduced), plus, where N is not a power of two, the fold (the whole input to a
// partner, reduced) and the folded rank's block sent back.
double hd_reduce_scatter(int ranks, double n, const CostParams& p) {
  if (ranks < 2) return 0;
  const int steps = floor_log2(ranks), pow2 = 1 << steps;
  const bool folded = pow2 != ranks;
  Link l = tcp(p);
  const double part = static_cast<double>(pow2 - 1) / pow2 * n;
  return steps * l.alpha_us + part * l.us_per_byte + reduce_us(p, part) +
         (folded ? l.time(n) + reduce_us(p, n) + l.time(n / ranks) : 0);
}

// ---- gather and scatter among `ranks`, n = one rank's block
// Direct: the root posts N - 1 messages and pays each one's latency (the model's alpha
// is mostly the per-message work of a rank), and carries every other block.
double direct_root(int ranks, double n, const CostParams& p) {
  if (ranks < 2) return 0;
  Link l = tcp(p);
  return (ranks - 1) * l.alpha_us + (ranks - 1) * n * l.us_per_byte;
}

// Binomial tree (gather_binomial.cc, scatter_binomial.cc): ceil(log2 N) rounds on the
// critical path; the root still carries every other block (N - 1 of them, half in its
// first message), and it copies the whole buffer once to or from rank order.
double binomial_root(int ranks, double n, const CostParams& p) {
  if (ranks < 2) return 0;
  Link l = tcp(p);
  return std::ceil(std::log2(ranks)) * l.alpha_us + (ranks - 1) * n * l.us_per_byte +
         shm_copy_us(p, ranks * n);
}

// Where every rank of a node sends to another node in the same step (recursive
// doubling and halving, Bruck's, the pairwise alltoall, the exchanges between nodes of
// the hierarchical calls),
// the node's ranks share its one link: each gets a local_size-th of tcp_gbps. The
// ring's step crosses between nodes once per node and keeps the whole link. Only on
// uniform shapes (s.hierarchical): elsewhere local_size is this rank's node's, which
// differs between ranks, and every rank must predict the same.
CostParams shared_link(const Shape& s, const CostParams& p) {
  CostParams q = p;
  if (s.hierarchical) q.tcp_gbps = p.tcp_gbps / std::max(1, s.local_size);
  return q;
}

double chunks(double n, const Shape& s) { return std::max(1.0, std::ceil(n / s.shm_chunk)); }

// Direct shared memory: copy in; small chunks (Tuning::whole_bytes) every rank reduces
// whole. Two ranks reduce chunks of up to pair_whole_bytes whole too (one phase each);
// larger ones (pair_chunk_bytes) in slices, two phases each, a rank copying half the
// chunk in, its half of the result to its buffer and the peer's half out, and reducing
// half. More share larger chunks out in pieces (shared_chunk_bytes chunks, a phase and
// a wait for the pieces each, a rank's share of the reduction about n) and copy the
// result out.
double shm_allreduce(int ranks, double n, const Shape& s, const CostParams& p) {
  const algorithms::Tuning& t = p.tuning;
  if (n <= static_cast<double>(t.whole_bytes)) {
    return p.shm_alpha_us + shm_copy_us(p, n) + reduce_us(p, (ranks - 1) * n);
  }
  const bool pair = ranks == 2;
  const double chunk = static_cast<double>(
      std::min(s.shm_chunk, pair ? t.pair_chunk_bytes : t.shared_chunk_bytes));
  const double count = std::max(1.0, std::ceil(n / chunk));
  if (pair && std::min(n, chunk) <= static_cast<double>(t.pair_whole_bytes)) {
    return count * p.shm_alpha_us + shm_copy_us(p, n) + reduce_us(p, n);
  }
  if (pair) return 2 * count * p.shm_alpha_us + shm_copy_us(p, 1.5 * n) + reduce_us(p, n / 2);
  return 2 * count * p.shm_alpha_us + shm_copy_us(p, 2 * n) + reduce_us(p, n);
}

double shm_reduce_scatter(double n, const Shape& s, const CostParams& p) {
  return chunks(n, s) * p.shm_alpha_us + shm_copy_us(p, n) + reduce_us(p, n / s.local_size);
}

double shm_allgather(double n, const Shape& s, const CostParams& p) {
  return chunks(n / s.local_size, s) * p.shm_alpha_us + shm_copy_us(p, n);
}

// The node phases of a hierarchical allreduce on n bytes: the segment's reduce-scatter
// and allgather, or the ring among the node's ranks.
double intra_allreduce(double n, const Shape& s, const CostParams& p) {
  return s.shm ? shm_reduce_scatter(n, s, p) + shm_allgather(n, s, p) : ring_allreduce(s.local_size, n, s, p);
}

// The pipelining chunk of a hierarchical allreduce on n bytes (plan.cc, in elements
// there): hier_chunk_bytes, larger where there would be more than hier_max_chunks.
double hier_chunk(double n, const CostParams& p) {
  return std::max(static_cast<double>(p.tuning.hier_chunk_bytes),
                  n / static_cast<double>(std::max<size_t>(1, p.tuning.hier_max_chunks)));
}

double hier_allreduce(double n, const Shape& s, const CostParams& p) {
  return cost::hierarchical_plan(n, hier_chunk(n, p), s, p).us;
}

// ---- broadcast over tcp: binomial tree, or pipelined chain
double tree_broadcast(int ranks, double n, const CostParams& p) {
  return ranks < 2 ? 0 : std::ceil(std::log2(ranks)) * tcp(p).time(n);
}

double chain_broadcast(int ranks, double n, const Shape& s, const CostParams& p) {
  if (ranks < 2) return 0;
  double segments = std::max(1.0, std::ceil(n / static_cast<double>(s.segment_bytes)));
  return (ranks - 1 + segments - 1) * tcp(p).time(n / segments);
}

double tcp_broadcast(int ranks, double n, const Shape& s, const CostParams& p) {
  return std::min(tree_broadcast(ranks, n, p), chain_broadcast(ranks, n, s, p));
}

double shm_broadcast(double n, const Shape& s, const CostParams& p) {
  return chunks(n, s) * p.shm_alpha_us + shm_copy_us(p, 2 * n);
}

// ---- allgather (n = the whole result): ring over tcp
double tcp_allgather(int ranks, double n, const CostParams& p) {
  if (ranks < 2) return 0;
  Link l = tcp(p);
  return (ranks - 1) * l.alpha_us + static_cast<double>(ranks - 1) / ranks * n * l.us_per_byte;
}

// Bruck over tcp: ceil(log2 N) rounds of one message each, carrying (N - 1) / N of the
// result in all, plus the copies through the working buffer (the own block in, the
// whole result out in the final rotation: about n).
double bruck_allgather(int ranks, double n, const CostParams& p) {
  if (ranks < 2) return 0;
  Link l = tcp(p);
  return std::ceil(std::log2(ranks)) * l.alpha_us + static_cast<double>(ranks - 1) / ranks * n * l.us_per_byte +
         shm_copy_us(p, n);
}

// The thresholds of the tuning table that CHORUS_COST_MODEL sets by name, each with
// the least value it takes.
struct TuningKey {
  const char* name;
  size_t algorithms::Tuning::*field;
  size_t min;
};

constexpr size_t kMinChunk = algorithms::Tuning::kMinChunkBytes;
constexpr TuningKey kTuningKeys[] = {
    {"whole_bytes", &algorithms::Tuning::whole_bytes, 0},
    {"whole_oversubscribed_bytes", &algorithms::Tuning::whole_oversubscribed_bytes, 0},
    {"whole_crowded_bytes", &algorithms::Tuning::whole_crowded_bytes, 0},
    {"shared_chunk_bytes", &algorithms::Tuning::shared_chunk_bytes, kMinChunk},
    {"pair_whole_bytes", &algorithms::Tuning::pair_whole_bytes, 0},
    {"pair_chunk_bytes", &algorithms::Tuning::pair_chunk_bytes, kMinChunk},
    {"stream_bytes", &algorithms::Tuning::stream_bytes, 0},
    {"shared_piece_bytes", &algorithms::Tuning::shared_piece_bytes, 1},
    {"many_max_bytes", &algorithms::Tuning::many_max_bytes, 0},
    {"shared_buffer_piece_bytes", &algorithms::Tuning::shared_buffer_piece_bytes, 1},
    {"cma_broadcast_min_bytes", &algorithms::Tuning::cma_broadcast_min_bytes, 0},
    {"cma_allgather_min_bytes", &algorithms::Tuning::cma_allgather_min_bytes, 0},
    {"cma_reduce_scatter_min_bytes", &algorithms::Tuning::cma_reduce_scatter_min_bytes, 0},
    {"cma_reduce_min_bytes", &algorithms::Tuning::cma_reduce_min_bytes, 0},
    {"cma_reduce_max_bytes", &algorithms::Tuning::cma_reduce_max_bytes, 0},
    {"cma_piece_bytes", &algorithms::Tuning::cma_piece_bytes, 1},
    {"alltoallv_segment_bytes", &algorithms::Tuning::alltoallv_segment_bytes, 0},
    {"hier_allreduce_small_bytes", &algorithms::Tuning::hier_allreduce_small_bytes, 0},
    {"hier_allreduce_halving_bytes", &algorithms::Tuning::hier_allreduce_halving_bytes, 0},
    {"hier_broadcast_small_bytes", &algorithms::Tuning::hier_broadcast_small_bytes, 0},
    {"hier_chunk_bytes", &algorithms::Tuning::hier_chunk_bytes, 1},
    {"hier_max_chunks", &algorithms::Tuning::hier_max_chunks, 1},
    {"tree_limit_bytes", &algorithms::Tuning::tree_limit_bytes, 0},
    {"tree_limit_max_ranks", &algorithms::Tuning::tree_limit_max_ranks, 1},
    {"reduce_scatter_halving_max_bytes", &algorithms::Tuning::reduce_scatter_halving_max_bytes, 0},
    {"pair_rd_max_bytes", &algorithms::Tuning::pair_rd_max_bytes, 0},
    {"inline_bytes", &algorithms::Tuning::inline_bytes, 0},
    {"inline_polls", &algorithms::Tuning::inline_polls, 0},
    {"shared_allreduce_at_issue_bytes", &algorithms::Tuning::shared_allreduce_at_issue_bytes, 0},
    {"claim_grace_us", &algorithms::Tuning::claim_grace_us, 0},
    {"no_spare_core_claim_grace_us", &algorithms::Tuning::no_spare_core_claim_grace_us, 0},
    {"shm_spins", &algorithms::Tuning::shm_spins, 0},
    {"shm_oversubscribed_yields", &algorithms::Tuning::shm_oversubscribed_yields, 0},
    {"shm_oversubscribed_spins", &algorithms::Tuning::shm_oversubscribed_spins, 0},
};

static_assert(std::size(kTuningKeys) * sizeof(size_t) == sizeof(algorithms::Tuning),
              "every field of the tuning table has its key");

const TuningKey* tuning_key(const std::string& name) {
  for (const TuningKey& k : kTuningKeys) {
    if (name == k.name) return &k;
  }
  return nullptr;
}

// The unit of a tuning key, from its name's ending: bytes, microseconds or a count.
std::string unit_of(const std::string& key) {
  if (key.ends_with("_bytes")) return " bytes";
  if (key.ends_with("_us")) return " microseconds";
  return "";
}

// `value` of `item` as a whole number (of the key's unit), at least `min`.
size_t parse_whole(const std::string& item, const std::string& key, const std::string& value, size_t min) {
  errno = 0;
  const unsigned long long v = std::strtoull(value.c_str(), nullptr, 10);
  if (value.empty() || value.find_first_not_of("0123456789") != std::string::npos ||
      errno == ERANGE || v > std::numeric_limits<size_t>::max()) {
    throw ConfigError("CHORUS_COST_MODEL: '" + item + "' needs a whole number" +
                      (unit_of(key).empty() ? "" : " of" + unit_of(key)) + " after '='");
  }
  if (v < min) {
    throw ConfigError("CHORUS_COST_MODEL: '" + item + "' is below the least value, " +
                      std::to_string(min) + unit_of(key));
  }
  return static_cast<size_t>(v);
}

}  // namespace

CostParams parse_cost_params(const std::string& text) {
  CostParams p;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    size_t eq = item.find('=');
    std::string key = item.substr(0, eq);
    std::string value = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (const TuningKey* k = tuning_key(key)) {
      p.tuning.*k->field = parse_whole(item, key, value, k->min);
      continue;
    }
    char* end = nullptr;
    double v = std::strtod(value.c_str(), &end);
    if (value.empty() || *end != '\0' || !(v > 0) || !std::isfinite(v)) {
      throw ConfigError("CHORUS_COST_MODEL: '" + item + "' needs a positive number after '='");
    }
    if (key == "tcp_alpha_us") p.tcp_alpha_us = v;
    else if (key == "tcp_gbps") p.tcp_gbps = v;
    else if (key == "shm_alpha_us") p.shm_alpha_us = v;
    else if (key == "shm_gbps") p.shm_gbps = v;
    else if (key == "reduce_gbps") p.reduce_gbps = v;
    else {
      std::string tuning;
      for (const TuningKey& k : kTuningKeys) tuning += std::string(", ") + k.name;
      throw ConfigError("CHORUS_COST_MODEL: unknown parameter '" + key +
                        "' (tcp_alpha_us, tcp_gbps, shm_alpha_us, shm_gbps, reduce_gbps" +
                        tuning + ")");
    }
  }
  return p;
}

// The direct path on node-shared buffers (algorithms/shm/shared_buffers.cc): two
// phases (one to enter, one to end: the round of shared work costs as much), then each
// rank's share of the pieces (a p-th of the data): an allreduce sums its share over
// every rank's buffer and copies the sum into the p - 1 others'; a reduce_scatter only
// sums; an allgather or broadcast copies its share to every other rank. Nothing is
// copied into the segment or out of it. The second phase is why small calls take the
// segment path: one phase there. chorus-bench, 2 ranks in place, shared against
// ordinary buffers: 64 B 1.6 against 0.6 us, 4 KiB 2.2 against 0.9 us, 64 KiB 3.7
// against 6.7 us, 1 MiB 39 against 126 us; the model puts the change at about 16 KiB.
double predicted_shared_us(Collective c, size_t bytes, const Shape& s, const CostParams& p) {
  if (!(s.shm && s.nodes == 1) || s.size < 2) return std::numeric_limits<double>::infinity();
  const double n = static_cast<double>(bytes), ranks = s.size, share = n / ranks;
  const double phases = 2 * p.shm_alpha_us;
  switch (c) {
    case Collective::kAllreduce:
      return phases + reduce_us(p, (ranks - 1) * share) + shm_copy_us(p, (ranks - 1) * share);
    case Collective::kReduceScatter: return phases + reduce_us(p, (ranks - 1) * share);
    case Collective::kAllgather:
    case Collective::kBroadcast: return phases + shm_copy_us(p, (ranks - 1) * share);
    default: return std::numeric_limits<double>::infinity();
  }
}

namespace cost {

namespace {
constexpr double kNever = std::numeric_limits<double>::infinity();
bool one_node_shm(const Shape& s) { return s.shm && s.nodes == 1; }
}  // namespace

double allreduce_rd(double n, const Shape& s, const CostParams& p) { return rd_allreduce(s.size, n, shared_link(s, p)); }
double allreduce_hd(double n, const Shape& s, const CostParams& p) { return hd_allreduce(s.size, n, shared_link(s, p)); }
double allreduce_ring(double n, const Shape& s, const CostParams& p) { return ring_allreduce(s.size, n, s, p); }
double allreduce_shm(double n, const Shape& s, const CostParams& p) {
  return one_node_shm(s) ? shm_allreduce(s.size, n, s, p) : kNever;
}
double allreduce_hier(double n, const Shape& s, const CostParams& p) {
  return s.hierarchical ? hier_allreduce(n, s, p) : kNever;
}

double reduce_scatter_shm(double n, const Shape& s, const CostParams& p) {
  return one_node_shm(s) ? shm_reduce_scatter(n, s, p) : kNever;
}

double broadcast_tree(double n, const Shape& s, const CostParams& p) { return tree_broadcast(s.size, n, p); }
double broadcast_chain(double n, const Shape& s, const CostParams& p) { return chain_broadcast(s.size, n, s, p); }
double broadcast_shm(double n, const Shape& s, const CostParams& p) {
  return one_node_shm(s) ? shm_broadcast(n, s, p) : kNever;
}
double broadcast_hier(double n, const Shape& s, const CostParams& p) {
  if (!s.hierarchical) return kNever;
  return tcp_broadcast(s.nodes, n, s, p) + (s.shm ? shm_broadcast(n, s, p) : tcp_broadcast(s.local_size, n, s, p));
}

double allgather_ring(double n, const Shape& s, const CostParams& p) { return tcp_allgather(s.size, n, p); }
double allgather_bruck(double n, const Shape& s, const CostParams& p) {
  return bruck_allgather(s.size, n, shared_link(s, p));
}
double allgather_shm(double n, const Shape& s, const CostParams& p) {
  return one_node_shm(s) ? shm_allgather(n, s, p) : kNever;
}
// Every rank of a node gathers the whole result across nodes (the ring among the
// ranks of its local rank, on the nodes' packs), all of them at once through the
// node's link.
double allgather_hier(double n, const Shape& s, const CostParams& p) {
  if (!s.hierarchical) return kNever;
  return (s.shm ? shm_allgather(n / s.nodes, s, p) : tcp_allgather(s.local_size, n / s.nodes, p)) +
         tcp_allgather(s.nodes, n, shared_link(s, p));
}

// Reduce: the binomial tree, ceil(log2 N) rounds of the whole buffer, each reduced; the
// ring (reduce_ring.cc): the ring's reduce-scatter, then every rank sends its block to
// the root.
double reduce_tree(double n, const Shape& s, const CostParams& p) {
  return s.size < 2 ? 0 : std::ceil(std::log2(s.size)) * (tcp(p).time(n) + reduce_us(p, n));
}
double reduce_ring(double n, const Shape& s, const CostParams& p) {
  return s.size < 2 ? 0 : ring_reduce_scatter(s.size, n, s, p) + direct_root(s.size, n / s.size, p);
}

double reduce_scatter_ring(double n, const Shape& s, const CostParams& p) {
  return ring_reduce_scatter(s.size, n, s, p);
}
double reduce_scatter_hd(double n, const Shape& s, const CostParams& p) {
  return hd_reduce_scatter(s.size, n, shared_link(s, p));
}

double gather_direct(double n, const Shape& s, const CostParams& p) { return direct_root(s.size, n, p); }
double gather_tree(double n, const Shape& s, const CostParams& p) { return binomial_root(s.size, n, p); }
double scatter_direct(double n, const Shape& s, const CostParams& p) { return direct_root(s.size, n, p); }
double scatter_tree(double n, const Shape& s, const CostParams& p) { return binomial_root(s.size, n, p); }

// Pairwise alltoall (n = one rank's whole buffer): every rank posts N - 1 messages (the
// same per-message latency as the direct gather's root) of a block each, all of them
// crossing at once.
double alltoall_pairwise(double n, const Shape& s, const CostParams& p) {
  return direct_root(s.size, n / std::max(1, s.size), shared_link(s, p));
}

// Bruck's alltoall: ceil(log2 N) rounds of the blocks whose index has the round's bit
// set (about N / 2 of them), each packed and unpacked, plus the two rotations.
double alltoall_bruck(double n, const Shape& s, const CostParams& p) {
  if (s.size < 2) return 0;
  const Link l = tcp(shared_link(s, p));
  const double rounds = std::ceil(std::log2(s.size)), moved = rounds * std::floor(s.size / 2.0) * n / s.size;
  return rounds * l.alpha_us + moved * l.us_per_byte + shm_copy_us(p, 2 * moved + 2 * n);
}

// Dissemination: ceil(log2 N) rounds of an empty message.
double barrier_dissemination(double, const Shape& s, const CostParams& p) {
  return s.size < 2 ? 0 : std::ceil(std::log2(s.size)) * p.tcp_alpha_us;
}

Algorithm cheapest_tcp_allreduce(int ranks, double n, const Shape& s, const CostParams& p) {
  const double rd = rd_allreduce(ranks, n, p), hd = hd_allreduce(ranks, n, p), ring = ring_allreduce(ranks, n, s, p);
  if (rd <= hd && rd <= ring) return Algorithm::kRecursiveDoubling;
  return hd <= ring ? Algorithm::kHalvingDoubling : Algorithm::kRing;
}

HierarchicalPlan hierarchical_plan(double n, double chunk, const Shape& s, const CostParams& p) {
  // The node's ranks cross at once, each with its block, through the node's one link.
  const int local = std::max(1, s.local_size), nodes = s.nodes;
  const CostParams link = shared_link(s, p);
  const double block = n / local;
  HierarchicalPlan plan;
  plan.cross = cheapest_tcp_allreduce(nodes, block, s, link);
  plan.us = intra_allreduce(n, s, p) + best_tcp_allreduce(nodes, block, s, link);
  if (nodes < 2 || local < 2 || !(chunk > 0) || n <= chunk) return plan;
  // Pipelined (hierarchical.cc: allreduce_pipelined): every chunk pays its node phases,
  // which overlap the ring between nodes, except the first chunk's reduce-scatter and
  // the last one's allgather (about one chunk's node phases); the ring moves its bytes
  // once and pays a latency per chunk and per step.
  const double chunks = std::ceil(n / chunk);
  const double part = static_cast<double>(nodes - 1) / nodes * block;
  const double ring = 2 * part * (1e-3 / link.tcp_gbps) + reduce_us(p, part) +
                      (chunks + 2 * (nodes - 1)) * p.tcp_alpha_us;
  const double node_phases = intra_allreduce(chunk, s, p);
  const double pipelined = std::max(chunks * node_phases, ring) + node_phases;
  if (pipelined < plan.us) plan = {Algorithm::kRing, true, pipelined};
  return plan;
}

}  // namespace cost

}  // namespace chorus::communicator
