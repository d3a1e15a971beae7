// Elastic chorus-mnist jobs for tests (issue 26): chorusrun --nnodes MIN:MAX launchers as
// simulated nodes on 127.0.0.2, .3, ... (node 0 hosts the store on 127.0.0.2), the tiny
// data set's training arguments, the sample log's checks (every sample of every epoch
// once, whatever the rounds lost), and the reference run restarted from a copy of a
// checkpoint.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "torch/mnist_job.h"
#include "util/checks.h"
#include "util/chorusrun.h"

namespace chorus::elastic_job {

// What the tests of such jobs use, under one `using namespace chorus::elastic_job`.
using namespace std::chrono_literals;
using namespace chorus::mnist_job;  // the data set, the sample log, the checksums
using Clock = std::chrono::steady_clock;
using chorus::test::child_pids;  // a launcher's: its workers
using chorus::test::contains;
using chorus::test::Subprocess;

// 960 samples, global batch 96 (32 per rank on 3, 48 on 2, 24 on 4): 10 steps per epoch.
constexpr int kSamples = 960, kGlobalBatch = 96, kStepsPerEpoch = 10, kEpochs = 2;

// A fresh directory for one test's job: checkpoints, sample logs.
inline std::string fresh_dir(const std::string& name) {
  const std::string dir = testing::TempDir() + name + "_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// chorus-mnist and its arguments: the data set in `data`, a checkpoint every 2 steps in
// dir/ckpt, resumed from there, the sample log dir/samples.log.
inline std::vector<std::string> mnist_args(const std::string& data, const std::string& dir) {
  return {chorus::mnist_job::kMnist, "--data-dir", data, "--dataset", "mnist", "--batch-size",
          std::to_string(kGlobalBatch), "--epochs", std::to_string(kEpochs), "--momentum", "0.9",
          "--lr", "0.05", "--log-interval", "1", "--checkpoint-dir", dir + "/ckpt",
          "--checkpoint-interval", "2", "--resume", "--sample-log", dir + "/samples.log"};
}

// The launchers of one job: node k's on 127.0.0.(2 + k), all with `launcher_args`.
struct ElasticJob {
  ElasticJob(std::string nnodes, std::vector<std::string> launcher_args)
      : nnodes(std::move(nnodes)), launcher_args(std::move(launcher_args)),
        port(chorus::test::pick_free_port()) {}
  ~ElasticJob() {
    for (auto& n : nodes) {
      if (!n || n->exited()) continue;
      kill(n->pid(), SIGKILL);  // its workers follow (PR_SET_PDEATHSIG)
      n->wait_for(10s);
    }
  }
  // Node k (its --node-rank; node 0 hosts the store) with `nproc` workers of `program`.
  void start(int k, const std::vector<std::string>& program, int nproc = 1) {
    std::vector<std::string> args = {
        "--nnodes", nnodes, "--node-rank", std::to_string(k), "--nproc-per-node",
        std::to_string(nproc), "--master-addr", "127.0.0.2", "--master-port", std::to_string(port),
        "--local-addr", "127.0.0." + std::to_string(2 + k), "--rdzv-id",
        "elastic-mnist-" + std::to_string(port), "--tee", "3"};
    args.insert(args.end(), launcher_args.begin(), launcher_args.end());
    args.insert(args.end(), program.begin(), program.end());
    nodes.push_back(chorus::test::start_chorusrun(args, {{"OMP_NUM_THREADS", "1"}}));
  }
  std::string all_output() const { return chorus::test::launchers_output(nodes); }
  std::string all_stdout() const {
    std::string out;
    for (const auto& n : nodes) out += n->stdout_text();
    return out;
  }
  std::string nnodes;
  std::vector<std::string> launcher_args;
  uint16_t port;
  std::vector<std::unique_ptr<Subprocess>> nodes;
};

// Polls the sample log until `done` holds for its lines (true), or 60 s pass.
template <typename Pred>
bool log_shows(const std::string& path, Pred done) {
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done(read_sample_log(path, /*finished=*/false))) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

// Whether the sample log shows a line of step `step` or later (within 60 s).
inline bool log_reaches_step(const std::string& path, int64_t step) {
  return log_shows(path, [&](const std::vector<LogLine>& lines) {
    return std::any_of(lines.begin(), lines.end(), [&](const LogLine& l) { return l.step >= step; });
  });
}

// The step a job resumed after, from "resumed from ...: epoch E, step S, ..." (the
// first such line of `out`); 0 without one (it started afresh: a round stopped before
// its first checkpoint leaves none to the next).
inline int resumed_step(const std::string& out) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex("resumed from [^:]*: epoch [0-9]+, step ([0-9]+),"))) return 0;
  return std::stoi(m[1]);
}

