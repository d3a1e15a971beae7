// Issue 26's end-to-end case: an elastic chorus-mnist job on three simulated nodes
// (chorusrun --nnodes 2:3 on 127.0.0.2, .3, .4, one worker each) loses node 2's launcher
// (SIGKILL) at a random step. The job finishes on the two left, resumed from its last
// checkpoint with the same global batch. The sample log, less the steps the lost round
// took past that checkpoint, holds every sample of every epoch once, and the parameters
// end equal to those of 2 ranks restarted from a copy of that checkpoint.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "torch/mnist_job.h"
#include "util/checks.h"
#include "util/chorusrun.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using chorus::mnist_job::LogLine;
using chorus::mnist_job::make_tiny_dataset;
using chorus::mnist_job::read_sample_log;
using chorus::mnist_job::params_by_rank;
using chorus::test::contains;
using chorus::test::Subprocess;

// 960 samples, global batch 96 (32 per rank on 3, 48 on 2): 10 steps per epoch.
constexpr int kSamples = 960, kGlobalBatch = 96, kStepsPerEpoch = 10, kEpochs = 2;

std::vector<std::string> mnist_args(const std::string& data, const std::string& dir) {
  return {chorus::mnist_job::kMnist, "--data-dir", data, "--dataset", "mnist", "--batch-size",
          std::to_string(kGlobalBatch), "--epochs", std::to_string(kEpochs), "--momentum", "0.9",
          "--lr", "0.05", "--log-interval", "1", "--checkpoint-dir", dir + "/ckpt",
          "--checkpoint-interval", "2", "--resume", "--sample-log", dir + "/samples.log"};
}

// The three launchers. Round 0 waits for all three (the last call is long; it ends as
// soon as MAX have joined).
struct ElasticJob {
  ElasticJob() : port(chorus::test::pick_free_port()) {}
  ~ElasticJob() {
    for (auto& n : nodes) {
      if (!n || n->exited()) continue;
      kill(n->pid(), SIGKILL);  // its worker follows (PR_SET_PDEATHSIG)
      n->wait_for(10s);
    }
  }
  void start(int k, const std::vector<std::string>& program) {
    std::vector<std::string> args = {
        "--nnodes", "2:3", "--node-rank", std::to_string(k), "--nproc-per-node", "1",
        "--master-addr", "127.0.0.2", "--master-port", std::to_string(port), "--local-addr",
        "127.0.0." + std::to_string(2 + k), "--rdzv-id", "elastic-mnist-" + std::to_string(port),
        "--max-restarts", "1", "--rdzv-conf", "last_call_timeout=60", "--tee", "3"};
    args.insert(args.end(), program.begin(), program.end());
    nodes.push_back(chorus::test::start_chorusrun(args, {{"OMP_NUM_THREADS", "1"}}));
  }
  std::string all_output() const { return chorus::test::launchers_output(nodes); }
  uint16_t port;
  std::vector<std::unique_ptr<Subprocess>> nodes;
};

size_t count_lines(const std::string& path) {
  std::ifstream in(path);
  size_t n = 0;
  for (std::string text; std::getline(in, text);) ++n;
  return n;
}

// Polls the sample log until `done` holds for its lines (true), or 60 s pass.
template <typename Pred>
bool log_shows(const std::string& path, Pred done) {
  const auto deadline = Clock::now() + 60s;
  while (Clock::now() < deadline) {
    if (done(read_sample_log(path, /*finished=*/false))) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

// The step the round-1 job resumed after, from "resumed from ...: epoch E, step S, ...".
int resumed_step(const std::string& out) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex("resumed from [^:]*: epoch [0-9]+, step ([0-9]+),"))) return -1;
  return std::stoi(m[1]);
}

