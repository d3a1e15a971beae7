// DistributedSampler against PyTorch's (tests/torch/fixtures/sampler_fixture.json,
// made by scripts/gen_sampler_fixture.py), its checkpoint state, and resuming
// a DataLoader mid-epoch from that state.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
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

}  // namespace
}  // namespace chorus::data
