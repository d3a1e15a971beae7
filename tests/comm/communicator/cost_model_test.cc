// The cost model that picks algorithms: its parameters, and that its choices follow
// the shape of the communicator the way the measurements behind the defaults did.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "chorus/communicator.h"
#include "chorus/error.h"
#include "chorus/store.h"
#include "comm/communicator/cost_model.h"
#include "comm/communicator/plan.h"

namespace chorus::communicator {
namespace {

constexpr Algorithm kFlat[] = {Algorithm::kRecursiveDoubling, Algorithm::kHalvingDoubling,
                               Algorithm::kRing};

// CHORUS_COST_MODEL and CHORUS_SHM_CMA are read once, by CommOptions::from_env(); the
// communicator takes what its options say.
TEST(CostModel, TheCommunicatorTakesItsOptionsNotTheEnvironment) {
  CommOptions options;
  options.cost_model = "speed=3";
  try {
    Communicator::create(std::make_shared<InMemoryStore>(), 0, 1, options);
    ADD_FAILURE() << "a bad cost_model was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown parameter 'speed'"), std::string::npos) << e.what();
  }
  setenv("CHORUS_COST_MODEL", "speed=3", 1);
  setenv("CHORUS_SHM_CMA", "bogus", 1);
  options.cost_model = "tcp_gbps=5";
  options.shm_cma = CommOptions::CrossMemoryAttach::kAnyNode;
  EXPECT_NO_THROW(Communicator::create(std::make_shared<InMemoryStore>(), 0, 1, options));
  EXPECT_THROW(CommOptions::from_env(), ConfigError);
  unsetenv("CHORUS_SHM_CMA");
  EXPECT_THROW(CommOptions::from_env(), ConfigError);  // the cost model's
  setenv("CHORUS_COST_MODEL", "tcp_gbps=5", 1);
  setenv("CHORUS_SHM_CMA", "all", 1);
  CommOptions read = CommOptions::from_env();
  EXPECT_EQ(read.cost_model, "tcp_gbps=5");
  EXPECT_EQ(read.shm_cma, CommOptions::CrossMemoryAttach::kAnyNode);
  unsetenv("CHORUS_COST_MODEL");
  setenv("CHORUS_SHM_CMA", "0", 1);
  EXPECT_EQ(CommOptions::from_env().shm_cma, CommOptions::CrossMemoryAttach::kOff);
  unsetenv("CHORUS_SHM_CMA");
  EXPECT_EQ(CommOptions::from_env().shm_cma, CommOptions::CrossMemoryAttach::kPairs);
  EXPECT_EQ(CommOptions::from_env().cost_model, "");
}

TEST(CostModel, ParsesParametersAndRejectsBadOnes) {
  CostParams p = parse_cost_params("tcp_alpha_us=20,shm_gbps=12.5");
  EXPECT_EQ(p.tcp_alpha_us, 20);
  EXPECT_EQ(p.shm_gbps, 12.5);
  EXPECT_EQ(p.tcp_gbps, CostParams{}.tcp_gbps);
  EXPECT_EQ(parse_cost_params("").reduce_gbps, CostParams{}.reduce_gbps);
  for (const char* bad : {"tcp_alpha_us", "tcp_alpha_us=", "tcp_alpha_us=0", "tcp_gbps=-1",
                          "tcp_gbps=1x", "speed=3", "tcp_gbps=nan"}) {
    EXPECT_THROW(parse_cost_params(bad), ConfigError) << bad;
  }
  try {
    parse_cost_params("speed=3");
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown parameter 'speed'"), std::string::npos);
  }
}

