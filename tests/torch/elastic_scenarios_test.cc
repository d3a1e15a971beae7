// Random-point faults in an elastic chorus-mnist job (issue 26), counted as
// tests/comm/process/fault_test.cc counts its own. Each scenario starts three simulated
// nodes (--nnodes 2:3 --max-restarts 1, one worker each; tests/torch/elastic_job.h),
// picks a victim node (1 or 2: node 0 hosts the store, whose loss ends the job by
// design), a fault and a step of round 0 (3..16), and strikes once the sample log shows
// that step:
// - SIGKILL of the victim's launcher (a lost node), or SIGTERM (a node told to stop,
//   which leaves): the job must finish on the two survivors, world size 2;
// - SIGKILL of the victim's worker: the round fails, and the next one restarts all three
//   nodes' workers (world size 3), using the one restart.
// Either way every launcher left ends with 0, round 1 resumes from the last checkpoint,
// the sample log shows every sample of every epoch exactly once (less the steps round 0
// lost past that checkpoint) and the replicas end equal. Each scenario prints a line
// ("scenario 2: SIGKILL launcher of node 1 at step 7: round 1 (world 2) planned after
// 95 ms, training after 2140 ms, resumed after step 6, 1 step lost") and the test a
// summary ("[elastic summary] ...").
//
// CHORUS_ELASTIC_SCENARIOS=<n> sets the number of scenarios (default 1, for the suite's
// time); CHORUS_ELASTIC_SEED=<seed> repeats the choices (not the kernel's scheduling).
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "torch/elastic_job.h"

namespace {

using namespace chorus::elastic_job;

enum class Fault { kKillLauncher, kStopLauncher, kKillWorker };
constexpr Fault kFaults[] = {Fault::kKillLauncher, Fault::kStopLauncher, Fault::kKillWorker};

const char* fault_name(Fault f) {
  switch (f) {
    case Fault::kKillLauncher: return "SIGKILL launcher";
    case Fault::kStopLauncher: return "SIGTERM launcher";
    case Fault::kKillWorker: return "SIGKILL worker";
  }
  return "?";
}

long long ms_between(Clock::time_point a, Clock::time_point b) {
  return static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(b - a).count());
}

struct Outcome {
  bool passed = false;
  long long planned_ms = -1, training_ms = -1;  // from the fault
  int64_t lost = -1;
};

