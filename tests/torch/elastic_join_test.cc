// Issue 26's joining node and nodes of different sizes, with chorus-mnist on simulated
// nodes (tests/torch/elastic_job.h):
// - a node joining a running job of two (node 0 with one worker, node 1 with two:
//   world size 3) is admitted at the next round, and the job finishes on three (world
//   size 4). Either at once (the round's workers are stopped and resume from their last
//   checkpoint, losing the steps past it) or, with --join-at-checkpoint, at the workers'
//   next checkpoint (no step lost). The sample log holds every sample of every epoch
//   once, and the parameters end equal to those of 4 ranks restarted from a copy of the
//   checkpoint round 1 resumed from;
// - a fixed job of one node with one worker and one with two trains as 3 ranks of one
//   node do.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>

#include "torch/elastic_job.h"

namespace {

using namespace chorus::elastic_job;

void join_a_running_job(bool at_checkpoint) {
  // A step of round 0 at which node 2 comes (the job ends at step 20). Round 0's workers
  // are held (SIGSTOP) while node 2's launcher starts, so that a slow start does not let
  // the job run out of steps: until node 0 has asked them to stop at their next
  // checkpoint, or (stopped at once) until node 2 has joined, when node 0 sees it
  // within its monitor interval (0.1 s; the job has more than 10 steps left).
  std::mt19937 rng(std::random_device{}());
  const int join_step = 2 + static_cast<int>(rng() % 8);  // 2..9
  const std::string data = make_tiny_dataset(kSamples, 96);
  const std::string dir = fresh_dir(at_checkpoint ? "join_at_checkpoint" : "join_at_once");
  const std::string log = dir + "/samples.log";
  std::printf("node 2 starts once the sample log shows step %d\n", join_step);

  // No last call: round 0 starts with the first two. No restarts: a join uses none.
  std::vector<std::string> launcher = {"--max-restarts", "0", "--rdzv-conf", "last_call_timeout=0"};
  if (at_checkpoint) launcher.insert(launcher.end(), {"--join-at-checkpoint", "60"});
  ElasticJob job("2:3", launcher);
  job.start(0, mnist_args(data, dir), 1);
  job.start(1, mnist_args(data, dir), 2);
  ASSERT_TRUE(log_reaches_step(log, join_step)) << job.all_output();
  std::vector<pid_t> held;
  for (int k : {0, 1}) {
    for (pid_t pid : child_pids(job.nodes[k]->pid())) {
      if (kill(pid, SIGSTOP) == 0) held.push_back(pid);
    }
  }
  job.start(2, mnist_args(data, dir), 1);
  const auto joined = Clock::now();
  const bool seen = at_checkpoint
                        ? job.nodes[0]->wait_for_output("the workers stop at their next checkpoint", 60s)
                        : job.nodes[2]->wait_for_output("round 0 runs without this node", 60s);
  for (pid_t pid : held) kill(pid, SIGCONT);
  ASSERT_TRUE(seen) << job.all_output();

  // Round 1 starts once round 0's workers are gone (rank 0, which saves, is node 0's):
  // the checkpoint is then the one it resumes from, copied before its first own.
  ASSERT_TRUE(job.nodes[0]->wait_for_output("round 1:", 60s)) << job.all_output();
  std::filesystem::copy(dir + "/ckpt", dir + "/ref_ckpt");
  ASSERT_TRUE(log_shows(log, [](const std::vector<LogLine>& lines) {
    return !lines.empty() && lines.back().round == 1;
  })) << job.all_output();
  std::printf("[ timing ] start of node 2's launcher to round 1's first logged step: %lld ms\n",
              static_cast<long long>(
                  std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - joined).count()));
  for (int k : {0, 1, 2}) {
    ASSERT_TRUE(job.nodes[k]->wait_for(60s)) << job.all_output();
    EXPECT_EQ(job.nodes[k]->exit_code(), 0) << job.all_output();
  }
  const std::string err0 = job.nodes[0]->stderr_text(), out = job.all_stdout();
  EXPECT_TRUE(contains(err0, "round 1: 3 node(s)")) << job.all_output();
  EXPECT_TRUE(contains(err0, "0 of 0 restarts after failures used; the round before ended: a node joined"))
      << job.all_output();
  const int saved = resumed_step(out);

