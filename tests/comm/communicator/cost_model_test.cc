// The cost model that picks algorithms: its parameters, and that its choices follow
// the shape of the communicator the way the measurements behind the defaults did.
#include <gtest/gtest.h>

#include <cmath>

#include "chorus/communicator.h"
#include "chorus/error.h"
#include "chorus/store.h"
#include "comm/communicator/cost_model.h"

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

}  // namespace
}  // namespace chorus::communicator
