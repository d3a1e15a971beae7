// chorus-sim: runs one collective with one algorithm of src/comm/algorithms (a flat
// one, or hierarchical over the simulated nodes) on --ranks simulated ranks (nodes of
// --ranks-per-node consecutive ranks) over the link model of the options, and prints
// its simulated time and bandwidths as nccl-tests does (a table row, or with --json one
// JSON object):
//   algbw = bytes / time;  busbw = algbw * factor, factor 2(N-1)/N for allreduce,
//   (N-1)/N for reduce_scatter, allgather, alltoall, gather and scatter, 1 for
//   broadcast and reduce.
// --bytes is nccl-tests' size: the buffer of allreduce, broadcast and reduce; the whole
// output of allgather and gather, the whole input of reduce_scatter and scatter, each
// rank's whole send buffer of alltoall and of sendrecv (so every rank holds about
// --bytes, twice for out-of-place collectives; allreduce runs in place). Elements are
// f32; the results are not checked here (tests/comm/sim/sim_test.cc does).
// The time is that of one operation from a common start (the last rank's return), or
// with --bench-iters N as chorus-bench takes it: --bench-warmup operations, a barrier,
// then N operations back to back, the average per operation, the maximum over the ranks
// (bench/validate_sim.sh compares the two programs row by row).
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "chorus/version.h"
#include "comm/algorithms/algorithms.h"
#include "comm/communicator/plan.h"
#include "comm/sim/simulator.h"

