// DistributedSampler against PyTorch's (tests/torch/fixtures/sampler_fixture.json,
// made by scripts/gen_sampler_fixture.py), its checkpoint state, and resuming
// a DataLoader mid-epoch from that state.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fstream>
#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "chorus/torch/data.h"

namespace chorus::data {
namespace {

using json = nlohmann::json;

const json& fixture() {
  static const json cases = [] {
    std::ifstream in(std::string(CHORUS_SOURCE_DIR) + "/tests/torch/fixtures/sampler_fixture.json");
    EXPECT_TRUE(in.good())
        << "fixture missing: run /usr/bin/python3 scripts/gen_sampler_fixture.py";
    return json::parse(in)["cases"];
  }();
  return cases;
}

// Same checksum as the generator: FNV-1a over the indices, one xor per index.
std::string fnv1a64(const std::vector<int64_t>& indices) {
  uint64_t h = 14695981039346656037ull;
  for (int64_t v : indices) h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(h));
  return text;
}

std::vector<int64_t> chorus_indices(const json& c) {
  DistributedSampler sampler(c["n"].get<int64_t>(),
                             {.num_replicas = c["num_replicas"].get<int64_t>(),
                              .rank = c["rank"].get<int64_t>(),
                              .shuffle = c["shuffle"].get<bool>(),
                              .seed = c["seed"].get<uint64_t>(),
                              .drop_last = c["drop_last"].get<bool>()});
  sampler.set_epoch(c["epoch"].get<int64_t>());
  EXPECT_EQ(sampler.num_samples(), c["num_samples"].get<int64_t>()) << c.dump();
  return sampler.epoch_indices();
}

TEST(SamplerFixture, CoversTheGrid) {
  // 10 lengths x 10 (num_replicas, rank) pairs x 2 drop_last x 7 shuffle cases.
  ASSERT_EQ(fixture().size(), 1400u);
  std::set<int64_t> lengths;
  for (const json& c : fixture()) lengths.insert(c["n"].get<int64_t>());
  EXPECT_TRUE(lengths.count(60000));
  EXPECT_TRUE(lengths.count(0));
  EXPECT_TRUE(lengths.count(13));
}

TEST(SamplerFixture, SmallDatasetsMatchPyTorchIndexForIndex) {
  int compared = 0;
  for (const json& c : fixture()) {
    if (!c.contains("indices")) continue;
    ASSERT_EQ(chorus_indices(c), c["indices"].get<std::vector<int64_t>>()) << c.dump();
    ++compared;
  }
  EXPECT_GT(compared, 1000);
}

TEST(SamplerFixture, LargeDatasetsMatchPyTorchChecksums) {
  int compared = 0;
  for (const json& c : fixture()) {
    if (c.contains("indices")) continue;
    std::vector<int64_t> indices = chorus_indices(c);
    auto first = c["first"].get<std::vector<int64_t>>();
    ASSERT_EQ(std::vector<int64_t>(indices.begin(), indices.begin() + first.size()), first)
        << c.dump();
    ASSERT_EQ(fnv1a64(indices), c["fnv1a64"].get<std::string>()) << c.dump();
    ++compared;
  }
  EXPECT_EQ(compared, 280);
}

TEST(DistributedSamplerTest, RanksPartitionTheDataset) {
  for (bool shuffle : {false, true}) {
    std::multiset<int64_t> seen;
    for (int64_t rank = 0; rank < 4; ++rank) {
      DistributedSampler sampler(1000, {.num_replicas = 4, .rank = rank, .shuffle = shuffle});
      sampler.set_epoch(3);
      for (int64_t index : sampler.epoch_indices()) seen.insert(index);
    }
    ASSERT_EQ(seen.size(), 1000u);
    for (int64_t i = 0; i < 1000; ++i) EXPECT_EQ(seen.count(i), 1u) << i;
  }
}

TEST(DistributedSamplerTest, EpochChangesOnlyShuffledOrders) {
  DistributedSampler plain(50, {.shuffle = false});
  DistributedSampler shuffled(50, {.shuffle = true});
  auto plain0 = plain.epoch_indices();
  auto shuffled0 = shuffled.epoch_indices();
  plain.set_epoch(1);
  shuffled.set_epoch(1);
  EXPECT_EQ(plain.epoch_indices(), plain0);
  EXPECT_NE(shuffled.epoch_indices(), shuffled0);
}

TEST(DistributedSamplerTest, RejectsBadArguments) {
  EXPECT_THROW(DistributedSampler(10, {.num_replicas = 0}), InvalidArgumentError);
  EXPECT_THROW(DistributedSampler(10, {.num_replicas = 2, .rank = 2}), InvalidArgumentError);
  EXPECT_THROW(DistributedSampler(10, {.num_replicas = 2, .rank = -1}), InvalidArgumentError);
  EXPECT_THROW(DistributedSampler(-1, {}), InvalidArgumentError);
  DistributedSampler sampler(10, {});
  EXPECT_THROW(sampler.set_epoch(-1), InvalidArgumentError);
}

TEST(DistributedSamplerTest, StateTracksThePositionWithinTheEpoch) {
  DistributedSampler sampler(101, {.num_replicas = 2, .rank = 1, .seed = 42});
  sampler.set_epoch(2);
  std::vector<int64_t> all = sampler.epoch_indices();
  ASSERT_EQ(all.size(), 51u);
  sampler.advance(20);
  sampler.advance(10);
  EXPECT_EQ(sampler.position(), 30);
  EXPECT_EQ(sampler.remaining_indices(), std::vector<int64_t>(all.begin() + 30, all.end()));
  EXPECT_THROW(sampler.advance(22), InvalidArgumentError);
  EXPECT_THROW(sampler.advance(-1), InvalidArgumentError);

  // A restarted job: a new sampler given the saved state.
  DistributedSampler restored(101, {.num_replicas = 2, .rank = 1, .seed = 42});
  restored.load_state(sampler.state());
  EXPECT_EQ(restored.epoch(), 2);
  EXPECT_EQ(restored.remaining_indices(), sampler.remaining_indices());
  EXPECT_THROW(restored.load_state({.epoch = 0, .position = 52}), InvalidArgumentError);
  EXPECT_THROW(restored.load_state({.epoch = -1, .position = 0}), InvalidArgumentError);

  restored.set_epoch(3);
  EXPECT_EQ(restored.position(), 0);
  EXPECT_EQ(restored.remaining_indices().size(), 51u);
}

TEST(DistributedSamplerTest, ResumedLoaderYieldsTheRestOfTheEpoch) {
  at::Tensor images = at::randint(0, 256, {40, 28, 28}, at::kByte);
  auto dataset = std::make_shared<MnistDataset>(images, at::arange(40, at::kLong), MnistOptions{});
  DistributedSampler sampler(40, {.num_replicas = 2, .rank = 0});
  sampler.set_epoch(1);
  DataLoader full(dataset, sampler.epoch_indices(), {.batch_size = 4, .workers = 2});
  std::vector<at::Tensor> targets;
  while (auto batch = full.next()) targets.push_back(batch->target);
  ASSERT_EQ(targets.size(), 5u);

  sampler.advance(8);  // two batches done before the "crash"
  DataLoader resumed(dataset, sampler.remaining_indices(), {.batch_size = 4, .workers = 2});
  for (size_t i = 2; i < targets.size(); ++i) {
    auto batch = resumed.next();
    ASSERT_TRUE(batch.has_value());
    EXPECT_TRUE(at::equal(batch->target, targets[i])) << i;
  }
  EXPECT_FALSE(resumed.next().has_value());
}

// One epoch trained by `worlds[0]` ranks, then from the checkpointed consumed() on by
// worlds[1] ranks, and so on, each phase a random number of steps of the global batch
// `global` (the last phase runs to the epoch's end). drop_last is the sampler's and the
// loader's, as in chorus-mnist: without it, the ranks' partial last batches make a
// last step. Returns the epoch's steps, each the indices all ranks
// consumed together, and checks that every rank's sampler reports the same consumed().
std::vector<std::vector<int64_t>> elastic_epoch(int64_t n, int64_t global, bool drop_last,
                                                const std::vector<int64_t>& worlds,
                                                std::mt19937& rng) {
  std::vector<std::vector<int64_t>> steps;
  int64_t consumed = 0;
  for (size_t phase = 0; phase < worlds.size(); ++phase) {
    const int64_t world = worlds[phase], per_rank = global / world;
    std::vector<DistributedSampler> samplers;
    std::vector<std::vector<int64_t>> lists;
    for (int64_t rank = 0; rank < world; ++rank) {
      samplers.emplace_back(n, DistributedSamplerOptions{.num_replicas = world, .rank = rank,
                                                         .seed = 7, .drop_last = drop_last});
      samplers.back().resume(4, consumed);
      lists.push_back(samplers.back().epoch_indices());
    }
    const int64_t available = drop_last ? samplers[0].num_samples() / per_rank
                                        : (samplers[0].num_samples() + per_rank - 1) / per_rank;
    const bool last = phase + 1 == worlds.size();
    const int64_t count =
        last ? available : std::uniform_int_distribution<int64_t>(0, available / 2)(rng);
    for (int64_t s = 0; s < count; ++s) {
      std::vector<int64_t> step;
      for (int64_t rank = 0; rank < world; ++rank) {
        DistributedSampler& sampler = samplers[rank];
        const int64_t take = std::min(per_rank, sampler.num_samples() - sampler.position());
        step.insert(step.end(), lists[rank].begin() + sampler.position(),
                    lists[rank].begin() + sampler.position() + take);
        sampler.advance(take);
      }
      steps.push_back(step);
    }
    consumed = samplers[0].consumed();
    for (const DistributedSampler& sampler : samplers) EXPECT_EQ(sampler.consumed(), consumed);
  }
  return steps;
}

// The epoch's permutation as one rank sees it alone.
std::vector<int64_t> whole_order(int64_t n) {
  DistributedSampler alone(n, {.seed = 7});
  alone.set_epoch(4);
  return alone.epoch_indices();
}

TEST(DistributedSamplerTest, ResumedAtOtherWorldSizesUsesEverySampleOnce) {
  std::mt19937 rng(std::random_device{}());
  const std::vector<std::vector<int64_t>> histories = {
      {3, 2, 4, 1}, {1, 4}, {4, 3, 2, 3, 1, 2}, {2, 2, 3}, {12, 1, 6}};
  for (int round = 0; round < 20; ++round) {
    for (const auto& worlds : histories) {
      // A global batch of 12 divides the 1200 samples: every index once. 1201 and
      // 1210 leave a partial last step of 1 and 10: dropped with drop_last, else
      // the last world size's ranks share it, padded as PyTorch pads.
      for (int64_t n : {1200, 1201, 1210}) {
        for (bool drop_last : {true, false}) {
          auto steps = elastic_epoch(n, 12, drop_last, worlds, rng);
          std::vector<int64_t> order = whole_order(n);
          std::vector<int64_t> seen;
          for (size_t s = 0; s < steps.size(); ++s) {
            // Step s consumed global positions [12 s, 12 s + 12) of the permutation
            // (past its end: the padding, from its start), whatever the world size.
            std::vector<int64_t> got = steps[s], want;
            for (size_t p = 12 * s; p < 12 * s + got.size(); ++p) want.push_back(order[p % n]);
            if (s + 1 < steps.size() || drop_last) {
              ASSERT_EQ(got.size(), 12u);
            }
            std::sort(got.begin(), got.end());
            std::sort(want.begin(), want.end());
            ASSERT_EQ(got, want) << "step " << s << " of n " << n << ", round " << round;
            seen.insert(seen.end(), steps[s].begin(), steps[s].end());
          }
          // Only the padding repeats indices, fewer than the last world size.
          const size_t total = seen.size(), padding = total - std::min<size_t>(total, n);
          std::sort(seen.begin(), seen.end());
          seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
          EXPECT_EQ(seen.size(), total - padding);
          EXPECT_EQ(static_cast<int64_t>(seen.size()), drop_last ? n / 12 * 12 : n) << n;
          EXPECT_LT(padding, static_cast<size_t>(worlds.back()));
        }
      }
    }
  }
}

TEST(DistributedSamplerTest, ResumeAtTheSameWorldSizeIsLoadState) {
  DistributedSampler sampler(101, {.num_replicas = 3, .rank = 2, .seed = 42});
  sampler.set_epoch(2);
  sampler.advance(10);
  EXPECT_EQ(sampler.consumed(), 30);
  DistributedSampler resumed(101, {.num_replicas = 3, .rank = 2, .seed = 42});
  resumed.resume(2, sampler.consumed());
  EXPECT_EQ(resumed.epoch_indices(), sampler.remaining_indices());
  EXPECT_EQ(resumed.num_samples(), 24);
  resumed.advance(4);
  EXPECT_EQ(resumed.consumed(), 42);
  // Its state round-trips through load_state, start included.
  DistributedSampler restored(101, {.num_replicas = 3, .rank = 2, .seed = 42});
  restored.load_state(resumed.state());
  EXPECT_EQ(restored.consumed(), 42);
  EXPECT_EQ(restored.remaining_indices(), resumed.remaining_indices());
  EXPECT_THROW(restored.load_state({.epoch = 2, .position = 25, .start = 30}), InvalidArgumentError);
  EXPECT_THROW(restored.load_state({.epoch = 2, .position = 0, .start = -3}), InvalidArgumentError);
  EXPECT_THROW(resumed.resume(2, -1), InvalidArgumentError);
  // Past the dataset: nothing left of the epoch. set_epoch starts afresh.
  resumed.resume(2, 102);
  EXPECT_EQ(resumed.num_samples(), 0);
  EXPECT_TRUE(resumed.epoch_indices().empty());
  resumed.set_epoch(3);
  EXPECT_EQ(resumed.num_samples(), 34);
  EXPECT_EQ(resumed.consumed(), 0);
}

}  // namespace
}  // namespace chorus::data
