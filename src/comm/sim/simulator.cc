#include "comm/sim/simulator.h"

#include <algorithm>
#include <cstdio>

#include "comm/transport/call_header.h"

namespace chorus::sim {

RankEnv::RankEnv(Engine& engine, int rank) : e_(engine), rank_(rank), t_(engine, rank) {}

const Topology& RankEnv::topology() {
  if (topology_) return *topology_;
  const Network& net = e_.network();
  Topology& t = topology_.emplace();
  t.nodes = net.nodes();
  t.node = net.node_of(rank_);
  t.node_of.resize(size());
  t.node_ranks.resize(t.nodes);
  for (int r = 0; r < size(); ++r) {
    t.node_of[r] = net.node_of(r);
    t.node_ranks[t.node_of[r]].push_back(r);
  }
  const std::vector<int>& mine = t.node_ranks[t.node];
  t.local_size = static_cast<int>(mine.size());
  t.local_rank = rank_ - mine.front();
  return t;
}

algorithms::Context RankEnv::begin(const char* name, DataType dtype, bool reduces, ReduceOp op,
                                   uint64_t count, int root, size_t segment_bytes) {
  // No deadline: the engine bounds every wait itself (Options, engine.h).
  t_.begin(transport::collective_op(name, ++seq_, dtype, reduces, op, count, root,
                                    Deadline(std::chrono::milliseconds(0))));
  ReduceFn fn = reduces ? reduce_function(dtype, op) : nullptr;
  ReduceManyFn many = reduces ? reduce_many_function(dtype, op) : nullptr;
  const bool charged = reduces && e_.model().reduce_rate > 0;
  if (charged) e_.set_reduce(rank_, fn, many, dtype_size(dtype));
  algorithms::Context ctx{t_,       rank_,     size(),   dtype,         dtype_size(dtype),
                          charged ? &Engine::charged_reduce : fn,
                          reduces && op == ReduceOp::kAvg,
                          scratch_, segment_bytes, topology(), op, nullptr, nullptr, *tuning_};
  if (many != nullptr) ctx.reduce_many = charged ? &Engine::charged_reduce_many : many;
  return ctx;
}

namespace {

// Root causes (not PeerError) first, then by rank; at most `shown` of them.
std::string failure_text(const Engine& e, size_t shown) {
  std::vector<RankFailure> f = e.failures();
  std::stable_sort(f.begin(), f.end(), [](const RankFailure& a, const RankFailure& b) {
    return a.peer_error != b.peer_error ? !a.peer_error : a.rank < b.rank;
  });
  std::string s = "simulation failed on " + std::to_string(f.size()) + " of " +
                  std::to_string(e.size()) + " ranks";
  if (!e.stop_reason().empty()) s += ": " + e.stop_reason();
  for (size_t i = 0; i < f.size() && i < shown; ++i) {
    s += "\n  rank " + std::to_string(f[i].rank) + ": " + f[i].message;
  }
  if (f.size() > shown) s += "\n  ... and " + std::to_string(f.size() - shown) + " more";
  return s;
}

}  // namespace

Result Simulator::run(int ranks, int ranks_per_node, const LinkModel& model,
                      const std::function<void(RankEnv&)>& body) const {
  Engine engine(ranks, ranks_per_node, model, options_);
  engine.run([&](int rank) {
    RankEnv env(engine, rank);
    body(env);
  });
  if (!engine.failures().empty() || !engine.stop_reason().empty()) {
    std::vector<int> failed;
    for (const RankFailure& f : engine.failures()) failed.push_back(f.rank);
    std::sort(failed.begin(), failed.end());
    const ErrorKind kind = engine.stop_reason().empty() ? engine.failures().front().kind
                                                        : ErrorKind::kTimeout;
    throw SimulationError(kind, failure_text(engine, 8), std::move(failed));
  }
  Result r;
  for (int q = 0; q < ranks; ++q) {
    const RankTraffic& t = engine.traffic(q);
    r.rank_time.push_back(engine.end_time(q));
    r.traffic.push_back(t);
    r.time = std::max(r.time, engine.end_time(q));
    r.messages += t.messages;
    r.bytes += t.bytes;
    r.max_peers = std::max(r.max_peers, t.peers);
    r.max_streams = std::max(r.max_streams, t.streams);
  }
  r.events = engine.events();
  r.streams = engine.streams();
  return r;
}

std::string format_time(double seconds) {
  char buf[32];
  if (seconds < 1e-3) std::snprintf(buf, sizeof buf, "%.3g us", seconds * 1e6);
  else if (seconds < 1) std::snprintf(buf, sizeof buf, "%.3g ms", seconds * 1e3);
  else std::snprintf(buf, sizeof buf, "%.3g s", seconds);
  return buf;
}

}  // namespace chorus::sim