namespace chorus::sim {
namespace {

namespace alg = algorithms;
constexpr DataType kType = DataType::kFloat32;
constexpr size_t kElem = 4;

struct Case {
  size_t count = 0;  // elements per rank's block (or buffer: allreduce, broadcast, reduce)
  size_t segment = kDefaultSegmentBytes;
};

struct Algorithm {
  const char* collective;
  double bus_factor_n;  // busbw factor numerator: times (N - 1) / N, or 0: factor 1
  std::function<void(RankEnv&, const Case&)> run;
};

std::vector<float> block(size_t n) { return std::vector<float>(n, 1.0f); }

// Counts and displacements of `n` blocks of `count` elements each, back to back.
std::pair<std::vector<size_t>, std::vector<size_t>> even_blocks(size_t n, size_t count) {
  std::vector<size_t> counts(n, count), displs(n);
  for (size_t r = 0; r < n; ++r) displs[r] = r * count;
  return {counts, displs};
}

// The algorithms of one signature: an allreduce in place (one buffer per rank), a
// broadcast and a reduce from root 0 (output on the root only). Every one gets the
// segment size; those that do not pipeline ignore it.
using AllreduceFn = void (*)(const alg::Context&, const void*, void*, size_t);
using BroadcastFn = void (*)(const alg::Context&, void*, size_t, int);
using RootedReduceFn = void (*)(const alg::Context&, const void*, void*, size_t, int);

Algorithm allreduce(AllreduceFn fn) {
  return {"allreduce", 2, [fn](RankEnv& env, const Case& c) {
            std::vector<float> buf = block(c.count);
            fn(env.begin("allreduce", kType, true, ReduceOp::kSum, c.count, -1, c.segment), buf.data(),
               buf.data(), c.count);
          }};
}

// Equal blocks, each rank's already at its place in the output (in place).
Algorithm allgather(AllreduceFn fn) {
  return {"allgather", 1, [fn](RankEnv& env, const Case& c) {
            std::vector<float> out = block(c.count * env.size());
            fn(env.begin("allgather", kType, false, ReduceOp::kSum, c.count), out.data() + env.rank() * c.count,
               out.data(), c.count);
          }};
}

Algorithm broadcast(BroadcastFn fn) {
  return {"broadcast", 0, [fn](RankEnv& env, const Case& c) {
            std::vector<float> buf = block(c.count);
            fn(env.begin("broadcast", kType, false, ReduceOp::kSum, c.count, 0, c.segment), buf.data(),
               c.count, 0);
          }};
}

Algorithm reduce(RootedReduceFn fn) {
  return {"reduce", 0, [fn](RankEnv& env, const Case& c) {
            std::vector<float> in = block(c.count), out = block(env.rank() == 0 ? c.count : 0);
            fn(env.begin("reduce", kType, true, ReduceOp::kSum, c.count, 0, c.segment), in.data(),
               out.data(), c.count, 0);
          }};
}

// The cost model's parameters the hierarchical algorithms' plan reads (--cost-model).
communicator::CostParams& cost_params() {
  static communicator::CostParams params;
  return params;
}

// What a communicator of this shape plans inside a hierarchical call, with those
// parameters (communicator/plan.h).
alg::HierarchicalChoice planned(const alg::Context& ctx, size_t count) {
  communicator::CostParams p = cost_params();
  p.tuning = ctx.tuning;
  return communicator::hierarchical_choice(p, communicator::shape_of(ctx), ctx.topology, count, ctx.elem);
}

// Gather to root 0 (its output only on the root), scatter from root 0.
Algorithm gather(RootedReduceFn fn) {
  return {"gather", 1, [fn](RankEnv& env, const Case& c) {
            std::vector<float> in = block(c.count), out = block(env.rank() == 0 ? c.count * env.size() : 0);
            fn(env.begin("gather", kType, false, ReduceOp::kSum, c.count, 0), in.data(), out.data(), c.count, 0);
          }};
}

Algorithm scatter(RootedReduceFn fn) {
  return {"scatter", 1, [fn](RankEnv& env, const Case& c) {
            std::vector<float> in = block(env.rank() == 0 ? c.count * env.size() : 0), out = block(c.count);
            fn(env.begin("scatter", kType, false, ReduceOp::kSum, c.count, 0), in.data(), out.data(), c.count, 0);
          }};
}

const std::map<std::string, Algorithm>& algorithms_table() {
  static const std::map<std::string, Algorithm> table = {
      {"allreduce:ring", allreduce(alg::allreduce_ring)},
      {"allreduce:recursive_doubling", allreduce(alg::allreduce_recursive_doubling)},
      {"allreduce:halving_doubling", allreduce(alg::allreduce_halving_doubling)},
      {"allreduce:hierarchical", allreduce([](const alg::Context& ctx, const void* in, void* out, size_t count) {
         alg::allreduce_hierarchical(ctx, planned(ctx, count), in, out, count);
       })},
      {"reduce_scatter:ring", {"reduce_scatter", 1, [](RankEnv& env, const Case& c) {
         std::vector<float> in = block(c.count * env.size()), out = block(c.count);
         alg::reduce_scatter_ring(env.begin("reduce_scatter", kType, true, ReduceOp::kSum, c.count, -1, c.segment),
                                  in.data(), out.data(), c.count);
       }}},
      {"reduce_scatter:halving", {"reduce_scatter", 1, [](RankEnv& env, const Case& c) {
         std::vector<float> in = block(c.count * env.size()), out = block(c.count);
         alg::reduce_scatter_halving(env.begin("reduce_scatter", kType, true, ReduceOp::kSum, c.count), in.data(),
                                     out.data(), c.count);
       }}},
      {"allgather:ring", {"allgather", 1, [](RankEnv& env, const Case& c) {
         const size_t n = env.size();
         auto [counts, displs] = even_blocks(n, c.count);
         std::vector<float> out = block(c.count * n);
         alg::allgatherv_ring(env.begin("allgatherv", kType, false, ReduceOp::kSum,
                                        transport::counts_digest(counts.data(), n), -1, c.segment),
                              out.data() + env.rank() * c.count, out.data(), counts, displs);
       }}},
      {"allgather:hierarchical", allgather(alg::allgather_hierarchical)},
      {"allgather:bruck", allgather(alg::allgather_bruck)},
      {"broadcast:binomial", broadcast(alg::broadcast_binomial)},
      {"broadcast:hierarchical", broadcast([](const alg::Context& ctx, void* buf, size_t count, int root) {
         alg::broadcast_hierarchical(ctx, planned(ctx, count), buf, count, root);
       })},
      {"broadcast:chain", broadcast(alg::broadcast_chain)},
      {"reduce:binomial", reduce(alg::reduce_binomial)},
      {"reduce:ring", reduce(alg::reduce_ring)},
      {"gather:direct", gather(alg::gather_direct)},
      {"gather:binomial", gather(alg::gather_binomial)},
      {"scatter:direct", scatter(alg::scatter_direct)},
      {"scatter:binomial", scatter(alg::scatter_binomial)},
      {"alltoall:pairwise", {"alltoall", 1, [](RankEnv& env, const Case& c) {
         const size_t n = env.size();
         auto [counts, displs] = even_blocks(n, c.count);
         std::vector<float> in = block(c.count * n), out = block(c.count * n);
         alg::alltoallv_pairwise(env.begin("alltoallv", kType, false, ReduceOp::kSum, 0), in.data(), counts,
                                 displs, out.data(), counts, displs);
       }}},
      {"alltoall:bruck", {"alltoall", 1, [](RankEnv& env, const Case& c) {
         std::vector<float> in = block(c.count * env.size()), out = block(c.count * env.size());
         alg::alltoall_bruck(env.begin("alltoall", kType, false, ReduceOp::kSum, c.count), in.data(), out.data(),
                             c.count);
       }}},
      {"barrier:dissemination", {"barrier", 0, [](RankEnv& env, const Case&) {
         alg::barrier_dissemination(env.begin("barrier", DataType::kUInt8, false, ReduceOp::kSum, 0));
       }}},
      // chorus-bench's sendrecv: even ranks send to rank + 1, then receive from rank - 1;
      // odd ranks receive first, then send. The communicator runs a rank's operations one
      // at a time in issue order, so on 2 ranks this is a ping-pong: two one-way trips.
      {"sendrecv:shift", {"sendrecv", 0, [](RankEnv& env, const Case& c) {
         const int n = env.size(), next = (env.rank() + 1) % n, prev = (env.rank() + n - 1) % n;
         std::vector<float> in = block(c.count), out = block(c.count);
         const size_t bytes = c.count * kElem;
         env.begin("send", kType, false, ReduceOp::kSum, c.count);
         transport::Transport& t = env.transport();
         if (env.rank() % 2 == 0) {
           t.wait(t.isend(next, in.data(), bytes));
           t.wait(t.irecv(prev, out.data(), bytes));
         } else {
           t.wait(t.irecv(prev, out.data(), bytes));
           t.wait(t.isend(next, in.data(), bytes));
         }
       }}},
  };
  return table;
}

struct Args {
  std::string collective = "allreduce", algorithm = "ring";
  int ranks = 64, ranks_per_node = 8;
  size_t bytes = 1 << 20, segment = kDefaultSegmentBytes;
  int bench_iters = 0;  // 0: one operation, timed to the last rank's return
  int bench_warmup = 0;  // with bench_iters: operations before the barrier
  LinkModel model;
  std::string cost_model;
  bool json = false;
  bool predict = false, shm = false;
};

Args parse(int argc, char** argv) {
  Args o;
  double intra_alpha_us = o.model.intra_alpha * 1e6, inter_alpha_us = o.model.inter_alpha * 1e6;
  double intra_gbs = o.model.intra_beta / 1e9, inter_gbs = o.model.inter_beta / 1e9;
  double nic_gbs = o.model.nic_bandwidth / 1e9, reduce_gbs = o.model.reduce_rate / 1e9;
  size_t nic_burst = 0;
  CLI::App app{"one collective on simulated ranks, in virtual time (docs/simulator.md)", "chorus-sim"};
  app.set_version_flag("--version", std::string("chorus-sim ") + CHORUS_VERSION);
  app.add_option("-o,--collective", o.collective, "allreduce, reduce_scatter, allgather, broadcast, "
                 "reduce, gather, scatter, alltoall, barrier, sendrecv");
  app.add_option("-a,--algorithm", o.algorithm, "ring, recursive_doubling, halving_doubling, halving, binomial, "
                 "chain, bruck, direct, pairwise, dissemination, hierarchical, shift (which exist for the collective)");
  app.add_option("-n,--ranks", o.ranks, "simulated ranks")->check(CLI::Range(1, 1 << 16));
  app.add_option("--ranks-per-node", o.ranks_per_node, "consecutive ranks per node")->check(CLI::Range(1, 1 << 16));
  app.add_option("-b,--bytes", o.bytes, "size as nccl-tests counts it (K/M/G suffixes)")
      ->transform(CLI::AsSizeValue(false));
  app.add_option("--segment", o.segment, "pipelining segment of ring and chain, bytes")
      ->transform(CLI::AsSizeValue(false));
  app.add_option("--intra-alpha-us", intra_alpha_us, "latency within a node, microseconds");
  app.add_option("--intra-gbs", intra_gbs, "bandwidth of a stream within a node, GB/s");
  app.add_option("--inter-alpha-us", inter_alpha_us, "latency between nodes, microseconds");
  app.add_option("--inter-gbs", inter_gbs, "bandwidth of a stream between nodes, GB/s");
  app.add_option("--nic-gbs", nic_gbs, "a node's NIC, each direction, GB/s (0: unlimited)");
  app.add_option("--reduce-gbs", reduce_gbs, "reduction output per rank, GB/s (0: free)");
  app.add_option("--cost-model", o.cost_model, "the cost model's parameters for the hierarchical algorithms' "
                 "inner choice, as CHORUS_COST_MODEL takes them (e.g. tcp_alpha_us=10,tcp_gbps=12.5; "
                 "default: the built-in ones, docs/environment.md)");
  app.add_flag("--predict", o.predict, "simulate nothing: print the plan's automatic choice for the collective "
               "and the cost model's prediction of it (--algorithm is ignored; the link options are not read)");
  app.add_flag("--shm", o.shm, "with --predict: the ranks of a node share a segment (a real node; the simulator "
               "has none)");
  app.add_option("--bench-iters", o.bench_iters, "time as chorus-bench does: a barrier, then N operations "
                 "back to back; the average per operation, the maximum over the ranks (0: one operation)")
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--bench-warmup", o.bench_warmup, "with --bench-iters: operations before the barrier, "
                 "as chorus-bench's warm-up (they leave streams, NICs and buckets busy or drained)")
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--nic-burst", nic_burst, "a NIC's token bucket, bytes (K/M suffixes), as tbf's burst: "
                 "traffic it covers passes at --inter-gbs, the rest at --nic-gbs (0: no bucket)")
      ->transform(CLI::AsSizeValue(false));
  app.add_flag("--json", o.json, "print one JSON object");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e));
  }
  o.model = LinkModel{intra_alpha_us * 1e-6, intra_gbs * 1e9, inter_alpha_us * 1e-6,
                      inter_gbs * 1e9, nic_gbs * 1e9, reduce_gbs * 1e9, static_cast<double>(nic_burst)};
  return o;
}

