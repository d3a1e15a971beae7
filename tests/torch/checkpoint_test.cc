// Training checkpoints: the state a job of another world size needs to continue
// (issue 26) round-trips, checkpoints from before it still load, and bad ones are
// refused by name without touching the model or the file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <fstream>
#include <iterator>

#include "chorus/error.h"
#include "chorus/torch/checkpoint.h"
#include "util/ranks.h"

namespace chorus::torch_ext {
namespace {

std::string temp_path(const std::string& name) {
  return testing::TempDir() + "checkpoint_test_" + std::to_string(::getpid()) + "_" + name;
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

struct Trainee {
  torch::nn::Linear model{4, 3};
  torch::optim::SGD optimizer{model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9)};

  // One step, so that the optimizer has momentum buffers to save.
  void step() {
    optimizer.zero_grad();
    model->forward(torch::ones({2, 4})).sum().backward();
    optimizer.step();
  }
};

bool same_parameters(Trainee& a, Trainee& b) {
  return torch::equal(a.model->weight, b.model->weight) && torch::equal(a.model->bias, b.model->bias);
}

TEST(Checkpoint, RoundTripsWhatAnotherWorldSizeNeeds) {
  torch::manual_seed(1);
  Trainee saved;
  saved.step();
  TrainingState state;
  state.epoch = 3;
  state.step = 77;
  state.sampler_position = 40;
  state.world_size = 3;
  state.consumed = 120;
  state.global_batch = 12;
  state.sampler_seed = 0xfedcba9876543210ull;  // all 64 bits survive the int64 tensor
  const std::string path = temp_path("round_trip.pt");
  save_checkpoint(path, *saved.model, saved.optimizer, state);

  torch::manual_seed(2);
  Trainee loaded;
  ASSERT_FALSE(same_parameters(saved, loaded));
  std::optional<TrainingState> got = load_checkpoint(path, *loaded.model, loaded.optimizer);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->epoch, 3);
  EXPECT_EQ(got->step, 77);
  EXPECT_EQ(got->sampler_position, 40);
  EXPECT_EQ(got->world_size, 3);
  EXPECT_EQ(got->consumed, 120);
  EXPECT_EQ(got->global_batch, 12);
  EXPECT_EQ(got->sampler_seed, 0xfedcba9876543210ull);
  EXPECT_EQ(got->consumed_by_all(2), 120) << "recorded: not derived from the loading world size";
  EXPECT_TRUE(same_parameters(saved, loaded));
  // The momentum came back too: the next step is the same on both.
  saved.step();
  loaded.step();
  EXPECT_TRUE(same_parameters(saved, loaded));
  std::filesystem::remove(path);
  EXPECT_FALSE(load_checkpoint(path, *loaded.model, loaded.optimizer).has_value());
}

// A checkpoint as chorus wrote them before world_size, consumed, global_batch and
// sampler_seed: only the model, the optimizer, epoch, step and sampler_position.
void save_old_checkpoint(const std::string& path, Trainee& t, int64_t position) {
  torch::serialize::OutputArchive archive, model_archive, optimizer_archive;
  t.model->save(model_archive);
  t.optimizer.save(optimizer_archive);
  archive.write("model", model_archive);
  archive.write("optimizer", optimizer_archive);
  archive.write("epoch", torch::tensor(int64_t{1}));
  archive.write("step", torch::tensor(int64_t{50}));
  archive.write("sampler_position", torch::tensor(position));
  archive.save_to(path);
}

TEST(Checkpoint, OneFromBeforeTheWorldSizeFieldsLoadsAtTheWorldSizeThatLoadsIt) {
  Trainee t;
  const std::string path = temp_path("old.pt");
  save_old_checkpoint(path, t, 16);
  std::optional<TrainingState> got = load_checkpoint(path, *t.model, t.optimizer);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->epoch, 1);
  EXPECT_EQ(got->step, 50);
  EXPECT_EQ(got->world_size, 0);
  EXPECT_EQ(got->global_batch, 0);
  // It could only have been written at the world size resuming it: 16 per rank.
  EXPECT_EQ(got->consumed_by_all(4), 64);
  std::filesystem::remove(path);
}