// The measured thresholds (algorithms/tuning.h) are keys too, by their names: whole
// numbers of bytes, the chunk sizes at least Tuning::kMinChunkBytes. Selection reads
// them from the communicator's own table.
TEST(CostModel, SetsTheThresholdsOfTheTuningTableByName) {
  CostParams p = parse_cost_params("whole_bytes=16384,tcp_gbps=5,tree_limit_bytes=0");
  EXPECT_EQ(p.tuning.whole_bytes, 16384u);
  EXPECT_EQ(p.tuning.tree_limit_bytes, 0u);
  EXPECT_EQ(p.tcp_gbps, 5);
  EXPECT_EQ(p.tuning.pair_chunk_bytes, algorithms::kDefaultTuning.pair_chunk_bytes);
  EXPECT_EQ(parse_cost_params("pair_chunk_bytes=64").tuning.pair_chunk_bytes, 64u);
  for (const char* bad : {"whole_bytes", "whole_bytes=", "whole_bytes=-1", "whole_bytes=1.5",
                          "whole_bytes=8K", "whole_bytes= 8", "whole_bytes=99999999999999999999999",
                          "pair_chunk_bytes=63", "shared_piece_bytes=0", "whole_byte=8"}) {
    EXPECT_THROW(parse_cost_params(bad), ConfigError) << bad;
  }
  try {
    parse_cost_params("shared_chunk_bytes=8");
    ADD_FAILURE() << "a chunk of 8 bytes was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("'shared_chunk_bytes=8' is below the least value, 64 bytes"),
              std::string::npos) << e.what();
  }

  CommOptions options;
  EXPECT_EQ(Communicator::create(std::make_shared<InMemoryStore>(), 0, 1, options)
                ->algorithm_for("broadcast", 8),
            Algorithm::kBinomialTree);
  options.cost_model = "tree_limit_bytes=0";
  EXPECT_EQ(Communicator::create(std::make_shared<InMemoryStore>(), 0, 1, options)
                ->algorithm_for("broadcast", 8),
            Algorithm::kRing);  // chain
}

// Allgather over tcp (issue 42): Bruck's ceil(log2 N) latencies for small results, the
// ring (no copy through a working buffer) for large ones and between two ranks, where
// the two send the same message, and three (two rounds either way).
TEST(CostModel, AllgatherTakesBruckWhenSmallAndTheRingWhenLarge) {
  CostParams p;
  const Algorithm flat[] = {Algorithm::kRing, Algorithm::kBruck};
  for (int size : {4, 5, 8, 1024}) {
    Shape s;
    s.size = size;
    EXPECT_EQ(cheapest(Collective::kAllgather, 8 * size, s, p, flat), Algorithm::kBruck) << size;
    EXPECT_EQ(cheapest(Collective::kAllgather, 256 << 20, s, p, flat), Algorithm::kRing) << size;
  }
  for (int size : {2, 3}) {
    Shape s;
    s.size = size;
    EXPECT_EQ(cheapest(Collective::kAllgather, 8 * size, s, p, flat), Algorithm::kRing) << size;
  }
  Shape big;
  big.size = 1024;
  EXPECT_NEAR(predicted_us(Collective::kAllgather, Algorithm::kBruck, 8, big, p), 10 * p.tcp_alpha_us, 1.0);
  EXPECT_GT(predicted_us(Collective::kAllgather, Algorithm::kRing, 8, big, p), 1023 * p.tcp_alpha_us);
}

