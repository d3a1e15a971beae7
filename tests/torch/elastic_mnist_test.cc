// chorus-mnist resumed at a different world size (issue 26): 3 ranks train to a random
// step, losing the steps after their last checkpoint; 2 ranks resume from that
// checkpoint with the same global batch. The sample log shows every sample of every
// epoch exactly once, and the parameters end equal to those of a job that stopped
// exactly at the checkpoint and restarted at 2 ranks from it.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <sstream>

#include "torch/elastic_job.h"

namespace {

// The data set, batch and epochs of elastic_job.h's jobs (kSamples, kGlobalBatch, ...).
using namespace chorus::elastic_job;

std::vector<std::string> common_args(const std::string& data) {
  return {"--data-dir", data, "--dataset", "mnist", "--batch-size", std::to_string(kGlobalBatch),
          "--epochs", std::to_string(kEpochs), "--momentum", "0.9", "--lr", "0.05",
          "--checkpoint-interval", "4", "--log-interval", "1"};
}

// Runs chorus-mnist on `ranks` ranks with `args` on top of common_args; its stdout.
std::string run_job(int ranks, const std::string& data, const std::vector<std::string>& args) {
  std::vector<std::string> all = common_args(data);
  all.insert(all.end(), args.begin(), args.end());
  auto run = job(ranks, all);
  EXPECT_TRUE(run->wait_for(300s)) << run->output_text();
  EXPECT_EQ(run->exit_code(), 0) << run->output_text();
  return run->stdout_text();
}

// 3 ranks stop after step `stop`, never one with a checkpoint (every 4 steps, and the
// end of epoch 0 unless the run stops there): 1 to 3 steps past the last one are lost.
void resume_on_two_after(int stop) {
  const int saved = stop / 4 * 4;
  const std::string data = make_tiny_dataset(kSamples, 96);
  const std::string dir = fresh_dir("elastic_mnist");
  const std::string log = dir + "/samples.log";
  std::printf("3 ranks stop after step %d, the checkpoint of step %d is resumed on 2\n", stop, saved);

  run_job(3, data, {"--checkpoint-dir", dir + "/ckpt", "--max-steps", std::to_string(stop),
                    "--sample-log", log});
  const std::string out = run_job(2, data, {"--checkpoint-dir", dir + "/ckpt", "--resume",
                                            "--sample-log", log});
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("resumed from [^:]*: epoch ([0-9]+), step ([0-9]+), "
                                                   "([0-9]+) samples of the epoch consumed, "
                                                   "written by 3 ranks, now 2")))
      << out;
  EXPECT_EQ(std::stoi(m[2]), saved);
  EXPECT_EQ(std::stoi(m[1]), saved / kStepsPerEpoch);
  EXPECT_EQ(std::stoi(m[3]), saved % kStepsPerEpoch * kGlobalBatch);

  // The reference: 3 ranks stop exactly at the checkpoint, 2 restart from it.
  run_job(3, data, {"--checkpoint-dir", dir + "/ref", "--max-steps", std::to_string(saved)});
  const std::string ref = run_job(2, data, {"--checkpoint-dir", dir + "/ref", "--resume"});
  auto got = params_by_rank(out), want = params_by_rank(ref);
  ASSERT_EQ(got.size(), 2u) << out;
  ASSERT_EQ(want.size(), 2u) << ref;
  EXPECT_EQ(got[0], got[1]) << "replicas differ";
  EXPECT_EQ(got[0], want[0]) << "the job that lost steps ends elsewhere than the restart at 2 ranks";

  // The sample log, less the lost steps (past the checkpoint, on 3 ranks): every step
  // once, by every rank of its world size, and every sample of each epoch once.
  std::map<int64_t, std::set<int64_t>> ranks_of_step;
  std::map<int64_t, std::multiset<int64_t>> seen;
  int lost = 0;
  for (const LogLine& line : read_sample_log(log, /*finished=*/true)) {
    if (line.world == 3 && line.step > saved) {
      ++lost;
      continue;
    }
    EXPECT_EQ(line.world, line.step <= saved ? 3 : 2) << "step " << line.step;
    EXPECT_EQ(line.epoch, (line.step - 1) / kStepsPerEpoch) << "step " << line.step;
    EXPECT_EQ(static_cast<int64_t>(line.indices.size()), kGlobalBatch / line.world);
    EXPECT_TRUE(ranks_of_step[line.step].insert(line.rank).second)
        << "rank " << line.rank << " logged step " << line.step << " twice";
    seen[line.epoch].insert(line.indices.begin(), line.indices.end());
  }
  EXPECT_EQ(lost, (stop - saved) * 3);
  ASSERT_EQ(ranks_of_step.size(), static_cast<size_t>(kEpochs * kStepsPerEpoch));
  for (const auto& [step, ranks] : ranks_of_step) {
    EXPECT_EQ(ranks.size(), step <= saved ? 3u : 2u) << "step " << step;
  }
  ASSERT_EQ(seen.size(), static_cast<size_t>(kEpochs));
  for (const auto& [epoch, indices] : seen) {
    ASSERT_EQ(indices.size(), static_cast<size_t>(kSamples)) << "epoch " << epoch;
    for (int64_t i = 0; i < kSamples; ++i) {
      ASSERT_EQ(indices.count(i), 1u) << "sample " << i << " of epoch " << epoch;
    }
  }
  std::filesystem::remove_all(dir);
}