TEST(Checkpoint, BadOnesAreRefusedByNameLeavingModelAndFileAlone) {
  torch::manual_seed(3);
  Trainee good;
  good.step();
  const std::string path = temp_path("bad.pt");
  auto expect_refused = [&](const std::string& why) {
    torch::manual_seed(4);
    Trainee other;
    torch::manual_seed(4);
    Trainee untouched;
    const std::string before = file_bytes(path);
    try {
      load_checkpoint(path, *other.model, other.optimizer);
      ADD_FAILURE() << why << ": loaded";
    } catch (const InvalidArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
    EXPECT_TRUE(same_parameters(other, untouched)) << why << ": the model was changed";
    EXPECT_EQ(file_bytes(path), before) << why << ": the file was changed";
  };

  TrainingState state;
  state.world_size = 2;
  state.sampler_position = 10;
  state.consumed = 19;  // fewer than 10 on each of 2 ranks
  save_checkpoint(path, *good.model, good.optimizer, state);
  expect_refused("inconsistent consumed");

  state.consumed = -20;
  save_checkpoint(path, *good.model, good.optimizer, state);
  expect_refused("negative consumed");

  state.consumed = 20;
  save_checkpoint(path, *good.model, good.optimizer, state);
  std::string bytes = file_bytes(path);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() / 2);
  expect_refused("truncated");

  std::ofstream(path, std::ios::binary | std::ios::trunc) << "not a checkpoint";
  expect_refused("not a zip archive");

  // Another model's checkpoint.
  torch::nn::Linear wider(4, 5);
  torch::optim::SGD wider_optimizer(wider->parameters(), 0.1);
  save_checkpoint(path, *wider, wider_optimizer, TrainingState{});
  expect_refused("another model");
  std::filesystem::remove(path);
}

// chorusrun --join-at-checkpoint, the workers' side: without the launcher's variable it
// is never asked for; with it, every rank learns what rank 0 read from the launchers'
// store (here a TcpStoreServer of the test), before and after another rank sets the key.
TEST(StopAtCheckpoint, EveryRankLearnsWhatRankZeroReadsInTheLaunchersStore) {
  TcpStoreServer server("127.0.0.1", 0);
  ::setenv("CHORUS_STORE_ADDR", "127.0.0.1", 1);
  ::setenv("CHORUS_STORE_PORT", std::to_string(server.port()).c_str(), 1);
  ::setenv("CHORUS_STORE_HOSTED", "1", 1);
  auto on_ranks = [](const std::function<void(int, std::shared_ptr<ProcessGroup>)>& body) {
    test::run_ranks(3, [&](Communicator& c) {
      // The harness owns the communicator; wrapped without taking ownership.
      std::shared_ptr<Communicator> alias(std::shared_ptr<Communicator>(), &c);
      body(c.rank(), std::make_shared<ProcessGroup>(alias));
    });
  };
  ::unsetenv(kStopAtCheckpointKeyVariable);
  on_ranks([](int, std::shared_ptr<ProcessGroup> group) {
    StopAtCheckpoint stop(group);
    EXPECT_FALSE(stop.enabled());
    EXPECT_FALSE(stop.requested());
  });
  const std::string key = "chorusrun/job/round/0/stop-at-checkpoint";
  ::setenv(kStopAtCheckpointKeyVariable, key.c_str(), 1);
  TcpStore launcher("127.0.0.1", server.port(), std::chrono::seconds(10));
  on_ranks([&](int rank, std::shared_ptr<ProcessGroup> group) {
    StopAtCheckpoint stop(group);
    EXPECT_TRUE(stop.enabled());
    EXPECT_FALSE(stop.requested()) << "rank " << rank;
    group->barrier().wait();
    if (rank == 2) launcher.set(key, "1");
    group->barrier().wait();
    EXPECT_TRUE(stop.requested()) << "rank " << rank;
  });
  for (const char* name : {kStopAtCheckpointKeyVariable, "CHORUS_STORE_ADDR", "CHORUS_STORE_PORT",
                           "CHORUS_STORE_HOSTED"}) {
    ::unsetenv(name);
  }
}

}  // namespace
}  // namespace chorus::torch_ext