TEST(CostModel, LatencyAlgorithmsForSmallBandwidthAlgorithmsForLarge) {
  CostParams p;
  for (int size : {2, 3, 4, 8}) {
    Shape s;
    s.size = size;
    EXPECT_EQ(cheapest(Collective::kAllreduce, 8, s, p, kFlat), Algorithm::kRecursiveDoubling) << size;
    EXPECT_EQ(cheapest(Collective::kAllreduce, 256 << 20, s, p, kFlat), Algorithm::kRing) << size;
  }
  // Two ranks keep recursive doubling up to the measured cut-off, where the formulas
  // alone would take halving-doubling (Tuning::pair_rd_max_bytes), and only two.
  Shape pair;
  pair.size = 2;
  const size_t cut = p.tuning.pair_rd_max_bytes;
  EXPECT_EQ(cheapest(Collective::kAllreduce, 256 << 10, pair, p, kFlat), Algorithm::kRecursiveDoubling);
  EXPECT_EQ(cheapest(Collective::kAllreduce, cut, pair, p, kFlat), Algorithm::kRecursiveDoubling);
  EXPECT_EQ(cheapest(Collective::kAllreduce, 2 * cut, pair, p, kFlat), Algorithm::kHalvingDoubling);
  CostParams no_cut = parse_cost_params("pair_rd_max_bytes=0");
  EXPECT_EQ(cheapest(Collective::kAllreduce, 256 << 10, pair, no_cut, kFlat), Algorithm::kHalvingDoubling);
  Shape four;
  four.size = 4;
  EXPECT_EQ(cheapest(Collective::kAllreduce, 256 << 10, four, p, kFlat), Algorithm::kHalvingDoubling);
  // The predicted time grows with the size for every algorithm.
  Shape s;
  s.size = 5;
  for (Algorithm a : kFlat) {
    EXPECT_LT(predicted_us(Collective::kAllreduce, a, 1024, s, p), predicted_us(Collective::kAllreduce, a, 1 << 20, s, p));
  }
}

TEST(CostModel, SharedMemoryAndHierarchicalOnlyWhereTheShapeAllowsThem) {
  CostParams p;
  const Algorithm all[] = {Algorithm::kRecursiveDoubling, Algorithm::kHalvingDoubling,
                           Algorithm::kRing, Algorithm::kShmDirect, Algorithm::kHierarchical};
  Shape one_node{4, 1, 4, true, false};
  EXPECT_EQ(cheapest(Collective::kAllreduce, 8, one_node, p, all), Algorithm::kShmDirect);
  EXPECT_EQ(cheapest(Collective::kAllreduce, 64 << 20, one_node, p, all), Algorithm::kShmDirect);
  Shape no_shm{4, 1, 4, false, false};
  EXPECT_NE(cheapest(Collective::kAllreduce, 64 << 20, no_shm, p, all), Algorithm::kShmDirect);
  // Two nodes of four: the tcp part of a hierarchical allreduce moves a quarter of the
  // bytes among two ranks instead of everything among eight.
  Shape two_nodes{8, 2, 4, true, true};
  EXPECT_EQ(cheapest(Collective::kAllreduce, 64 << 20, two_nodes, p, all), Algorithm::kHierarchical);
  EXPECT_TRUE(std::isinf(predicted_us(Collective::kAllreduce, Algorithm::kShmDirect, 8, two_nodes, p)));
  Shape uneven{5, 2, 3, true, false};
  EXPECT_TRUE(std::isinf(predicted_us(Collective::kAllreduce, Algorithm::kHierarchical, 8, uneven, p)));
}

// The direct path on node-shared buffers skips the copies into the segment and out of
// it, but takes two phases: predicted faster than the segment path from 256 KiB at every
// group size (so the communicator takes it there), slower for an 8-byte allreduce (one
// phase through the segment), and not at all where the shape has no shared memory.
TEST(CostModel, TheDirectPathIsPredictedFasterThanTheSegmentPath) {
  CostParams p;
  const Collective collectives[] = {Collective::kAllreduce, Collective::kReduceScatter,
                                    Collective::kAllgather, Collective::kBroadcast};
  for (int ranks = 2; ranks <= 8; ++ranks) {
    Shape one_node{ranks, 1, ranks, true, false};
    for (Collective c : collectives) {
      for (size_t bytes = 256 << 10; bytes <= (size_t{256} << 20); bytes *= 4) {
        const double direct = predicted_shared_us(c, bytes, one_node, p);
        const double segment = predicted_us(c, Algorithm::kShmDirect, bytes, one_node, p);
        EXPECT_TRUE(std::isfinite(segment)) << static_cast<int>(c);
        EXPECT_LT(direct, segment) << "ranks " << ranks << " collective " << static_cast<int>(c)
                                   << " bytes " << bytes;
      }
    }
  }
  for (int ranks = 2; ranks <= 8; ++ranks) {
    Shape one_node{ranks, 1, ranks, true, false};
    EXPECT_GT(predicted_shared_us(Collective::kAllreduce, 8, one_node, p),
              predicted_us(Collective::kAllreduce, Algorithm::kShmDirect, 8, one_node, p));
  }
  EXPECT_TRUE(std::isinf(predicted_shared_us(Collective::kAllreduce, 1 << 20, Shape{8, 2, 4, true, true}, p)));
  EXPECT_TRUE(std::isinf(predicted_shared_us(Collective::kAllreduce, 1 << 20, Shape{4, 1, 4, false, false}, p)));
  EXPECT_TRUE(std::isinf(predicted_shared_us(Collective::kAllreduce, 1 << 20, Shape{1, 1, 1, true, false}, p)));
}