// A random step of each epoch. Not 11, whose checkpoint of step 10 (the end of epoch
// 0) the reference could not stop at.
TEST(ElasticMnist, ResumedOnFewerRanksSeesEverySampleOnceAndMatchesARestartThere) {
  std::mt19937 rng(std::random_device{}());
  const std::vector<int> first = {5, 6, 7, 9, 10}, second = {13, 14, 15, 17, 18, 19};
  for (const std::vector<int>* stops : {&first, &second}) {
    resume_on_two_after((*stops)[rng() % stops->size()]);
    if (HasFatalFailure()) return;
  }
}

TEST(ElasticMnist, RefusesAGlobalBatchThatChangesOrDoesNotDivide) {
  const std::string data = make_tiny_dataset(kSamples, 96);
  const std::string dir = testing::TempDir() + "elastic_refuse_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  run_job(3, data, {"--checkpoint-dir", dir, "--max-steps", "4"});
  const std::string checkpoint = dir + "/checkpoint.pt";
  ASSERT_TRUE(std::filesystem::exists(checkpoint));
  const auto written = std::filesystem::last_write_time(checkpoint);

  // 96 samples a step do not split over 5 ranks.
  auto five = job(5, {"--data-dir", data, "--dataset", "mnist", "--batch-size", "96",
                      "--checkpoint-dir", dir, "--resume"});
  ASSERT_TRUE(five->wait_for(300s)) << five->output_text();
  EXPECT_NE(five->exit_code(), 0);
  EXPECT_TRUE(contains(five->stderr_text(), "the global batch (--batch-size 96) is not divisible "
                                            "by the 5 ranks"))
      << five->output_text();

  // Another global batch than the checkpoint's.
  auto other = job(2, {"--data-dir", data, "--dataset", "mnist", "--batch-size", "64",
                       "--checkpoint-dir", dir, "--resume"});
  ASSERT_TRUE(other->wait_for(300s)) << other->output_text();
  EXPECT_NE(other->exit_code(), 0);
  EXPECT_TRUE(contains(other->stderr_text(), "it was written with a global batch of 96, "
                                             "--batch-size is 64"))
      << other->output_text();
  // Another sampler seed: the rest of the epoch would be of another permutation.
  auto seeded = job(2, {"--data-dir", data, "--dataset", "mnist", "--batch-size", "96", "--seed",
                        "5", "--checkpoint-dir", dir, "--resume"});
  ASSERT_TRUE(seeded->wait_for(300s)) << seeded->output_text();
  EXPECT_NE(seeded->exit_code(), 0);
  EXPECT_TRUE(contains(seeded->stderr_text(), "its sampler was seeded with 0, --seed is 5"))
      << seeded->output_text();
  // Refusing kept the checkpoint as it was.
  EXPECT_EQ(std::filesystem::last_write_time(checkpoint), written);
  std::filesystem::remove_all(dir);
}

}  // namespace