// Elements of one rank's block (see the header for what --bytes counts).
size_t block_count(const Algorithm& a, const Args& o) {
  const std::string c = a.collective;
  const bool per_rank = c == "reduce_scatter" || c == "allgather" || c == "gather" ||
                        c == "scatter" || c == "alltoall";
  return (per_rank ? o.bytes / o.ranks : o.bytes) / kElem;
}

long peak_rss_kib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

// The busbw factor of a collective (nccl-tests').
double bus_factor(const std::string& collective, double n) {
  if (collective == "allreduce") return 2 * (n - 1) / n;
  if (collective == "broadcast" || collective == "reduce") return 1;
  return (n - 1) / n;
}

// --predict: what a communicator of this shape chooses over tcp (communicator/plan.h:
// tcp_choice(), and inside a hierarchical allreduce hierarchical_choice()) and the
// cost model's time for it.
int predict(const Args& o) {
  const std::optional<Collective> c = parse_collective(o.collective);
  if (!c) {
    std::fprintf(stderr, "chorus-sim: unknown collective %s\n", o.collective.c_str());
    return 2;
  }
  const communicator::CostParams p = communicator::parse_cost_params(o.cost_model);
  communicator::Shape s;
  s.size = o.ranks;
  s.local_size = std::min(o.ranks_per_node, o.ranks);
  s.nodes = (o.ranks + s.local_size - 1) / s.local_size;
  s.shm = o.shm && s.local_size > 1;
  s.hierarchical = s.nodes > 1 && s.local_size > 1 && o.ranks % s.local_size == 0;
  // Call::bytes: one rank's block for gather and scatter, nccl-tests' size otherwise.
  const bool per_block = *c == Collective::kGather || *c == Collective::kScatter;
  const size_t bytes = per_block ? o.bytes / o.ranks : o.bytes;
  const chorus::Algorithm a = communicator::tcp_choice(*c, bytes, s, p, s.hierarchical);
  const double us = communicator::predicted_us(*c, a, bytes, s, p);
  std::string inside = "";
  if (a == chorus::Algorithm::kHierarchical && *c == Collective::kAllreduce) {
    const communicator::cost::HierarchicalPlan plan =
        communicator::cost::hierarchical_plan(static_cast<double>(o.bytes),
                                              static_cast<double>(p.tuning.hier_chunk_bytes), s, p);
    inside = std::string(algorithm_name(plan.cross)) + (plan.pipelined ? " pipelined" : "");
  }
  const double algbw = us > 0 ? static_cast<double>(o.bytes) / (us * 1e-6) / 1e9 : 0;
  const double busbw = algbw * bus_factor(o.collective, o.ranks);
  if (o.json) {
    std::printf("{\"collective\": \"%s\", \"chosen\": \"%s\", \"between_nodes\": \"%s\", \"ranks\": %d, "
                "\"ranks_per_node\": %d, \"shm\": %s, \"bytes\": %zu, \"predicted_us\": %.3f, "
                "\"algbw_gbs\": %.4f, \"busbw_gbs\": %.4f}\n",
                o.collective.c_str(), algorithm_name(a), inside.c_str(), o.ranks, s.local_size,
                s.shm ? "true" : "false", o.bytes, us, algbw, busbw);
    return 0;
  }
  std::printf("%-15s %-6s %-14s %6s %5s %12s %14s %9s %9s\n", "collective", "chosen", "between nodes", "ranks",
              "/node", "bytes", "predicted(us)", "algbw", "busbw");
  std::printf("%-15s %-6s %-14s %6d %5d %12zu %14.3f %9.3f %9.3f\n", o.collective.c_str(), algorithm_name(a),
              inside.empty() ? "-" : inside.c_str(), o.ranks, s.local_size, o.bytes, us, algbw, busbw);
  return 0;
}