// ---- at scale (issue 42): 1,024 to 16,384 ranks, 1 to 256 per node

// Parameters under which a formula counts latencies: one microsecond each, tcp's and
// shared memory's, and links and reductions so fast that 8 bytes cost nothing.
CostParams latency_counter() {
  CostParams p;
  p.tcp_alpha_us = p.shm_alpha_us = 1;
  p.tcp_gbps = p.shm_gbps = p.reduce_gbps = 1e12;
  return p;
}

// The shapes of the grid: N ranks in nodes of `per_node`, the nodes' ranks sharing a
// segment or not (hierarchical where there are several per node).
std::vector<Shape> scale_shapes() {
  std::vector<Shape> shapes;
  for (int n : {1024, 3000, 4096, 16384}) {
    for (int per_node : {1, 2, 8, 64, 256}) {
      if (n % per_node != 0) continue;
      for (bool shm : {false, true}) {
        Shape s;
        s.size = n;
        s.local_size = per_node;
        s.nodes = n / per_node;
        s.shm = shm && per_node > 1;
        s.hierarchical = per_node > 1;
        shapes.push_back(s);
      }
    }
  }
  return shapes;
}

std::string shape_name(const Shape& s) {
  return std::to_string(s.size) + " ranks, " + std::to_string(s.local_size) + " per node" +
         (s.shm ? ", shared memory" : "");
}

// The smallest call of each collective: 8 bytes, one element of 8 bytes per block where
// the call counts blocks (Call::bytes: allgather's and alltoall's whole buffer,
// reduce_scatter's whole input).
size_t eight_bytes(Collective c, int size) {
  const bool blocks = c == Collective::kAllgather || c == Collective::kReduceScatter || c == Collective::kAlltoall;
  return blocks ? size_t{8} * size : 8;
}

constexpr Collective kChosen[] = {Collective::kAllreduce, Collective::kBroadcast, Collective::kReduce,
                                  Collective::kReduceScatter, Collective::kAllgather, Collective::kBarrier,
                                  Collective::kGather, Collective::kScatter, Collective::kAlltoall};

// No 8-byte call takes more than 2 ceil(log2 N) latencies: the automatic choice (with the
// built-in parameters) of every collective the plan chooses for, counted by its formula
// (alltoall: Bruck's, where the pairwise exchange would take N - 1).
TEST(CostModelAtScale, EightByteCallsCostLogNLatencies) {
  const CostParams p, count = latency_counter();
  for (const Shape& s : scale_shapes()) {
    const double log_n = std::ceil(std::log2(s.size));
    for (Collective c : kChosen) {
      const size_t bytes = eight_bytes(c, s.size);
      const Algorithm a = tcp_choice(c, bytes, s, p, s.hierarchical);
      const double latencies = predicted_us(c, a, bytes, s, count);
      const std::string at = std::string(collective_name(c)) + " chose " + algorithm_name(a) + " on " + shape_name(s);
      ASSERT_TRUE(std::isfinite(latencies)) << at;
      EXPECT_LE(latencies, 2 * log_n) << at;
      EXPECT_GE(latencies, 1) << at;  // the counter counts
    }
  }
}

