// The simulator (src/comm/sim, docs/simulator.md): every flat algorithm of
// algorithms.h, and the hierarchical ones, over SimTransport, with results checked against the closed forms of
// tests/util/expected.h, on small worlds (1..8 ranks, counts 0, 1 and odd ones) and
// on 1,024 ranks in nodes of 8 (Sim1024.*: the suites that scripts/sanitize.sh thread
// leaves out); its errors (a deadlock, a mismatched call); its determinism; and its
// times against the alpha-beta formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "comm/algorithms/algorithms.h"
#include "comm/communicator/cost_model.h"
#include "comm/communicator/plan.h"
#include "comm/sim/simulator.h"
#include "util/expected.h"

namespace chorus {
namespace {

namespace alg = algorithms;
using sim::LinkModel;
using sim::RankEnv;
using sim::Result;
using sim::Simulator;
using test::check_move;
using test::fill_move;
using test::fill_reduce_input;
using test::ReduceExpectation;
using Bytes = std::vector<uint8_t>;

// A network with no NIC limit and free reductions: the textbook alpha-beta model.
LinkModel flat_model(double alpha, double beta) {
  LinkModel m;
  m.intra_alpha = m.inter_alpha = alpha;
  m.intra_beta = m.inter_beta = beta;
  m.nic_bandwidth = 0;
  m.reduce_rate = 0;
  return m;
}

std::string at(const char* algo, const RankEnv& env, DataType d, size_t n, int root = -1) {
  std::string s = std::string(algo) + " " + dtype_name(d) + " count " + std::to_string(n) +
                  " of " + std::to_string(env.size()) + " ranks, rank " + std::to_string(env.rank());
  return root < 0 ? s : s + ", root " + std::to_string(root);
}

// ---- one case of each family, checked on every rank

using AllreduceFn = void (*)(const alg::Context&, const void*, void*, size_t);
using ReduceAlgoFn = void (*)(const alg::Context&, const void*, void*, size_t, int);
using BroadcastFn = void (*)(const alg::Context&, void*, size_t, int);

void allreduce_case(RankEnv& env, const char* name, AllreduceFn fn, DataType d, ReduceOp op,
                    size_t n) {
  const size_t elem = dtype_size(d);
  Bytes in(n * elem), out(n * elem);
  fill_reduce_input(d, op, env.rank(), in.data(), 0, n);
  fn(env.begin("allreduce", d, true, op, n), in.data(), out.data(), n);
  EXPECT_EQ(ReduceExpectation(d, op, env.size()).count_wrong(out.data(), 0, n, 0), 0u)
      << at(name, env, d, n);
}

void reduce_scatter_case(RankEnv& env, const char* name, AllreduceFn fn, DataType d, ReduceOp op, size_t n) {
  const size_t elem = dtype_size(d), total = n * env.size();
  Bytes in(total * elem), out(n * elem);
  fill_reduce_input(d, op, env.rank(), in.data(), 0, total);
  fn(env.begin("reduce_scatter", d, true, op, n), in.data(), out.data(), n);
  EXPECT_EQ(ReduceExpectation(d, op, env.size())
                .count_wrong(out.data(), static_cast<size_t>(env.rank()) * n, n, 0),
            0u)
      << at(name, env, d, n);
}

void reduce_case(RankEnv& env, const char* name, ReduceAlgoFn fn, DataType d, ReduceOp op,
                 size_t n, int root) {
  const size_t elem = dtype_size(d);
  Bytes in(n * elem), out(n * elem);
  fill_reduce_input(d, op, env.rank(), in.data(), 0, n);
  fn(env.begin("reduce", d, true, op, n, root), in.data(), out.data(), n, root);
  if (env.rank() != root) return;
  EXPECT_EQ(ReduceExpectation(d, op, env.size()).count_wrong(out.data(), 0, n, 0), 0u)
      << at(name, env, d, n, root);
}

void broadcast_case(RankEnv& env, const char* name, BroadcastFn fn, DataType d, size_t n,
                    int root) {
  Bytes buf(n * dtype_size(d));
  if (env.rank() == root) fill_move(d, root, buf.data(), 0, n);
  fn(env.begin("broadcast", d, false, ReduceOp::kSum, n, root), buf.data(), n, root);
  EXPECT_EQ(check_move(d, root, buf.data(), 0, n), "") << at(name, env, d, n, root);
}

void allgatherv_case(RankEnv& env, DataType d, size_t n) {
  const int size = env.size(), rank = env.rank();
  const size_t elem = dtype_size(d);
  std::vector<size_t> counts(size), displs(size);
  size_t total = 0;
  for (int r = 0; r < size; ++r) {  // uneven: n, n + 1, n + 2, n, ...
    counts[r] = n + static_cast<size_t>(r % 3);
    displs[r] = total;
    total += counts[r];
  }
  Bytes in(counts[rank] * elem), out(total * elem);
  fill_move(d, rank, in.data(), 0, counts[rank]);
  const uint64_t digest = transport::counts_digest(counts.data(), counts.size());
  alg::allgatherv_ring(env.begin("allgatherv", d, false, ReduceOp::kSum, digest), in.data(),
                       out.data(), counts, displs);
  for (int r = 0; r < size; ++r) {
    EXPECT_EQ(check_move(d, r, out.data() + displs[r] * elem, 0, counts[r]), "")
        << at("allgatherv_ring", env, d, n) << ", block " << r;
  }
}

// The direct algorithms, or the binomial trees (`tree`).
void gather_scatter_case(RankEnv& env, DataType d, size_t n, int root, bool tree = false) {
  const int size = env.size(), rank = env.rank();
  const size_t elem = dtype_size(d), total = n * size;
  const char* gather_name = tree ? "gather_binomial" : "gather_direct";
  const char* scatter_name = tree ? "scatter_binomial" : "scatter_direct";
  Bytes in(n * elem), all(total * elem);
  fill_move(d, rank, in.data(), 0, n);
  (tree ? alg::gather_binomial : alg::gather_direct)(env.begin("gather", d, false, ReduceOp::kSum, n, root),
                                                     in.data(), all.data(), n, root);
  if (rank == root) {
    for (int r = 0; r < size; ++r) {
      EXPECT_EQ(check_move(d, r, all.data() + r * n * elem, 0, n), "")
          << at(gather_name, env, d, n, root) << ", block " << r;
    }
    fill_move(d, root, all.data(), 0, total);
  }
  Bytes mine(n * elem);
  (tree ? alg::scatter_binomial : alg::scatter_direct)(env.begin("scatter", d, false, ReduceOp::kSum, n, root),
                                                       all.data(), mine.data(), n, root);
  EXPECT_EQ(check_move(d, root, mine.data(), static_cast<size_t>(rank) * n, n), "")
      << at(scatter_name, env, d, n, root);
}

// Rank `from` sends c(from, to) = n + (from + 2 to) % 3 elements to `to` (none when n is
// 0), packed in rank order; with `agreed` through alltoallv_agreed over the transport
// (the communicator's path wherever the node's segment does not carry it: counts, data
// and the ranks' findings), else alltoallv_pairwise.
void alltoallv_case(RankEnv& env, DataType d, size_t n, bool agreed = false) {
  const int size = env.size(), rank = env.rank();
  const size_t elem = dtype_size(d);
  auto c = [&](int from, int to) { return n == 0 ? size_t{0} : n + static_cast<size_t>((from + 2 * to) % 3); };
  std::vector<size_t> sc(size), sd(size), rc(size), rd(size);
  size_t send_total = 0, recv_total = 0;
  for (int q = 0; q < size; ++q) {
    sc[q] = c(rank, q), sd[q] = send_total, send_total += sc[q];
    rc[q] = c(q, rank), rd[q] = recv_total, recv_total += rc[q];
  }
  Bytes in(send_total * elem), out(recv_total * elem);
  fill_move(d, rank, in.data(), 0, send_total);
  const alg::Context ctx = env.begin("alltoallv", d, false, ReduceOp::kSum, 0);
  if (agreed) {
    alg::alltoallv_agreed(ctx, nullptr, in.data(), sc, sd, out.data(), rc, rd);
  } else {
    alg::alltoallv_pairwise(ctx, in.data(), sc, sd, out.data(), rc, rd);
  }
  for (int q = 0; q < size; ++q) {
    size_t first = 0;  // where q sent it from: the blocks of q's lower destinations
    for (int p = 0; p < rank; ++p) first += c(q, p);
    EXPECT_EQ(check_move(d, q, out.data() + rd[q] * elem, first, rc[q]), "")
        << at(agreed ? "alltoallv_agreed" : "alltoallv_pairwise", env, d, n) << ", from rank " << q;
  }
}

using AllgatherFn = void (*)(const alg::Context&, const void*, void*, size_t);

// Alltoall of equal blocks by Bruck's algorithm: block q of the output is block `rank`
// of rank q's input.
void alltoall_bruck_case(RankEnv& env, DataType d, size_t n) {
  const int size = env.size(), rank = env.rank();
  const size_t elem = dtype_size(d), total = n * size;
  Bytes in(total * elem), out(total * elem);
  fill_move(d, rank, in.data(), 0, total);
  alg::alltoall_bruck(env.begin("alltoall", d, false, ReduceOp::kSum, n), in.data(), out.data(), n);
  for (int q = 0; q < size; ++q) {
    EXPECT_EQ(check_move(d, q, out.data() + q * n * elem, static_cast<size_t>(rank) * n, n), "")
        << at("alltoall_bruck", env, d, n) << ", from rank " << q;
  }
}

void allgather_case(RankEnv& env, const char* name, AllgatherFn fn, DataType d, size_t n) {
  const size_t elem = dtype_size(d);
  Bytes in(n * elem), out(n * env.size() * elem);
  fill_move(d, env.rank(), in.data(), 0, n);
  fn(env.begin("allgather", d, false, ReduceOp::kSum, n), in.data(), out.data(), n);
  for (int r = 0; r < env.size(); ++r) {
    EXPECT_EQ(check_move(d, r, out.data() + r * n * elem, 0, n), "") << at(name, env, d, n) << ", block " << r;
  }
}

// The hierarchical algorithms over the simulator's nodes (flat ones where the nodes
// are not uniform); root size - 1; the allgather of `gathered` elements per rank.
void hierarchical_algorithms(RankEnv& env, DataType d, ReduceOp op, size_t n, size_t gathered) {
  allreduce_case(env, "allreduce_hierarchical", communicator::planned_allreduce_hierarchical, d, op, n);
  broadcast_case(env, "broadcast_hierarchical", communicator::planned_broadcast_hierarchical, d, n, env.size() - 1);
  allgather_case(env, "allgather_hierarchical", alg::allgather_hierarchical, d, gathered);
}

// Every flat algorithm at count n, in one simulated run: reductions in `d` with `op`,
// data movement in `d`; roots 0 and size - 1.
void all_algorithms(RankEnv& env, DataType d, ReduceOp op, size_t n) {
  allreduce_case(env, "allreduce_ring", alg::allreduce_ring, d, op, n);
  allreduce_case(env, "allreduce_recursive_doubling", alg::allreduce_recursive_doubling, d, op, n);
  allreduce_case(env, "allreduce_halving_doubling", alg::allreduce_halving_doubling, d, op, n);
  reduce_scatter_case(env, "reduce_scatter_ring", alg::reduce_scatter_ring, d, op, n);
  reduce_scatter_case(env, "reduce_scatter_halving", alg::reduce_scatter_halving, d, op, n);
  allgatherv_case(env, d, n);
  allgather_case(env, "allgather_bruck", alg::allgather_bruck, d, n);
  for (int root : {0, env.size() - 1}) {
    broadcast_case(env, "broadcast_binomial", alg::broadcast_binomial, d, n, root);
    broadcast_case(env, "broadcast_chain", alg::broadcast_chain, d, n, root);
    reduce_case(env, "reduce_binomial", alg::reduce_binomial, d, op, n, root);
    reduce_case(env, "reduce_ring", alg::reduce_ring, d, op, n, root);
    gather_scatter_case(env, d, n, root);
    gather_scatter_case(env, d, n, root, true);
  }
  alltoallv_case(env, d, n);
  alltoallv_case(env, d, n, true);
  alltoall_bruck_case(env, d, n);
  alg::barrier_dissemination(env.begin("barrier", DataType::kUInt8, false, ReduceOp::kSum, 0));
}

// ---- small worlds: sizes 1..8 (odd ones fold), counts 0, 1 and odd, two nodes where
// there are two ranks or more (so both link kinds and the NICs are used; uniform ones,
// for the hierarchical algorithms, at even sizes).

class SimSmall : public testing::TestWithParam<int> {};

TEST_P(SimSmall, EveryFlatAlgorithm) {
  const int size = GetParam();
  Simulator sim;
  for (size_t n : {0, 1, 7, 1001}) {
    sim.run(size, (size + 1) / 2, LinkModel{}, [&](RankEnv& env) {
      all_algorithms(env, DataType::kInt32, ReduceOp::kSum, n);
      all_algorithms(env, DataType::kFloat32, ReduceOp::kMax, n);
      hierarchical_algorithms(env, DataType::kInt32, ReduceOp::kSum, n, n);
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, SimSmall, testing::Range(1, 9));

// ---- 1,024 ranks in nodes of 8

constexpr int kRanks = 1024, kPerNode = 8;

TEST(Sim1024, Allreduce) {
  Result r = Simulator().run(kRanks, kPerNode, LinkModel{}, [](RankEnv& env) {
    allreduce_case(env, "allreduce_ring", alg::allreduce_ring, DataType::kInt32, ReduceOp::kSum, 1001);
    allreduce_case(env, "allreduce_recursive_doubling", alg::allreduce_recursive_doubling,
                   DataType::kInt32, ReduceOp::kSum, 1001);
    allreduce_case(env, "allreduce_halving_doubling", alg::allreduce_halving_doubling,
                   DataType::kFloat32, ReduceOp::kMax, 1001);
  });
  EXPECT_GT(r.time, 0);
  // The ring's two neighbours and recursive doubling's log2(1024) partners, one of them
  // a neighbour (r ^ 1).
  EXPECT_EQ(r.max_peers, 11u);
}

TEST(Sim1024, ReduceScatterAllgatherv) {
  Simulator().run(kRanks, kPerNode, LinkModel{}, [](RankEnv& env) {
    reduce_scatter_case(env, "reduce_scatter_ring", alg::reduce_scatter_ring, DataType::kInt32, ReduceOp::kSum, 3);
    reduce_scatter_case(env, "reduce_scatter_halving", alg::reduce_scatter_halving, DataType::kFloat32,
                        ReduceOp::kMax, 3);
    allgatherv_case(env, DataType::kFloat32, 3);
    allgather_case(env, "allgather_bruck", alg::allgather_bruck, DataType::kFloat32, 3);
    allgather_case(env, "allgather_bruck", alg::allgather_bruck, DataType::kInt64, 1);
  });
}

TEST(Sim1024, BroadcastReduce) {
  Simulator().run(kRanks, kPerNode, LinkModel{}, [](RankEnv& env) {
    for (int root : {0, 777}) {
      broadcast_case(env, "broadcast_binomial", alg::broadcast_binomial, DataType::kFloat32, 1001, root);
      broadcast_case(env, "broadcast_chain", alg::broadcast_chain, DataType::kFloat32, 1001, root);
      reduce_case(env, "reduce_binomial", alg::reduce_binomial, DataType::kInt32, ReduceOp::kSum, 1001, root);
      reduce_case(env, "reduce_ring", alg::reduce_ring, DataType::kInt32, ReduceOp::kSum, 1001, root);
    }
  });
}

TEST(Sim1024, GatherScatterBarrier) {
  Simulator().run(kRanks, kPerNode, LinkModel{}, [](RankEnv& env) {
    gather_scatter_case(env, DataType::kInt64, 5, 1023);
    gather_scatter_case(env, DataType::kInt64, 5, 1023, true);
    gather_scatter_case(env, DataType::kInt64, 3, 0, true);
    alg::barrier_dissemination(env.begin("barrier", DataType::kUInt8, false, ReduceOp::kSum, 0));
  });
}

// Bruck's alltoall at 1,024 ranks talks to 2 log2 N - 1 peers (rank + 2^k and rank -
// 2^k) instead of N - 1, and takes its formula's ceil(log2 N) latencies (a flat network,
// bytes free).
TEST(Sim1024, AlltoallBruckTalksToLog2Peers) {
  Result r = Simulator().run(kRanks, kPerNode, LinkModel{}, [](RankEnv& env) {
    alltoall_bruck_case(env, DataType::kInt64, 1);
  });
  EXPECT_EQ(r.max_peers, 19u);
  const double alpha = 5e-6;
  communicator::CostParams count;
  count.tcp_alpha_us = 1;
  count.tcp_gbps = count.shm_gbps = 1e12;
  communicator::Shape shape;
  shape.size = shape.nodes = kRanks;
  const double rounds = communicator::predicted_us(Collective::kAlltoall, Algorithm::kBruck, 8 * kRanks, shape, count);
  EXPECT_NEAR(rounds, 10, 0.01);
  r = Simulator().run(kRanks, 1, flat_model(alpha, 1e12), [](RankEnv& env) {
    alltoall_bruck_case(env, DataType::kFloat64, 1);
  });
  EXPECT_NEAR(r.time, rounds * alpha, 0.01 * rounds * alpha);
}

// The sockets a rank of a 1,024-rank job holds when its tcp transport opens one
// stream per direction on first use (connections by use, docs/architecture.md): the
// one-way streams each algorithm of allreduce, broadcast, reduce_scatter, allgather
// and barrier sends or receives on, alone and all in one job. The bound is 64.
TEST(Sim1024, SocketsPerRankOfEachCollective) {
  using Body = std::function<void(RankEnv&)>;
  const std::vector<std::pair<const char*, Body>> cases = {
      {"allreduce ring", [](RankEnv& env) {
         allreduce_case(env, "allreduce_ring", alg::allreduce_ring, DataType::kInt32, ReduceOp::kSum, 1001);
       }},
      {"allreduce recursive doubling", [](RankEnv& env) {
         allreduce_case(env, "allreduce_recursive_doubling", alg::allreduce_recursive_doubling,
                        DataType::kInt32, ReduceOp::kSum, 1001);
       }},
      {"allreduce halving-doubling", [](RankEnv& env) {
         allreduce_case(env, "allreduce_halving_doubling", alg::allreduce_halving_doubling,
                        DataType::kInt32, ReduceOp::kSum, 1001);
       }},
      {"broadcast binomial", [](RankEnv& env) {
         broadcast_case(env, "broadcast_binomial", alg::broadcast_binomial, DataType::kFloat32, 1001, 0);
       }},
      {"broadcast chain", [](RankEnv& env) {
         broadcast_case(env, "broadcast_chain", alg::broadcast_chain, DataType::kFloat32, 1001, 0);
       }},
      {"reduce_scatter ring", [](RankEnv& env) {
         reduce_scatter_case(env, "reduce_scatter_ring", alg::reduce_scatter_ring, DataType::kInt32,
                             ReduceOp::kSum, 3);
       }},
      {"reduce_scatter halving", [](RankEnv& env) {
         reduce_scatter_case(env, "reduce_scatter_halving", alg::reduce_scatter_halving, DataType::kInt32,
                             ReduceOp::kSum, 3);
       }},
      {"allgather bruck", [](RankEnv& env) {
         allgather_case(env, "allgather_bruck", alg::allgather_bruck, DataType::kFloat32, 3);
       }},
      {"allgather ring", [](RankEnv& env) { allgatherv_case(env, DataType::kFloat32, 3); }},
      {"barrier dissemination", [](RankEnv& env) {
         alg::barrier_dissemination(env.begin("barrier", DataType::kUInt8, false, ReduceOp::kSum, 0));
       }},
  };
  // Over tcp alone (a node per rank), where every stream is a socket.
  for (const auto& [name, body] : cases) {
    Result r = Simulator().run(kRanks, 1, LinkModel{}, body);
    std::printf("[ sockets  ] 1,024 ranks, %s: at most %u sockets a rank\n", name, r.max_streams);
    EXPECT_LE(r.max_streams, 2 * 11u) << name;  // 2 log2 N + the ring's neighbours
  }
  Result all = Simulator().run(kRanks, 1, LinkModel{}, [&](RankEnv& env) {
    for (const auto& c : cases) c.second(env);
  });
  std::printf("[ sockets  ] 1,024 ranks, all of them in one job: at most %u sockets a rank\n",
              all.max_streams);
  EXPECT_LE(all.max_streams, 64u);
}

TEST(Sim1024, AlltoallvTalksToEveryRank) {
  Result r = Simulator().run(kRanks, kPerNode, LinkModel{}, [](RankEnv& env) {
    alltoallv_case(env, DataType::kInt64, 1);
    alltoallv_case(env, DataType::kInt64, 1, true);  // the communicator's, counts checked
  });
  EXPECT_EQ(r.max_peers, static_cast<uint32_t>(kRanks - 1));
}

TEST(Sim1024, Hierarchical) {
  Result r = Simulator().run(kRanks, kPerNode, LinkModel{}, [](RankEnv& env) {
    hierarchical_algorithms(env, DataType::kInt64, ReduceOp::kSum, 1001, 3);
  });
  EXPECT_GT(r.time, 0);
}

// ---- errors: never a hang

// The SimulationError that running `body` ends in (a test failure when it returns).
sim::SimulationError failure(int ranks, int per_node, const std::function<void(RankEnv&)>& body,
                             const LinkModel& model = {}, const sim::Options& options = {}) {
  try {
    Simulator(options).run(ranks, per_node, model, body);
  } catch (const sim::SimulationError& e) {
    return e;
  }
  ADD_FAILURE() << "the run must fail";
  return sim::SimulationError(ErrorKind::kSystem, "", {});
}

// `m` contains `part`, as a gtest check that prints `m` otherwise.
testing::AssertionResult has(const std::string& m, const std::string& part) {
  if (m.find(part) != std::string::npos) return testing::AssertionSuccess();
  return testing::AssertionFailure() << "no \"" << part << "\" in: " << m;
}

TEST(SimErrors, DeadlockNamesTheStuckRanks) {
  const sim::SimulationError e = failure(4, 2, [](RankEnv& env) {
    env.begin("allreduce", DataType::kFloat64, true, ReduceOp::kSum, 1);
    double x = 0;
    transport::Transport& t = env.transport();
    t.wait(t.irecv((env.rank() + 1) % env.size(), &x, sizeof x));  // nobody sends
  });
  EXPECT_TRUE(has(e.what(), "simulated deadlock"));
  EXPECT_TRUE(has(e.what(), "allreduce #1 timed out on rank 2 (host node1)"));
  EXPECT_TRUE(has(e.what(), "to receive 8 bytes from rank 3"));
  EXPECT_EQ(e.failed_ranks(), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(e.kind(), ErrorKind::kTimeout);
}

TEST(SimErrors, RootsThatDisagreeDeadlockOrMismatch) {
  failure(5, 5, [](RankEnv& env) {
    std::vector<float> buf(10);
    const int root = env.rank() == 3 ? 1 : 0;
    alg::broadcast_binomial(env.begin("broadcast", DataType::kFloat32, false, ReduceOp::kSum, 10, root),
                            buf.data(), 10, root);
  });
}

TEST(SimErrors, MismatchedCountNamesBothCalls) {
  const sim::SimulationError e = failure(2, 1, [](RankEnv& env) {
    const size_t n = env.rank() == 0 ? 4 : 5;
    std::vector<float> in(n, 1), out(n);
    alg::allreduce_recursive_doubling(env.begin("allreduce", DataType::kFloat32, true, ReduceOp::kSum, n),
                                      in.data(), out.data(), n);
  });
  EXPECT_TRUE(has(e.what(), "rank 1 called allreduce #1 with f32 × 5, sum"));
  EXPECT_EQ(e.kind(), ErrorKind::kPeer);
}

// Rank 1 expects one element more, or one fewer, from rank 0 than rank 0 sends it: every
// rank throws InvalidArgumentError naming both sides (and, but on rank 1, the rank that
// found it), and nothing breaks: the same ranks' next alltoallv moves every block. Up to
// 64 ranks the findings go pairwise behind the data, beyond by an allreduce and a
// broadcast (alltoallv_agreed.cc); 65 and 100 ranks take the second way.
TEST(SimErrors, AlltoallvCountsThatDisagreeFailOnEveryRank) {
  for (int ranks : {2, 3, 8, 65, 100}) {
    for (int delta : {1, -1}) {
      SCOPED_TRACE(std::to_string(ranks) + " ranks, rank 1 expects 2" + (delta > 0 ? "+1" : "-1"));
      std::vector<std::string> what(ranks);
      Simulator().run(ranks, (ranks + 1) / 2, LinkModel{}, [&](RankEnv& env) {
        const int rank = env.rank();
        std::vector<size_t> sc(ranks, 2), rc(ranks, 2), sd(ranks), rd(ranks);
        if (rank == 1) rc[0] = static_cast<size_t>(2 + delta);
        for (int q = 0; q < ranks; ++q) sd[q] = 2 * q, rd[q] = 3 * q;
        std::vector<int32_t> in(2 * ranks, rank), out(3 * ranks, -1);
        try {
          alg::alltoallv_agreed(env.begin("alltoallv", DataType::kInt32, false, ReduceOp::kSum, 0), nullptr,
                                in.data(), sc, sd, out.data(), rc, rd);
        } catch (const InvalidArgumentError& e) {
          what[rank] = e.what();
        }
        alltoallv_case(env, DataType::kInt64, 5, true);  // int32 cannot tell 100 ranks' values apart
      });
      const std::string both = "rank 0 sends 2 elements to rank 1, which expects " + std::to_string(2 + delta);
      for (int r = 0; r < ranks; ++r) {
        EXPECT_TRUE(has(what[r], both)) << "rank " << r;
        EXPECT_EQ(what[r].find("found by rank 1") != std::string::npos, r != 1) << what[r];
      }
    }
  }
}

TEST(SimErrors, AThrowingRankFailsItsPeers) {
  const sim::SimulationError e = failure(3, 3, [](RankEnv& env) {
    if (env.rank() == 2) throw InvalidArgumentError("rank 2 gave up");
    alg::barrier_dissemination(env.begin("barrier", DataType::kUInt8, false, ReduceOp::kSum, 0));
  });
  const std::string m = e.what();
  EXPECT_TRUE(has(m, "rank 2: rank 2 gave up"));
  EXPECT_LT(m.find("rank 2 gave up"), m.find("rank 2 aborted")) << "the root cause first: " << m;
}

TEST(SimErrors, ARankThatLeftFailsTheWaitsOnIt) {
  const sim::SimulationError e = failure(2, 2, [](RankEnv& env) {
    env.begin("broadcast", DataType::kFloat32, false, ReduceOp::kSum, 1, 1);
    transport::Transport& t = env.transport();
    float x = 0;
    if (env.rank() == 1) return t.close();
    t.wait(t.irecv(1, &x, sizeof x));
  });
  EXPECT_TRUE(has(e.what(), "broadcast #1 failed on rank 0 (host node0): rank 1 left the communicator"));
  EXPECT_EQ(e.failed_ranks(), std::vector<int>{0});
}

TEST(SimErrors, InterruptAbortsTheWait) {
  const sim::SimulationError e = failure(2, 1, [](RankEnv& env) {
    env.begin("barrier", DataType::kUInt8, false, ReduceOp::kSum, 0);
    transport::Transport& t = env.transport();
    uint8_t x = 0;
    if (env.rank() == 0) t.interrupt("the user asked");
    t.wait(t.irecv(1 - env.rank(), &x, 1));
  });
  EXPECT_TRUE(has(e.what(), "barrier #1 on rank 0 (host node0) was aborted: the user asked"));
}

// Two ranks play ping-pong for 10 ms of simulated time; the limit is 1 ms.
TEST(SimErrors, PastTheTimeLimitEveryWaitEnds) {
  sim::Options options;
  options.max_time = 1e-3;
  const sim::SimulationError e = failure(
      2, 1,
      [](RankEnv& env) {
        env.begin("barrier", DataType::kUInt8, false, ReduceOp::kSum, 0);
        transport::Transport& t = env.transport();
        uint8_t x = 0;
        for (int i = 0; i < 500; ++i) {
          if ((i + env.rank()) % 2 == 0) t.wait(t.isend(1 - env.rank(), &x, 1));
          else t.wait(t.irecv(1 - env.rank(), &x, 1));
        }
      },
      flat_model(10e-6, 1e9), options);
  EXPECT_TRUE(has(e.what(), "simulated time passed the limit"));
  EXPECT_EQ(e.kind(), ErrorKind::kTimeout);
}

// ---- determinism and the model's times

// wait_for() waits slices of virtual time: rank 1 computes for 1 ms (a charged
// reduction) before it sends, rank 0 polls in slices of 100 us.
TEST(SimTime, WaitForSlicesAreVirtual) {
  LinkModel m = flat_model(1e-6, 1e9);
  m.reduce_rate = 1e6;  // 1000 bytes: 1 ms
  int slices = 0;
  double polled_at = 0;
  Simulator().run(2, 1, m, [&](RankEnv& env) {
    alg::Context ctx = env.begin("allreduce", DataType::kUInt8, true, ReduceOp::kSum, 1000);
    transport::Transport& t = env.transport();
    std::vector<uint8_t> a(1000, 1), b(1000, 2);
    if (env.rank() == 1) {
      ctx.reduce(a.data(), a.data(), b.data(), a.size());
      t.wait(t.isend(0, a.data(), a.size()));
      return;
    }
    transport::Request r = t.irecv(1, b.data(), b.size());
    while (!t.wait_for(&r, std::chrono::microseconds(100))) {
      ++slices;
      polled_at = env.now();
    }
    EXPECT_EQ(b[999], 3);
  });
  EXPECT_EQ(slices, 10);
  EXPECT_NEAR(polled_at, 1e-3, 1e-9);
}


TEST(SimTime, SameRunSameTimes) {
  auto once = [] {
    return Simulator().run(64, 8, LinkModel{}, [](RankEnv& env) {
      allreduce_case(env, "allreduce_ring", alg::allreduce_ring, DataType::kFloat32, ReduceOp::kSum, 4099);
      alg::barrier_dissemination(env.begin("barrier", DataType::kUInt8, false, ReduceOp::kSum, 0));
    });
  };
  const Result a = once(), b = once();
  EXPECT_EQ(a.rank_time, b.rank_time);
  EXPECT_EQ(a.events, b.events);
  EXPECT_GT(a.time, 0);
}

// Ring allreduce of n bytes on N ranks, one per node, no NIC limit: 2 (N - 1) steps of
// alpha + n / (N beta) (one segment per chunk).
TEST(SimTime, RingAllreduceFollowsAlphaBeta) {
  const int N = 16;
  const double alpha = 10e-6, beta = 1e9;
  const size_t count = 256 * 1024;  // 1 MiB of f32
  const double bytes = count * 4.0;
  Result r = Simulator().run(N, 1, flat_model(alpha, beta), [&](RankEnv& env) {
    std::vector<float> buf(count, 1.0f);
    alg::allreduce_ring(env.begin("allreduce", DataType::kFloat32, true, ReduceOp::kSum, count),
                        buf.data(), buf.data(), count);
    EXPECT_EQ(buf[count - 1], static_cast<float>(N));
  });
  const double formula = 2.0 * (N - 1) * (alpha + bytes / (N * beta));
  EXPECT_NEAR(r.time, formula, 0.02 * formula);
}

// Recursive doubling of 8 bytes: log2 N exchanges of one latency each.
TEST(Sim1024, RecursiveDoublingScalesWithLog2) {
  const double alpha = 5e-6, beta = 10e9;
  for (int N : {16, 128, 1024}) {
    Result r = Simulator().run(N, 1, flat_model(alpha, beta), [](RankEnv& env) {
      double x = 1;
      alg::allreduce_recursive_doubling(
          env.begin("allreduce", DataType::kFloat64, true, ReduceOp::kSum, 1), &x, &x, 1);
    });
    const double formula = std::log2(N) * (alpha + 8 / beta);
    EXPECT_NEAR(r.time, formula, 0.01 * formula) << N << " ranks";
  }
}

// An allgather of 8 bytes per rank on 1,024 ranks (and 1,000: not a power of two), one
// per node: Bruck takes ceil(log2 N) rounds of one latency each (its messages grow to
// half the result: 4 KiB at the last round), the ring N - 1 (issue 42).
TEST(Sim1024, BruckAllgatherScalesWithLog2) {
  const double alpha = 5e-6, beta = 10e9;
  for (int N : {1000, 1024}) {
    auto time = [&](AllgatherFn fn) {
      return Simulator().run(N, 1, flat_model(alpha, beta), [fn](RankEnv& env) {
        allgather_case(env, "allgather", fn, DataType::kFloat64, 1);
      }).time;
    };
    const double bruck = time(alg::allgather_bruck);
    const double ring = time([](const alg::Context& c, const void* in, void* out, size_t count) {
      std::vector<size_t> counts(c.size, count), displs(c.size);
      for (int r = 0; r < c.size; ++r) displs[r] = static_cast<size_t>(r) * count;
      alg::allgatherv_ring(c, in, out, counts, displs);
    });
    const double rounds = std::ceil(std::log2(N));  // 10
    EXPECT_NEAR(bruck, rounds * alpha + (N - 1) * 8 / beta, 0.01 * rounds * alpha) << N << " ranks";
    EXPECT_NEAR(ring, (N - 1) * (alpha + 8 / beta), 0.01 * (N - 1) * alpha) << N << " ranks";
    EXPECT_LT(bruck * 50, ring) << N << " ranks";
  }
}

// The algorithms the plan takes for small calls at scale (issue 42), 8 bytes a block on
// 1,000 and 1,024 ranks, one per node: recursive halving's reduce_scatter and the
// binomial gather and scatter take the latencies their cost formulas count
// (cost_model.h, with a latency of one and free bytes), or fewer: ceil(log2 N) give or
// take the fold, where the ring's reduce_scatter takes N - 1.
TEST(Sim1024, SmallCallAlgorithmsTakeTheirFormulasLatencies) {
  const double alpha = 5e-6, beta = 1e12;
  communicator::CostParams count;
  count.tcp_alpha_us = count.shm_alpha_us = 1;
  count.tcp_gbps = count.shm_gbps = count.reduce_gbps = 1e12;
  for (int N : {1000, 1024}) {
    communicator::Shape shape;
    shape.size = shape.nodes = N;
    auto simulated = [&](const std::function<void(RankEnv&)>& body) {
      return Simulator().run(N, 1, flat_model(alpha, beta), body).time;
    };
    const double halving = simulated([](RankEnv& env) {
      reduce_scatter_case(env, "reduce_scatter_halving", alg::reduce_scatter_halving, DataType::kFloat64,
                          ReduceOp::kSum, 1);
    });
    const double ring = simulated([](RankEnv& env) {
      reduce_scatter_case(env, "reduce_scatter_ring", alg::reduce_scatter_ring, DataType::kFloat64, ReduceOp::kSum, 1);
    });
    const double gather_scatter = simulated([](RankEnv& env) {
      gather_scatter_case(env, DataType::kFloat64, 1, 7, true);
    });
    auto latencies = [&](Collective c, Algorithm a, size_t bytes) {
      return communicator::predicted_us(c, a, bytes, shape, count);
    };
    const double hd_steps = latencies(Collective::kReduceScatter, Algorithm::kHalvingDoubling, 8 * N);
    const double tree_steps = latencies(Collective::kGather, Algorithm::kBinomialTree, 8) +
                              latencies(Collective::kScatter, Algorithm::kBinomialTree, 8);
    EXPECT_NEAR(halving, hd_steps * alpha, 0.01 * hd_steps * alpha) << N << " ranks";
    EXPECT_NEAR(ring, (N - 1) * alpha, 0.01 * (N - 1) * alpha) << N << " ranks";
    // The trees' depth: the formulas count ceil(log2 N) rounds a tree; the simulator
    // overlaps a rank's messages with several peers, which leaves the height of the
    // tree, floor(log2 N) (the same at 1,024).
    const double height = 2 * std::floor(std::log2(N));
    EXPECT_NEAR(gather_scatter, height * alpha, 0.01 * height * alpha) << N << " ranks";
    EXPECT_LE(gather_scatter, tree_steps * alpha * 1.01) << N << " ranks";
    EXPECT_LE(hd_steps, std::ceil(std::log2(N)) + 2) << N << " ranks";
    EXPECT_NEAR(tree_steps, 2 * std::ceil(std::log2(N)), 0.01) << N << " ranks";
  }
}

// Eight ranks of one node each send 1 MiB to a rank of the other node: their NIC
// carries them one after another.
TEST(SimTime, NodesShareTheirNic) {
  LinkModel m = flat_model(10e-6, 10e9);
  m.nic_bandwidth = 1e9;
  const size_t bytes = 1 << 20;
  Result r = Simulator().run(16, 8, m, [&](RankEnv& env) {
    std::vector<uint8_t> buf(bytes);
    transport::Transport& t = env.transport();
    env.begin("alltoall", DataType::kUInt8, false, ReduceOp::kSum, bytes);
    if (env.rank() < 8) t.wait(t.isend(env.rank() + 8, buf.data(), bytes));
    else t.wait(t.irecv(env.rank() - 8, buf.data(), bytes));
  });
  const double formula = 10e-6 + 8 * bytes / 1e9;
  EXPECT_NEAR(r.time, formula, 0.01 * formula);
  EXPECT_EQ(r.messages, 8u);
  EXPECT_EQ(r.bytes, 8u * bytes);
}

// A NIC with a token bucket (nic_burst, as tbf shapes a link) passes what its tokens
// cover at the line's speed and a long run at its rate, and an idle spell refills it.
// Rank 0 times its sends (a send completes when its last byte has left: each receive is
// posted in time): a 500 KB message from a full bucket of 1 MB at the 10 GB/s line;
// 100 MB in 1 MB messages right after it, from the 550 KB of tokens left, which last
// 550 KB x 10 / 9 of bytes at the line (they drain at 10 - 1 GB/s), the rest at 1 GB/s;
// then, 10 ms later (a charged reduction on both ranks), 500 KB at the line again.
TEST(SimTime, ShapedNicBurstsThenKeepsItsRate) {
  LinkModel m = flat_model(10e-6, 10e9);
  m.nic_bandwidth = 1e9;
  m.nic_burst = 1e6;
  m.reduce_rate = 1e9;
  const size_t small = 500'000, big = 1'000'000, idle = 10'000'000;
  const int runs = 100;
  std::vector<double> took;
  Simulator().run(2, 1, m, [&](RankEnv& env) {
    alg::Context ctx = env.begin("alltoall", DataType::kUInt8, true, ReduceOp::kSum, 0);
    transport::Transport& t = env.transport();
    std::vector<uint8_t> buf(idle);
    auto pass = [&](size_t bytes, int count) {
      const double start = env.now();
      for (int i = 0; i < count; ++i) {
        t.wait(env.rank() == 0 ? t.isend(1, buf.data(), bytes) : t.irecv(0, buf.data(), bytes));
      }
      if (env.rank() == 0) took.push_back(env.now() - start);
    };
    pass(small, 1);
    pass(big, runs);
    ctx.reduce(buf.data(), buf.data(), buf.data(), idle);
    pass(small, 1);
  });
  ASSERT_EQ(took.size(), 3u);
  EXPECT_NEAR(took[0], small / 10e9, 1e-12);
  const double at_line = (1e6 - 0.9 * small) * 10 / 9;
  EXPECT_NEAR(took[1], at_line / 10e9 + (runs * big - at_line) / 1e9, 1e-9);
  EXPECT_NEAR(took[2], small / 10e9, 1e-12);
}

// A charged reduction takes bytes / reduce_rate: the ring's N - 1 reductions of a chunk
// add (N - 1) n / (N rate).
TEST(SimTime, ReductionsAreCharged) {
  const int N = 8;
  const size_t count = 64 * 1024;
  auto run = [&](double rate) {
    LinkModel m = flat_model(1e-6, 1e9);
    m.reduce_rate = rate;
    return Simulator().run(N, 1, m, [&](RankEnv& env) {
      std::vector<float> buf(count, 1.0f);
      alg::allreduce_ring(env.begin("allreduce", DataType::kFloat32, true, ReduceOp::kSum, count),
                          buf.data(), buf.data(), count);
    }).time;
  };
  const double extra = run(1e9) - run(0);
  const double formula = (N - 1) * (count * 4.0 / N) / 1e9;
  EXPECT_NEAR(extra, formula, 0.02 * formula);
}

}  // namespace
}  // namespace chorus