int run(const Args& o) {
  if (o.predict) return predict(o);
  auto it = algorithms_table().find(o.collective + ":" + o.algorithm);
  if (it == algorithms_table().end()) {
    std::fprintf(stderr, "chorus-sim: no algorithm %s for %s; there are:", o.algorithm.c_str(),
                 o.collective.c_str());
    for (const auto& [name, algorithm] : algorithms_table()) std::fprintf(stderr, " %s", name.c_str());
    std::fprintf(stderr, "\n");
    return 2;
  }
  const Algorithm& a = it->second;
  cost_params() = communicator::parse_cost_params(o.cost_model);
  const Case c{block_count(a, o), o.segment};
  const auto start = std::chrono::steady_clock::now();
  const Algorithm& barrier = algorithms_table().at("barrier:dissemination");
  std::vector<double> per_op(o.ranks, 0);  // --bench-iters: each rank's average
  const Result r = Simulator().run(o.ranks, o.ranks_per_node, o.model, [&](RankEnv& env) {
    if (o.bench_iters == 0) return a.run(env, c);
    for (int i = 0; i < o.bench_warmup; ++i) a.run(env, c);
    barrier.run(env, c);
    const double begun = env.now();
    for (int i = 0; i < o.bench_iters; ++i) a.run(env, c);
    per_op[env.rank()] = (env.now() - begun) / o.bench_iters;
  });
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double time = o.bench_iters == 0 ? r.time : *std::max_element(per_op.begin(), per_op.end());
  const double n = o.ranks, bytes = a.collective == std::string("barrier") ? 0 : static_cast<double>(o.bytes);
  const double algbw = time > 0 ? bytes / time / 1e9 : 0;
  const double busbw = algbw * (a.bus_factor_n > 0 ? a.bus_factor_n * (n - 1) / n : 1);
  if (o.json) {
    std::printf("{\"collective\": \"%s\", \"algorithm\": \"%s\", \"ranks\": %d, \"ranks_per_node\": %d, "
                "\"bytes\": %zu, \"bench_iters\": %d, \"time_us\": %.3f, \"algbw_gbs\": %.4f, "
                "\"busbw_gbs\": %.4f, \"messages\": %llu, \"max_peers\": %u, \"max_streams\": %u, "
                "\"events\": %llu, \"wall_s\": %.3f, \"peak_rss_mib\": %.1f}\n",
                a.collective, o.algorithm.c_str(), o.ranks, o.ranks_per_node, o.bytes, o.bench_iters, time * 1e6, algbw,
                busbw, static_cast<unsigned long long>(r.messages), r.max_peers, r.max_streams,
                static_cast<unsigned long long>(r.events), wall, peak_rss_kib() / 1024.0);
    return 0;
  }
  std::printf("%-15s %-19s %6s %5s %10s %12s %9s %9s %10s %6s %8s %8s\n", "collective", "algorithm", "ranks",
              "/node", "bytes", "time(us)", "algbw", "busbw", "messages", "peers", "wall(s)", "rss(MiB)");
  std::printf("%-15s %-19s %6d %5d %10zu %12.3f %9.3f %9.3f %10llu %6u %8.2f %8.1f\n", a.collective,
              o.algorithm.c_str(), o.ranks, o.ranks_per_node, o.bytes, time * 1e6, algbw, busbw,
              static_cast<unsigned long long>(r.messages), r.max_peers, wall, peak_rss_kib() / 1024.0);
  return 0;
}

}  // namespace
}  // namespace chorus::sim

int main(int argc, char** argv) {
  const chorus::sim::Args o = chorus::sim::parse(argc, argv);
  try {
    return chorus::sim::run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "chorus-sim: %s\n", e.what());
    return 1;
  }
}