// The choice over the whole grid, 8 B to 1 GiB: always an algorithm the shape runs (a
// finite prediction), never slower by the model than any other candidate, and inside a
// hierarchical call what the model plans (cost::hierarchical_plan), which is what
// allreduce_hier predicts.
TEST(CostModelAtScale, EveryChoiceIsTheModelsCheapestAndRuns) {
  const CostParams p;
  for (const Shape& s : scale_shapes()) {
    for (size_t bytes = 8; bytes <= (size_t{1} << 30); bytes *= 8) {
      for (Collective c : kChosen) {
        const Algorithm a = tcp_choice(c, bytes, s, p, s.hierarchical);
        const double chosen = predicted_us(c, a, bytes, s, p);
        const std::string at = std::string(collective_name(c)) + " " + std::to_string(bytes) + " bytes chose " +
                               algorithm_name(a) + " on " + shape_name(s);
        ASSERT_TRUE(std::isfinite(chosen)) << at;
        for (Algorithm other : costed_rows(c, s.hierarchical, false)) {
          // Broadcast and reduce keep the tree up to the measured tree_limit_bytes.
          if ((c == Collective::kBroadcast || c == Collective::kReduce) && bytes <= p.tuning.tree_limit_bytes &&
              a == Algorithm::kBinomialTree) {
            break;
          }
          EXPECT_LE(chosen, predicted_us(c, other, bytes, s, p)) << at << ", against " << algorithm_name(other);
        }
      }
      if (!s.hierarchical) continue;
      Topology t;
      t.nodes = s.nodes;
      t.local_size = s.local_size;
      const size_t count = bytes / 4;
      const algorithms::HierarchicalChoice how = hierarchical_choice(p, s, t, count, 4);
      const double chunk = static_cast<double>(std::max<size_t>(p.tuning.hier_chunk_bytes / 4, 1) * 4);
      const cost::HierarchicalPlan plan = cost::hierarchical_plan(static_cast<double>(count * 4), chunk, s, p);
      const auto expected = plan.cross == Algorithm::kRecursiveDoubling ? algorithms::allreduce_recursive_doubling
                            : plan.cross == Algorithm::kHalvingDoubling ? algorithms::allreduce_halving_doubling
                                                                         : algorithms::allreduce_ring;
      const std::string at = std::to_string(bytes) + " bytes on " + shape_name(s);
      EXPECT_EQ(how.cross_allreduce, expected) << at;
      EXPECT_EQ(how.chunk_count > 0, plan.pipelined && count * 4 > chunk) << at;
      // What the choice runs is what allreduce_hier predicts.
      const double predicted = predicted_us(Collective::kAllreduce, Algorithm::kHierarchical, count * 4, s, p);
      EXPECT_NEAR(plan.us, predicted, 1e-9 * predicted) << at;
    }
  }
}

// The slow row of performance.md ("At scale"): 1,024 ranks in nodes of 8, 1 MiB. The
// ring among 128 node leaders (254 latencies) was the rule's choice beyond 32 KiB;
// the model takes halving-doubling, not pipelined. On two nodes the measured cut-offs
// still decide: recursive doubling up to 32 KiB a block, halving-doubling up to 1 MiB,
// the ring (pipelined) beyond.
TEST(CostModelAtScale, TheAllreduceBetweenManyNodesIsNotTheRing) {
  const CostParams p;
  Shape s{.size = 1024, .nodes = 128, .local_size = 8, .shm = true, .hierarchical = true};
  Topology t;
  t.nodes = 128;
  t.local_size = 8;
  const size_t count = (1 << 20) / 4;
  algorithms::HierarchicalChoice how = hierarchical_choice(p, s, t, count, 4);
  EXPECT_EQ(how.cross_allreduce, algorithms::allreduce_halving_doubling);
  EXPECT_EQ(how.chunk_count, 0u);
  EXPECT_EQ(how.broadcast, algorithms::broadcast_binomial);

  Shape two{.size = 16, .nodes = 2, .local_size = 8, .shm = true, .hierarchical = true};
  t.nodes = 2;
  const auto cross_at = [&](size_t block_bytes) {
    return hierarchical_choice(p, two, t, block_bytes / 4 * 8, 4);
  };
  EXPECT_EQ(cross_at(32 << 10).cross_allreduce, algorithms::allreduce_recursive_doubling);
  EXPECT_EQ(cross_at(1 << 20).cross_allreduce, algorithms::allreduce_halving_doubling);
  EXPECT_EQ(cross_at(2 << 20).cross_allreduce, algorithms::allreduce_ring);
  EXPECT_GT(cross_at(2 << 20).chunk_count, 0u);
  EXPECT_GT(cross_at(1 << 20).chunk_count, 0u);  // pipelined on two nodes, as measured
}