TEST(ElasticJob, NodeKilledAtARandomStepFinishesOnTwoWithEverySampleOnceAndTheRestartsParameters) {
  // A step of round 0 to kill at: not the first ones (the job is then still starting),
  // nor the last (the job could end before the kill is seen).
  std::mt19937 rng(std::random_device{}());
  const int kill_step = 3 + static_cast<int>(rng() % 14);  // 3..16
  const std::string data = make_tiny_dataset(kSamples, 96);
  const std::string dir = testing::TempDir() + "elastic_job_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string log = dir + "/samples.log";
  std::printf("node 2's launcher is killed once the sample log shows step %d\n", kill_step);

  ElasticJob job;
  for (int k : {0, 1, 2}) job.start(k, mnist_args(data, dir));
  ASSERT_TRUE(log_shows(log, [&](const std::vector<LogLine>& lines) {
    for (const LogLine& l : lines) {
      if (l.step >= kill_step) return true;
    }
    return false;
  })) << job.all_output();
  ASSERT_EQ(kill(job.nodes[2]->pid(), SIGKILL), 0);
  const auto killed = Clock::now();

  // Round 1 starts once round 0's workers are gone: the checkpoint is then the one it
  // resumes from. Its first checkpoint comes two steps later; the copy is taken first.
  ASSERT_TRUE(job.nodes[0]->wait_for_output("round 1:", 60s)) << job.all_output();
  std::filesystem::copy(dir + "/ckpt", dir + "/ref_ckpt");
  ASSERT_TRUE(log_shows(log, [](const std::vector<LogLine>& lines) {
    return !lines.empty() && lines.back().world == 2;
  })) << job.all_output();
  const auto resumed = Clock::now();
  for (int k : {0, 1}) {
    ASSERT_TRUE(job.nodes[k]->wait_for(60s)) << job.all_output();
    EXPECT_EQ(job.nodes[k]->exit_code(), 0) << job.all_output();
  }
  std::printf("[ timing ] SIGKILL of node 2's launcher to round 1's first logged step: %lld ms\n",
              static_cast<long long>(
                  std::chrono::duration_cast<std::chrono::milliseconds>(resumed - killed).count()));
  const std::string out = job.nodes[0]->stdout_text() + job.nodes[1]->stdout_text();
  const int saved = resumed_step(out);
  ASSERT_GE(saved, 0) << job.all_output();
  EXPECT_TRUE(contains(job.nodes[0]->stderr_text(), "round 1: 2 node(s)")) << job.all_output();
  std::printf("round 1 resumed from the checkpoint of step %d\n", saved);

  // The sample log by rounds (their lines are apart: a round's workers are gone before
  // the next one starts). Each round but the last loses the steps past the checkpoint
  // the next resumed from, which its first step tells.
  const std::vector<LogLine> lines = read_sample_log(log, /*finished=*/false);
  ASSERT_EQ(lines.size(), count_lines(log)) << "a malformed sample log line";
  std::vector<std::vector<LogLine>> rounds;
  for (const LogLine& l : lines) {
    if (rounds.empty() || rounds.back().back().world != l.world) rounds.emplace_back();
    rounds.back().push_back(l);
  }
  ASSERT_EQ(rounds.size(), 2u);
  EXPECT_EQ(rounds[0].front().world, 3);
  EXPECT_EQ(rounds[1].front().world, 2);
  std::map<int64_t, std::set<int64_t>> ranks_of_step;
  std::map<int64_t, std::multiset<int64_t>> seen;
  for (size_t r = 0; r < rounds.size(); ++r) {
    int64_t first_next = INT64_MAX;
    if (r + 1 < rounds.size()) {
      for (const LogLine& l : rounds[r + 1]) first_next = std::min(first_next, l.step);
    }
    if (r == 0) {
      EXPECT_EQ(first_next, saved + 1);
    }
    for (const LogLine& l : rounds[r]) {
      if (l.step >= first_next) continue;  // lost: past the checkpoint the next round resumed from
      EXPECT_EQ(l.epoch, (l.step - 1) / kStepsPerEpoch) << "step " << l.step;
      EXPECT_EQ(static_cast<int64_t>(l.indices.size()), kGlobalBatch / l.world);
      EXPECT_TRUE(ranks_of_step[l.step].insert(l.rank).second)
          << "rank " << l.rank << " logged step " << l.step << " twice";
      seen[l.epoch].insert(l.indices.begin(), l.indices.end());
    }
  }
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

  // The reference: 2 ranks of one launcher restart from the copy, to the same end.
  std::vector<std::string> ref_args = mnist_args(data, dir);
  ref_args.erase(ref_args.begin());
  for (size_t i = 0; i + 1 < ref_args.size(); ++i) {
    if (ref_args[i] == "--checkpoint-dir") ref_args[i + 1] = dir + "/ref_ckpt";
    if (ref_args[i] == "--sample-log") ref_args[i + 1] = dir + "/ref_samples.log";
  }
  auto ref = chorus::mnist_job::job(2, ref_args);
  ASSERT_TRUE(ref->wait_for(120s)) << ref->output_text();
  ASSERT_EQ(ref->exit_code(), 0) << ref->output_text();
  EXPECT_EQ(resumed_step(ref->stdout_text()), saved) << ref->output_text();
  auto got = params_by_rank(out), want = params_by_rank(ref->stdout_text());
  ASSERT_EQ(got.size(), 2u) << job.all_output();
  ASSERT_EQ(want.size(), 2u) << ref->output_text();
  EXPECT_EQ(got[0], got[1]) << "replicas differ";
  EXPECT_EQ(got[0], want[0]) << "the elastic job ends elsewhere than the restart from its checkpoint";
  std::filesystem::remove_all(dir);
}

}  // namespace
