// Issue 26's end-to-end case: an elastic chorus-mnist job on three simulated nodes
// (chorusrun --nnodes 2:3 on 127.0.0.2, .3, .4, one worker each) loses node 2's launcher
// (SIGKILL) at a random step. The job finishes on the two left, resumed from its last
// checkpoint with the same global batch. The sample log, less the steps the lost round
// took past that checkpoint, holds every sample of every epoch once, and the parameters
// end equal to those of 2 ranks restarted from a copy of that checkpoint.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>

#include "torch/elastic_job.h"

namespace {

using namespace chorus::elastic_job;

TEST(ElasticJob, NodeKilledAtARandomStepFinishesOnTwoWithEverySampleOnceAndTheRestartsParameters) {
  // A step of round 0 to kill at: not the first ones (the job is then still starting),
  // nor the last (the job could end before the kill is seen).
  std::mt19937 rng(std::random_device{}());
  const int kill_step = 3 + static_cast<int>(rng() % 14);  // 3..16
  const std::string data = make_tiny_dataset(kSamples, 96);
  const std::string dir = fresh_dir("elastic_job");
  const std::string log = dir + "/samples.log";
  std::printf("node 2's launcher is killed once the sample log shows step %d\n", kill_step);

  // Round 0 waits for all three (the last call is long; it ends as soon as MAX have joined).
  ElasticJob job("2:3", {"--max-restarts", "1", "--rdzv-conf", "last_call_timeout=60"});
  for (int k : {0, 1, 2}) job.start(k, mnist_args(data, dir));
  ASSERT_TRUE(log_reaches_step(log, kill_step)) << job.all_output();
  ASSERT_EQ(kill(job.nodes[2]->pid(), SIGKILL), 0);
  const auto killed = Clock::now();

  // Round 1 starts once round 0's workers are gone: the checkpoint is then the one it
  // resumes from. Its first checkpoint comes two steps later; the copy is taken first.
  ASSERT_TRUE(job.nodes[0]->wait_for_output("round 1:", 60s)) << job.all_output();
  std::filesystem::copy(dir + "/ckpt", dir + "/ref_ckpt");
  ASSERT_TRUE(log_shows(log, [](const std::vector<LogLine>& lines) {
    return !lines.empty() && lines.back().round == 1;
  })) << job.all_output();
  const auto resumed = Clock::now();
  for (int k : {0, 1}) {
    ASSERT_TRUE(job.nodes[k]->wait_for(60s)) << job.all_output();
    EXPECT_EQ(job.nodes[k]->exit_code(), 0) << job.all_output();
  }
  std::printf("[ timing ] SIGKILL of node 2's launcher to round 1's first logged step: %lld ms\n",
              static_cast<long long>(
                  std::chrono::duration_cast<std::chrono::milliseconds>(resumed - killed).count()));
  const std::string out = job.all_stdout();
  const int saved = resumed_step(out);
  EXPECT_TRUE(contains(job.nodes[0]->stderr_text(), "round 1: 2 node(s)")) << job.all_output();
  std::printf("round 1 resumed from the checkpoint of step %d\n", saved);

  // Round 0 on three ranks up to the checkpoint round 1 resumed from, round 1 on two.
  const std::vector<RoundSteps> rounds = check_sample_log(log);
  ASSERT_EQ(rounds.size(), 2u);
  EXPECT_EQ(rounds[0].world, 3);
  EXPECT_EQ(rounds[1].world, 2);
  EXPECT_EQ(rounds[1].first, saved + 1);
  std::printf("round 0 lost %lld step(s)\n", static_cast<long long>(rounds[0].lost));

  // The reference: 2 ranks of one launcher restart from the copy, to the same end.
  auto got = params_by_rank(out), want = reference_params(data, dir, 2, saved);
  ASSERT_EQ(got.size(), 2u) << job.all_output();
  ASSERT_EQ(want.size(), 2u);
  EXPECT_EQ(got[0], got[1]) << "replicas differ";
  EXPECT_EQ(got[0], want[0]) << "the elastic job ends elsewhere than the restart from its checkpoint";
  std::filesystem::remove_all(dir);
}

}  // namespace