// Broadcast and reduce on groups larger than those tree_limit_bytes was measured on
// (Tuning::tree_limit_max_ranks) leave the chain's N - 1 latencies to the model; on
// the measured groups the rule holds.
TEST(CostModelAtScale, BroadcastBeyondTheMeasuredGroupsByCost) {
  const CostParams p;
  for (Collective c : {Collective::kBroadcast, Collective::kReduce}) {
    Shape eight{.size = 8, .nodes = 8, .local_size = 1};
    EXPECT_EQ(tcp_choice(c, 1 << 20, eight, p, false), Algorithm::kRing) << collective_name(c);
    EXPECT_EQ(tcp_choice(c, 8, eight, p, false), Algorithm::kBinomialTree) << collective_name(c);
    Shape many{.size = 1024, .nodes = 1024, .local_size = 1};
    EXPECT_EQ(tcp_choice(c, 1 << 20, many, p, false), Algorithm::kBinomialTree) << collective_name(c);
    EXPECT_LT(predicted_us(c, Algorithm::kBinomialTree, 1 << 20, many, p),
              predicted_us(c, Algorithm::kRing, 1 << 20, many, p));
  }
}

// Gather, scatter and reduce_scatter on the groups the measured rules hold for (2 to
// Tuning::tree_limit_max_ranks): direct, and recursive halving up to
// reduce_scatter_halving_max_bytes then the ring; on larger groups the model's trees
// and halving, whose log2 N rounds beat N - 1 there.
TEST(CostModelAtScale, GatherScatterAndReduceScatterOnTheMeasuredGroups) {
  const CostParams p;
  const size_t cut = p.tuning.reduce_scatter_halving_max_bytes;
  for (int n : {2, 3, 4, 5, 8}) {
    Shape s{.size = n, .nodes = n, .local_size = 1};
    for (size_t bytes : {size_t{0}, size_t{8}, size_t{64} << 10, size_t{16} << 20}) {
      EXPECT_EQ(tcp_choice(Collective::kGather, bytes, s, p, false), Algorithm::kAuto) << n << " ranks, " << bytes;
      EXPECT_EQ(tcp_choice(Collective::kScatter, bytes, s, p, false), Algorithm::kAuto) << n << " ranks, " << bytes;
    }
    EXPECT_EQ(tcp_choice(Collective::kReduceScatter, 8 * n, s, p, false), Algorithm::kHalvingDoubling) << n;
    EXPECT_EQ(tcp_choice(Collective::kReduceScatter, cut, s, p, false), Algorithm::kHalvingDoubling) << n;
    EXPECT_EQ(tcp_choice(Collective::kReduceScatter, cut + 1, s, p, false), Algorithm::kRing) << n;
  }
  Shape many{.size = 1024, .nodes = 1024, .local_size = 1};
  EXPECT_EQ(tcp_choice(Collective::kGather, 8, many, p, false), Algorithm::kBinomialTree);
  EXPECT_EQ(tcp_choice(Collective::kScatter, 8, many, p, false), Algorithm::kBinomialTree);
  EXPECT_EQ(tcp_choice(Collective::kReduceScatter, size_t{8} << 20, many, p, false), Algorithm::kHalvingDoubling);
}

}  // namespace
}  // namespace chorus::communicator