  const std::vector<RoundSteps> rounds = check_sample_log(log);
  ASSERT_EQ(rounds.size(), 2u);
  EXPECT_EQ(rounds[0].world, 3);
  EXPECT_EQ(rounds[1].world, 4);
  EXPECT_EQ(rounds[1].first, saved + 1);
  std::printf("round 1 resumed from the checkpoint of step %d; round 0 logged steps %lld-%lld, lost %lld\n",
              saved, static_cast<long long>(rounds[0].first), static_cast<long long>(rounds[0].last),
              static_cast<long long>(rounds[0].lost));
  if (at_checkpoint) {
    // Round 0 stopped right after the checkpoint it saved, having logged no step past it.
    EXPECT_TRUE(contains(err0, "the workers stopped at their checkpoint")) << job.all_output();
    EXPECT_TRUE(contains(out, "stopping at the checkpoint of step " + std::to_string(saved) + ":"))
        << job.all_output();
    EXPECT_EQ(rounds[0].lost, 0);
    EXPECT_EQ(rounds[0].last, saved);
  }

  // Ranks 0 | 1, 2 | 3 of round 1 against 4 ranks of one node, from the same checkpoint.
  auto got = params_by_rank(out), want = reference_params(data, dir, 4, saved);
  ASSERT_EQ(got.size(), 4u) << job.all_output();
  ASSERT_EQ(want.size(), 4u);
  for (int r : {1, 2, 3}) EXPECT_EQ(got[r], got[0]) << "rank " << r << "'s replica differs";
  EXPECT_EQ(got[0], want[0]) << "the job ends elsewhere than the restart from its checkpoint";
  std::filesystem::remove_all(dir);
}

TEST(ElasticJoin, NodeJoiningARunningJobIsAdmittedAtTheNextRoundAndTheJobFinishesOnThree) {
  join_a_running_job(/*at_checkpoint=*/false);
}

TEST(ElasticJoin, AtCheckpointTheWorkersStopAtTheirNextCheckpointAndNoStepIsLost) {
  join_a_running_job(/*at_checkpoint=*/true);
}

// One node of one worker and one of two (--nproc-per-node 1 and 2, ranks 0 | 1, 2) train
// every sample of every epoch once, all ranks end with the same parameters, and those of
// 3 ranks on one node.
TEST(MixedNodes, OneAndTwoWorkersTrainAsThreeRanksOfOneNode) {
  const std::string data = make_tiny_dataset(kSamples, 96);
  const std::string dir = fresh_dir("mixed_nodes");
  ElasticJob job("2", {});
  job.start(0, mnist_args(data, dir), 1);
  job.start(1, mnist_args(data, dir), 2);
  for (int k : {0, 1}) {
    ASSERT_TRUE(job.nodes[k]->wait_for(60s)) << job.all_output();
    EXPECT_EQ(job.nodes[k]->exit_code(), 0) << job.all_output();
  }
  EXPECT_TRUE(contains(job.nodes[1]->stdout_text(), "rank 2 params")) << job.all_output();
  const std::vector<RoundSteps> rounds = check_sample_log(dir + "/samples.log");
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].world, 3);

  // The reference starts afresh: there is no dir/ref_ckpt, so it resumes from nothing.
  auto got = params_by_rank(job.all_stdout()), want = reference_params(data, dir, 3, 0);
  ASSERT_EQ(got.size(), 3u) << job.all_output();
  ASSERT_EQ(want.size(), 3u);
  for (int r : {1, 2}) EXPECT_EQ(got[r], got[0]) << "rank " << r << "'s replica differs";
  EXPECT_EQ(got[0], want[0]) << "nodes of 1 and 2 workers end elsewhere than 3 ranks of one node";
  std::filesystem::remove_all(dir);
}

}  // namespace