// One round of the job as its sample log shows it: its world size, its first and last
// logged step, and the steps it lost (logged, then redone by the next round, which
// resumed from an earlier checkpoint).
struct RoundSteps {
  int64_t round, world, first, last, lost;
};

// Checks the sample log of a finished job: every round's lines, less the steps it lost
// (those from the first step a later round logged on), come from ranks 0..world-1 of its
// world size, each step's once, with global ÷ world samples each; together they make
// steps 1..kEpochs × kStepsPerEpoch and hold every sample of every epoch exactly once.
// Returns the rounds that logged a step, in order.
inline std::vector<RoundSteps> check_sample_log(const std::string& path) {
  std::map<int64_t, std::vector<LogLine>> by_round;
  for (const LogLine& l : read_sample_log(path, /*finished=*/true)) by_round[l.round].push_back(l);
  std::vector<RoundSteps> rounds;
  std::map<int64_t, std::set<int64_t>> ranks_of_step;
  std::map<int64_t, int64_t> world_of_step;
  std::map<int64_t, std::multiset<int64_t>> seen;
  for (auto it = by_round.begin(); it != by_round.end(); ++it) {
    int64_t first_next = INT64_MAX;  // of any later round
    for (auto later = std::next(it); later != by_round.end(); ++later) {
      for (const LogLine& l : later->second) first_next = std::min(first_next, l.step);
    }
    RoundSteps r{it->first, it->second.front().world, INT64_MAX, 0, 0};
    std::set<int64_t> lost;
    for (const LogLine& l : it->second) {
      EXPECT_EQ(l.world, r.world) << "round " << r.round << ", step " << l.step;
      r.first = std::min(r.first, l.step);
      r.last = std::max(r.last, l.step);
      if (l.step >= first_next) {
        lost.insert(l.step);
        continue;
      }
      EXPECT_EQ(l.epoch, (l.step - 1) / kStepsPerEpoch) << "step " << l.step;
      EXPECT_EQ(static_cast<int64_t>(l.indices.size()), kGlobalBatch / l.world) << "step " << l.step;
      EXPECT_LT(l.rank, l.world) << "step " << l.step;
      EXPECT_TRUE(ranks_of_step[l.step].insert(l.rank).second)
          << "rank " << l.rank << " logged step " << l.step << " twice";
      world_of_step[l.step] = l.world;
      seen[l.epoch].insert(l.indices.begin(), l.indices.end());
    }
    r.lost = static_cast<int64_t>(lost.size());
    rounds.push_back(r);
  }
  EXPECT_EQ(ranks_of_step.size(), static_cast<size_t>(kEpochs * kStepsPerEpoch));
  for (const auto& [step, ranks] : ranks_of_step) {
    EXPECT_EQ(static_cast<int64_t>(ranks.size()), world_of_step[step]) << "step " << step;
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(kEpochs));
  for (const auto& [epoch, indices] : seen) {
    EXPECT_EQ(indices.size(), static_cast<size_t>(kSamples)) << "epoch " << epoch;
    for (int64_t i = 0; i < kSamples; ++i) {
      if (indices.count(i) != 1) {
        ADD_FAILURE() << "sample " << i << " of epoch " << epoch << " seen " << indices.count(i) << " times";
        break;
      }
    }
  }
  return rounds;
}

// The reference: `ranks` ranks of one standalone launcher restarted from dir/ref_ckpt (a
// copy of the checkpoint the job resumed from, taken by the test), to the same end.
// Expects it to resume after step `saved` (0: to start afresh, the copy being empty);
// returns its parameter checksums by rank.
inline std::map<int, std::string> reference_params(const std::string& data, const std::string& dir,
                                                   int ranks, int saved) {
  std::vector<std::string> args = mnist_args(data, dir);
  args.erase(args.begin());
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == "--checkpoint-dir") args[i + 1] = dir + "/ref_ckpt";
    if (args[i] == "--sample-log") args[i + 1] = dir + "/ref_samples.log";
  }
  auto ref = chorus::mnist_job::job(ranks, args);
  if (!ref->wait_for(120s)) {
    ADD_FAILURE() << "the reference did not finish within 120 s\n" << ref->output_text();
    return {};
  }
  EXPECT_EQ(ref->exit_code(), 0) << ref->output_text();
  EXPECT_EQ(resumed_step(ref->stdout_text()), saved) << ref->output_text();
  return chorus::mnist_job::params_by_rank(ref->stdout_text());
}

}  // namespace chorus::elastic_job