// One scenario; every failed check is also a test failure.
Outcome run_scenario(int number, Fault fault, int victim, int step, const std::string& data) {
  Outcome o;
  const int failures_before = testing::UnitTest::GetInstance()->current_test_info()->result()->total_part_count();
  const std::string dir = fresh_dir("elastic_scenario_" + std::to_string(number));
  const std::string log = dir + "/samples.log";
  const std::string what = "scenario " + std::to_string(number) + ": " + fault_name(fault) +
                           " of node " + std::to_string(victim) + " at step " + std::to_string(step);
  SCOPED_TRACE(what);
  ElasticJob job("2:3", {"--max-restarts", "1", "--rdzv-conf", "last_call_timeout=60"});
  for (int k : {0, 1, 2}) job.start(k, mnist_args(data, dir));
  if (!log_reaches_step(log, step)) {
    ADD_FAILURE() << "the job never reached step " << step << "\n" << job.all_output();
    return o;
  }
  const pid_t launcher = job.nodes[victim]->pid();
  const std::vector<pid_t> workers = child_pids(launcher);
  const pid_t target = fault != Fault::kKillWorker ? launcher : workers.empty() ? 0 : workers[0];
  if (target <= 0 || kill(target, fault == Fault::kStopLauncher ? SIGTERM : SIGKILL) != 0) {
    ADD_FAILURE() << "no process to strike\n" << job.all_output();
    return o;
  }
  const auto struck = Clock::now();
  // Round 1 as node 0 plans it, then its first logged step (its workers started, loaded
  // the checkpoint and connected).
  const auto deadline = struck + 60s;
  while (Clock::now() < deadline && o.training_ms < 0) {
    if (o.planned_ms < 0 && contains(job.nodes[0]->stderr_text(), "round 1:")) {
      o.planned_ms = ms_between(struck, Clock::now());
    }
    const auto lines = read_sample_log(log, /*finished=*/false);
    if (!lines.empty() && lines.back().round >= 1) o.training_ms = ms_between(struck, Clock::now());
    std::this_thread::sleep_for(5ms);
  }
  const bool launcher_gone = fault != Fault::kKillWorker;
  const int world = launcher_gone ? 2 : 3;
  for (int k : {0, 1, 2}) {
    if (!job.nodes[k]->wait_for(60s)) {
      ADD_FAILURE() << "node " << k << " did not end\n" << job.all_output();
      return o;
    }
    if (k != victim || !launcher_gone) {
      EXPECT_EQ(job.nodes[k]->exit_code(), 0) << "node " << k;
    }
  }
  if (fault == Fault::kStopLauncher) {
    EXPECT_EQ(job.nodes[victim]->exit_code(), 128 + SIGTERM);
  }
  EXPECT_TRUE(contains(job.nodes[0]->stderr_text(), "round 1: " + std::to_string(world) + " node(s)"))
      << job.all_output();
  const int saved = resumed_step(job.all_stdout());
  const std::vector<RoundSteps> rounds = check_sample_log(log);
  if (rounds.size() == 2) {
    EXPECT_EQ(rounds[0].world, 3);
    EXPECT_EQ(rounds[1].world, world);
    EXPECT_EQ(rounds[1].first, saved + 1);
    o.lost = rounds[0].lost;
  } else {
    ADD_FAILURE() << rounds.size() << " rounds in the sample log, not 2";
  }
  const auto params = params_by_rank(job.all_stdout());
  EXPECT_EQ(params.size(), static_cast<size_t>(world)) << job.all_output();
  for (const auto& [rank, hash] : params) EXPECT_EQ(hash, params.begin()->second) << "rank " << rank;
  const int failures_after = testing::UnitTest::GetInstance()->current_test_info()->result()->total_part_count();
  o.passed = failures_after == failures_before;
  std::printf("%s: round 1 (world %d) planned after %lld ms, training after %lld ms, resumed after "
              "step %d, %lld step(s) lost%s\n",
              what.c_str(), world, o.planned_ms, o.training_ms, saved, static_cast<long long>(o.lost),
              o.passed ? "" : "; FAILED");
  std::fflush(stdout);
  if (o.passed) std::filesystem::remove_all(dir);
  return o;
}

TEST(ElasticScenarios, RandomFaultsFinishOnTheSurvivorsWithEverySampleOnce) {
  unsigned seed = std::random_device{}();
  if (const char* s = std::getenv("CHORUS_ELASTIC_SEED")) seed = static_cast<unsigned>(std::strtoul(s, nullptr, 10));
  int count = 1;
  if (const char* s = std::getenv("CHORUS_ELASTIC_SCENARIOS")) count = std::max(1, std::atoi(s));
  std::printf("seed %u (CHORUS_ELASTIC_SEED=%u repeats these choices), %d scenario(s)\n", seed, seed, count);
  std::mt19937 rng(seed);
  const std::string data = make_tiny_dataset(kSamples, 96);
  int passed = 0;
  std::vector<long long> planned, training;
  std::vector<int64_t> lost;
  std::map<std::string, int> by_fault;
  for (int i = 1; i <= count; ++i) {
    const Fault fault = kFaults[rng() % 3];
    const int victim = 1 + static_cast<int>(rng() % 2);
    const int step = 3 + static_cast<int>(rng() % 14);  // 3..16
    const Outcome o = run_scenario(i, fault, victim, step, data);
    by_fault[fault_name(fault)] += 1;
    if (!o.passed) continue;
    ++passed;
    planned.push_back(o.planned_ms);
    training.push_back(o.training_ms);
    lost.push_back(o.lost);
  }
  std::sort(planned.begin(), planned.end());
  std::sort(training.begin(), training.end());
  std::string kinds;
  for (const auto& [name, n] : by_fault) kinds += (kinds.empty() ? "" : ", ") + std::to_string(n) + " " + name;
  std::printf("[elastic summary] %d scenario(s) run (%s), %d passed", count, kinds.c_str(), passed);
  if (passed > 0) {
    std::printf("; round 1 planned %lld-%lld ms after the fault (median %lld), training %lld-%lld ms "
                "(median %lld); steps lost %lld-%lld",
                planned.front(), planned.back(), planned[planned.size() / 2], training.front(),
                training.back(), training[training.size() / 2],
                static_cast<long long>(*std::min_element(lost.begin(), lost.end())),
                static_cast<long long>(*std::max_element(lost.begin(), lost.end())));
  }
  std::printf("\n");
  EXPECT_EQ(passed, count);
}

}  // namespace
