#include "comm/communicator/cost_model.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <sstream>

#include "chorus/error.h"

namespace chorus::internal {
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

double hier_allreduce(double n, const Shape& s, const CostParams& p) {
  double intra = s.shm ? shm_reduce_scatter(n, s, p) + shm_allgather(n, s, p)
                       : ring_allreduce(s.local_size, n, s, p);
  return intra + best_tcp_allreduce(s.nodes, n / s.local_size, s, p);
}

// ---- broadcast: binomial tree or pipelined chain over tcp
double tcp_broadcast(int ranks, double n, const Shape& s, const CostParams& p) {
  if (ranks < 2) return 0;
  Link l = tcp(p);
  double tree = std::ceil(std::log2(ranks)) * l.time(n);
  double segments = std::max(1.0, std::ceil(n / static_cast<double>(s.segment_bytes)));
  double chain = (ranks - 1 + segments - 1) * l.time(n / segments);
  return std::min(tree, chain);
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
    {"pair_rd_max_bytes", &algorithms::Tuning::pair_rd_max_bytes, 0},
};

static_assert(std::size(kTuningKeys) * sizeof(size_t) == sizeof(algorithms::Tuning),
              "every field of the tuning table has its key");

const TuningKey* tuning_key(const std::string& name) {
  for (const TuningKey& k : kTuningKeys) {
    if (name == k.name) return &k;
  }
  return nullptr;
}

// `value` of `item` as a whole number of bytes, at least `min`.
size_t parse_bytes(const std::string& item, const std::string& value, size_t min) {
  errno = 0;
  const unsigned long long v = std::strtoull(value.c_str(), nullptr, 10);
  if (value.empty() || value.find_first_not_of("0123456789") != std::string::npos ||
      errno == ERANGE || v > std::numeric_limits<size_t>::max()) {
    throw ConfigError("CHORUS_COST_MODEL: '" + item + "' needs a whole number of bytes after '='");
  }
  if (v < min) {
    throw ConfigError("CHORUS_COST_MODEL: '" + item + "' is below the least value, " +
                      std::to_string(min) + " bytes");
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
      p.tuning.*k->field = parse_bytes(item, value, k->min);
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

double predicted_us(Collective c, Algorithm a, size_t bytes, const Shape& s,
                    const CostParams& p) {
  const double n = static_cast<double>(bytes);
  const double never = std::numeric_limits<double>::infinity();
  const bool one_node_shm = s.shm && s.nodes == 1;
  if (c == Collective::kAllreduce) {
    switch (a) {
      case Algorithm::kRecursiveDoubling: return rd_allreduce(s.size, n, p);
      case Algorithm::kHalvingDoubling: return hd_allreduce(s.size, n, p);
      case Algorithm::kRing: return ring_allreduce(s.size, n, s, p);
      case Algorithm::kShmDirect: return one_node_shm ? shm_allreduce(s.size, n, s, p) : never;
      case Algorithm::kHierarchical: return s.hierarchical ? hier_allreduce(n, s, p) : never;
      default: return never;
    }
  }
  if (c == Collective::kReduceScatter) {  // n: the whole input
    return a == Algorithm::kShmDirect && one_node_shm ? shm_reduce_scatter(n, s, p) : never;
  }
  if (c == Collective::kBroadcast) {
    switch (a) {
      case Algorithm::kShmDirect: return one_node_shm ? shm_broadcast(n, s, p) : never;
      case Algorithm::kHierarchical:
        return s.hierarchical ? tcp_broadcast(s.nodes, n, s, p) +
                                    (s.shm ? shm_broadcast(n, s, p) : tcp_broadcast(s.local_size, n, s, p))
                              : never;
      case Algorithm::kAuto: return tcp_broadcast(s.size, n, s, p);
      default: return never;
    }
  }
  if (c == Collective::kAllgather) {
    switch (a) {
      case Algorithm::kShmDirect: return one_node_shm ? shm_allgather(n, s, p) : never;
      case Algorithm::kHierarchical:
        return s.hierarchical ? (s.shm ? shm_allgather(n / s.nodes, s, p)
                                       : tcp_allgather(s.local_size, n / s.nodes, p)) +
                                    tcp_allgather(s.nodes, n, p)
                              : never;
      case Algorithm::kRing: return tcp_allgather(s.size, n, p);
      default: return never;
    }
  }
  return never;
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

}  // namespace chorus::internal
