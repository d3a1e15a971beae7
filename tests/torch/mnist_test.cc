// chorus-mnist end to end through chorusrun: the seed job's first losses, bitwise
// identical replicas, and resuming from checkpoints.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>

#include "torch/mnist_job.h"
#include "util/chorusrun.h"
#include "util/ranks.h"
#include "util/checks.h"

namespace {

using namespace std::chrono_literals;
using chorus::test::Subprocess;
using chorus::test::SpawnOptions;

using chorus::mnist_job::job;
using chorus::test::contains;
using chorus::mnist_job::job_options;
using chorus::mnist_job::kFashion;
using chorus::mnist_job::kMnist;
using chorus::mnist_job::kRun;
using chorus::mnist_job::launcher_options;
using chorus::mnist_job::make_tiny_dataset;
using chorus::mnist_job::params_by_rank;

// The string `key` of chorus-mnist's JSON line, run on 1 rank with `env` set (an empty
// value: unset).
std::string json_field_of_a_run(const std::string& data, const std::string& key,
                                const std::map<std::string, std::string>& env,
                                std::string* output) {
  chorus::test::SpawnOptions o = job_options(
      1, {"--data-dir", data, "--dataset", "mnist", "--epochs", "1", "--max-steps", "1", "--batch-size", "64"});
  for (const auto& [name, value] : env) {
    if (value.empty()) o.unset_env.push_back(name);
    else o.env[name] = value;
  }
  Subprocess run(kRun, o);
  EXPECT_TRUE(run.wait_for(300s)) << run.output_text();
  EXPECT_EQ(run.exit_code(), 0) << run.output_text();
  *output = run.output_text();
  std::smatch m;
  std::string out = run.stdout_text();
  if (!std::regex_search(out, m, std::regex("\"" + key + "\":\"([^\"]*)\""))) {
    ADD_FAILURE() << "no " << key << " in the JSON line: " << out;
    return "?";
  }
  return m[1];
}

// The OpenBLAS kernels chorus-mnist computed with, with OPENBLAS_CORETYPE set to
// `coretype` (unset when it is empty).
std::string blas_kernels_of_a_run(const std::string& data, const std::string& coretype,
                                  std::string* output) {
  return json_field_of_a_run(data, "blas", {{"OPENBLAS_CORETYPE", coretype}}, output);
}

// Debian 12's OpenBLAS falls back to its generic Prescott kernels on CPUs it does not
// know; chorus-mnist then runs itself again with kernels for what the CPU has. A
// kernel set the user chose is kept.
TEST(ChorusMnist, ComputesWithNativeBlasKernelsUnlessTheUserChose) {
  std::string data = make_tiny_dataset(256, 64), output;
  std::string chosen = blas_kernels_of_a_run(data, "Prescott", &output);
  if (chosen.empty()) GTEST_SKIP() << "libtorch does not compute on OpenBLAS here";
  EXPECT_EQ(chosen, "Prescott") << output;
  EXPECT_FALSE(contains(output, "running again")) << output;
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    GTEST_SKIP() << "this CPU has no AVX2 and FMA: the generic kernels are what it can run";
  }
  std::string picked = blas_kernels_of_a_run(data, "", &output);
  EXPECT_NE(picked, "Prescott") << output;
  EXPECT_FALSE(picked.empty()) << output;
}

// chorus-mnist fixes glibc's mmap and trim thresholds, so that the memory a step frees
// serves the next step instead of coming back as page faults; thresholds the user set
// are kept.
TEST(ChorusMnist, KeepsFreedMemoryUnlessTheUserSetMallocThresholds) {
  std::string data = make_tiny_dataset(256, 64), output;
  const std::map<std::string, std::string> none = {
      {"MALLOC_MMAP_THRESHOLD_", ""}, {"MALLOC_TRIM_THRESHOLD_", ""}, {"GLIBC_TUNABLES", ""}};
  EXPECT_EQ(json_field_of_a_run(data, "malloc_thresholds", none, &output), "fixed") << output;
  const std::map<std::string, std::string> users = {
      {"MALLOC_MMAP_THRESHOLD_", "1048576"},
      {"MALLOC_TRIM_THRESHOLD_", "1048576"},
      {"GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1048576"}};
  for (const auto& [name, value] : users) {
    auto env = none;
    env[name] = value;
    EXPECT_EQ(json_field_of_a_run(data, "malloc_thresholds", env, &output), "user") << name << output;
  }
}

TEST(ChorusMnist, FirstLossesAreTheSeedJobs) {
  if (!std::filesystem::exists(kFashion + "/train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "Fashion-MNIST is not installed (scripts/install-deps.sh installs "
                    "dataset-fashion-mnist)";
  }
  auto run = job(2, {"--epochs", "1", "--max-steps", "2"});
  ASSERT_TRUE(run->wait_for(300s)) << run->output_text();
  ASSERT_EQ(run->exit_code(), 0) << run->output_text();
  std::string out = run->stdout_text();
  // What seed 000 printed, and what PyTorch 1.13 prints for the same model, seed and data.
  EXPECT_TRUE(contains(out, "[rank 0]: loss: 2.309577 [    0/60000]")) << out;
  EXPECT_TRUE(contains(out, "[rank 1]: loss: 2.303763 [    0/60000]")) << out;
  auto params = params_by_rank(out);
  ASSERT_EQ(params.size(), 2u) << out;
  EXPECT_EQ(params[0], params[1]) << "replicas differ after 2 steps";
}

TEST(ChorusMnist, ReplicasStayBitwiseEqualWithMomentum) {
  std::string data = make_tiny_dataset(1024, 256);
  auto run = job(3, {"--data-dir", data, "--dataset", "mnist", "--epochs", "2", "--batch-size",
                     "96", "--momentum", "0.9", "--lr", "0.05", "--workers", "2"});
  ASSERT_TRUE(run->wait_for(300s)) << run->output_text();
  ASSERT_EQ(run->exit_code(), 0) << run->output_text();
  auto params = params_by_rank(run->stdout_text());
  ASSERT_EQ(params.size(), 3u) << run->output_text();
  EXPECT_EQ(params[0], params[1]);
  EXPECT_EQ(params[0], params[2]);
}

TEST(ChorusMnist, ResumeFromAnEpochBoundaryMatchesAnUninterruptedRun) {
  std::string data = make_tiny_dataset(1024, 256);
  std::vector<std::string> common = {"--data-dir", data, "--dataset", "mnist", "--batch-size",
                                     "128", "--momentum", "0.9", "--lr", "0.05"};
  auto full = common;
  full.insert(full.end(), {"--epochs", "3"});
  auto straight = job(2, full);
  ASSERT_TRUE(straight->wait_for(300s)) << straight->output_text();
  ASSERT_EQ(straight->exit_code(), 0) << straight->output_text();

  std::string ckpt = testing::TempDir() + "ckpt_" + std::to_string(getpid());
  auto first = common;
  first.insert(first.end(), {"--epochs", "1", "--checkpoint-dir", ckpt});
  auto part1 = job(2, first);
  ASSERT_TRUE(part1->wait_for(300s)) << part1->output_text();
  ASSERT_EQ(part1->exit_code(), 0) << part1->output_text();
  auto rest = common;
  rest.insert(rest.end(), {"--epochs", "3", "--checkpoint-dir", ckpt, "--resume"});
  auto part2 = job(2, rest);
  ASSERT_TRUE(part2->wait_for(300s)) << part2->output_text();
  ASSERT_EQ(part2->exit_code(), 0) << part2->output_text();
  EXPECT_TRUE(contains(part2->stdout_text(), "resumed from")) << part2->output_text();
  EXPECT_EQ(params_by_rank(straight->stdout_text())[0], params_by_rank(part2->stdout_text())[0]);
}

TEST(ChorusMnist, KilledMidEpochResumesFromTheLastCheckpoint) {
  std::string data = make_tiny_dataset(4096, 256);
  std::string ckpt = testing::TempDir() + "ckpt_kill_" + std::to_string(getpid());
  std::vector<std::string> args = {"--data-dir", data, "--dataset", "mnist", "--batch-size", "64",
                                   "--epochs", "2", "--checkpoint-dir", ckpt,
                                   "--checkpoint-interval", "5", "--log-interval", "1"};
  auto straight_args = args;
  straight_args[straight_args.size() - 5] = ckpt + "_straight";
  auto straight = job(2, straight_args);
  ASSERT_TRUE(straight->wait_for(300s)) << straight->output_text();
  ASSERT_EQ(straight->exit_code(), 0) << straight->output_text();

  auto victim = job(2, args);
  // Past the second checkpoint (step 10) and inside epoch 0 (64 steps of 64 per rank).
  ASSERT_TRUE(victim->wait_for_output("[  832/ 4096]", 300s)) << victim->output_text();
  victim->kill_group(SIGKILL);
  ASSERT_TRUE(victim->wait_for(30s));
  ASSERT_TRUE(std::filesystem::exists(ckpt + "/checkpoint.pt"));
  EXPECT_FALSE(std::filesystem::exists(ckpt + "/checkpoint.pt.tmp.partial"));

  args.push_back("--resume");
  auto resumed = job(2, args);
  ASSERT_TRUE(resumed->wait_for(300s)) << resumed->output_text();
  ASSERT_EQ(resumed->exit_code(), 0) << resumed->output_text();
  std::string out = resumed->stdout_text();
  EXPECT_TRUE(contains(out, "resumed from")) << out;
  // Its first step is past the checkpoint, not at the start of epoch 0.
  size_t first_loss = out.find("loss: ");
  ASSERT_NE(first_loss, std::string::npos) << out;
  EXPECT_NE(out.substr(first_loss, 40).find("/ 4096]"), std::string::npos) << out;
  EXPECT_EQ(out.substr(first_loss, 40).find("[    0/ 4096]"), std::string::npos)
      << "the resumed run started epoch 0 over\n" << out;
  // Resuming from a mid-epoch checkpoint replays the same batches in the same order.
  EXPECT_EQ(params_by_rank(straight->stdout_text())[0], params_by_rank(out)[0]) << out;
}

// Training under faults (issue 6): chorusrun --max-restarts 3, one worker SIGKILLed at
// a random step past the first checkpoint. chorusrun stops the other worker, restarts
// both, they resume from the last checkpoint (mid-epoch: the same batches in the same
// order from there), and the job finishes with the parameters of an uninterrupted run.
// The step comes from CHORUS_FAULT_SEED when set, else a fresh seed; both are printed.
TEST(ChorusMnist, WorkerKilledAtARandomStepIsRestartedAndEndsAsUninterrupted) {
  unsigned seed = std::random_device{}();
  if (const char* s = std::getenv("CHORUS_FAULT_SEED")) seed = static_cast<unsigned>(std::strtoul(s, nullptr, 10));
  std::mt19937 rng(seed);
  // 4096 samples, global batch 64 on 2 ranks: 64 steps per epoch, a checkpoint every 5.
  const int kill_after = 6 + static_cast<int>(rng() % 55);  // a step of epoch 0, past step 5
  std::printf("seed %u (CHORUS_FAULT_SEED=%u repeats it): kill a worker after step %d\n", seed,
              seed, kill_after);
  std::string data = make_tiny_dataset(4096, 256);
  std::string ckpt = testing::TempDir() + "ckpt_restart_" + std::to_string(getpid());
  std::filesystem::remove_all(ckpt);
  std::filesystem::remove_all(ckpt + "_straight");
  std::vector<std::string> args = {"--data-dir", data, "--dataset", "mnist", "--batch-size", "64",
                                   "--epochs", "2", "--checkpoint-dir", ckpt,
                                   "--checkpoint-interval", "5", "--log-interval", "1", "--resume"};
  auto straight_args = args;
  straight_args[9] = ckpt + "_straight";
  auto straight = job(2, straight_args);
  ASSERT_TRUE(straight->wait_for(300s)) << straight->output_text();
  ASSERT_EQ(straight->exit_code(), 0) << straight->output_text();
  EXPECT_FALSE(contains(straight->stdout_text(), "resumed from")) << straight->output_text();

  auto run = job(2, args, {"--max-restarts", "3"});
  // Step k (1-based) logs "[ (k-1)*32/ 4096]" (32 samples per rank and step).
  char needle[32];
  std::snprintf(needle, sizeof needle, "[%5d/ 4096]", (kill_after - 1) * 32);
  ASSERT_TRUE(run->wait_for_output(needle, 300s)) << needle << "\n" << run->output_text();
  std::vector<pid_t> workers;
  for (pid_t child : chorus::test::child_pids(run->pid())) {
    std::ifstream cmdline("/proc/" + std::to_string(child) + "/cmdline");
    std::string argv0;
    std::getline(cmdline, argv0, '\0');
    if (contains(argv0, "chorus-mnist")) workers.push_back(child);
  }
  ASSERT_EQ(workers.size(), 2u) << "the workers of chorusrun (pid " << run->pid() << ")";
  const pid_t victim = workers[rng() % workers.size()];
  std::string rank = "?";
  {
    std::ifstream environ_file("/proc/" + std::to_string(victim) + "/environ");
    for (std::string var; std::getline(environ_file, var, '\0');) {
      if (var.rfind("RANK=", 0) == 0) rank = var.substr(5);
    }
  }
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  std::printf("killed rank %s (pid %d) after step %d\n", rank.c_str(), static_cast<int>(victim),
              kill_after);

  ASSERT_TRUE(run->wait_for(300s)) << run->output_text();
  ASSERT_EQ(run->exit_code(), 0) << run->output_text();
  const std::string err = run->stderr_text(), out = run->stdout_text();
  EXPECT_TRUE(contains(err, "attempt 0 failed (rank " + rank + ": ")) << err;
  EXPECT_TRUE(contains(err, "restarting all nodes (1 of 3 restarts)")) << err;
  EXPECT_FALSE(contains(err, "attempt 1 failed")) << err;
  // The restart resumed from a mid-epoch checkpoint, not from the start.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("resumed from [^:]*: epoch ([0-9]+), step ([0-9]+)")))
      << out;
  const int resumed_step = std::stoi(m[2]);
  std::printf("restarted from the checkpoint of epoch %s, step %d\n", m[1].str().c_str(), resumed_step);
  EXPECT_EQ(m[1].str(), "0");
  EXPECT_GE(resumed_step, 5);
  EXPECT_EQ(resumed_step % 5, 0);
  auto expected = params_by_rank(straight->stdout_text());
  auto got = params_by_rank(out);
  ASSERT_EQ(expected.size(), 2u) << straight->output_text();
  ASSERT_EQ(got.size(), 2u) << run->output_text();
  EXPECT_EQ(got[0], got[1]) << "replicas differ after the restart";
  EXPECT_EQ(got[0], expected[0]) << "the restarted job does not end where an uninterrupted run does\n"
                                 << out;
  std::filesystem::remove_all(ckpt);
  std::filesystem::remove_all(ckpt + "_straight");
}

TEST(ChorusMnist, TwoSimulatedNodesOfTwoWorkers) {
  std::string data = make_tiny_dataset(1024, 256);
  uint16_t port = chorus::test::pick_free_port();
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int node = 0; node < 2; ++node) {
    chorus::test::SpawnOptions o = launcher_options(
        {"--nnodes", "2", "--node-rank", std::to_string(node), "--nproc-per-node", "2",
         "--master-addr", "127.0.0.2", "--master-port", std::to_string(port), "--local-addr",
         node == 0 ? "127.0.0.2" : "127.0.0.3", "--tee", "3", kMnist, "--data-dir", data,
         "--dataset", "mnist", "--epochs", "1", "--batch-size", "128"});
    nodes.push_back(std::make_unique<Subprocess>(kRun, o));
  }
  std::string all;
  for (auto& n : nodes) {
    ASSERT_TRUE(n->wait_for(300s)) << n->output_text();
    EXPECT_EQ(n->exit_code(), 0) << n->output_text();
    all += n->stdout_text();
  }
  auto params = params_by_rank(all);
  ASSERT_EQ(params.size(), 4u) << all;
  for (int r = 1; r < 4; ++r) EXPECT_EQ(params[0], params[r]) << all;
}

// --metrics: rank 0 writes one JSON line per log interval and one per epoch, with the
// fields scripts/plot draws; steps only grow. The plain output is unchanged (stdout is
// not a terminal here, so there is no progress bar).
TEST(ChorusMnist, MetricsFileHasAJsonLinePerLogIntervalAndEpoch) {
  std::string data = make_tiny_dataset(1024, 256);
  std::string file = testing::TempDir() + "metrics_" + std::to_string(getpid()) + ".jsonl";
  std::filesystem::remove(file);
  auto run = job(2, {"--data-dir", data, "--dataset", "mnist", "--epochs", "2", "--batch-size", "128",
                     "--log-interval", "2", "--metrics", file});
  ASSERT_TRUE(run->wait_for(300s)) << run->output_text();
  ASSERT_EQ(run->exit_code(), 0) << run->output_text();
  const std::string out = run->stdout_text();
  EXPECT_TRUE(contains(out, "[rank 0]: curr epoch:  1")) << out;
  EXPECT_TRUE(contains(out, "[rank 0]: loss: ")) << out;
  EXPECT_TRUE(contains(out, "[rank 1]: loss: ")) << out;
  EXPECT_FALSE(contains(out, "ETA")) << out;

  std::ifstream in(file);
  ASSERT_TRUE(in) << file;
  int train_lines = 0, epoch_lines = 0;
  int64_t last_step = 0;
  double last_wall = 0;
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j;
    ASSERT_NO_THROW(j = nlohmann::json::parse(line)) << line;
    ASSERT_TRUE(j.is_object()) << line;
    for (const char* key : {"event", "epoch", "step", "wall_time_s"}) {
      ASSERT_TRUE(j.contains(key)) << key << " missing in " << line;
    }
    const int64_t step = j["step"].get<int64_t>();
    const double wall = j["wall_time_s"].get<double>();
    EXPECT_GE(wall, last_wall) << line;
    last_wall = wall;
    if (j["event"] == "train") {
      ++train_lines;
      EXPECT_GT(step, last_step) << "steps must grow: " << line;
      for (const char* key : {"loss", "steps", "samples_per_second", "step_s", "compute_s",
                              "allreduce_wait_s", "backward_s", "buckets"}) {
        ASSERT_TRUE(j.contains(key) && j[key].is_number()) << key << " missing in " << line;
      }
      EXPECT_GE(j["steps"].get<int64_t>(), 1) << line;
      EXPECT_GE(j["buckets"].get<int64_t>(), 1) << "2 ranks communicate: " << line;
      EXPECT_GE(j["allreduce_wait_s"].get<double>(), 0) << line;
      EXPECT_GE(j["compute_s"].get<double>(), 0) << line;
      EXPECT_NEAR(j["compute_s"].get<double>() + j["allreduce_wait_s"].get<double>(),
                  j["step_s"].get<double>(), 1e-9) << line;
      EXPECT_GT(j["loss"].get<double>(), 0) << line;
    } else {
      ASSERT_EQ(j["event"], "epoch") << line;
      EXPECT_EQ(j["epoch"].get<int>(), epoch_lines) << line;
      ++epoch_lines;
      EXPECT_GE(step, last_step) << line;
      const double accuracy = j["test_accuracy"].get<double>();
      EXPECT_GE(accuracy, 0) << line;
      EXPECT_LE(accuracy, 1) << line;
      EXPECT_TRUE(j["test_loss"].is_number()) << line;
    }
    last_step = step;
  }
  // 1024 samples, global batch 128: 8 steps an epoch, logged at batches 0, 2, 4, 6.
  EXPECT_EQ(train_lines, 8);
  EXPECT_EQ(epoch_lines, 2);
  EXPECT_EQ(last_step, 16);
  std::filesystem::remove(file);

  // A path that cannot be written fails before training, naming it.
  const std::string bad = testing::TempDir() + "no_such_dir_" + std::to_string(getpid()) + "/m.jsonl";
  auto failed = job(1, {"--data-dir", data, "--dataset", "mnist", "--epochs", "1", "--metrics", bad});
  ASSERT_TRUE(failed->wait_for(60s)) << failed->output_text();
  EXPECT_EQ(failed->exit_code(), 2) << failed->output_text();
  EXPECT_TRUE(contains(failed->stderr_text(), "cannot write the --metrics file " + bad))
      << failed->output_text();
  EXPECT_FALSE(contains(failed->stdout_text(), "curr epoch")) << failed->output_text();
}

// Rank 0 draws a progress bar when told its console is a terminal (chorusrun sets
// CHORUS_STDOUT_TERMINAL=1; here the program runs alone on a pipe): status lines ended
// by '\r' instead of the "curr epoch" and "loss:" lines, one finished bar per epoch,
// and the test lines as before.
TEST(ChorusMnist, ProgressBarInsteadOfPlainLinesOnATerminal) {
  std::string data = make_tiny_dataset(1024, 256);
  SpawnOptions o;
  o.args = {"--data-dir", data, "--dataset", "mnist", "--epochs", "2", "--batch-size", "128"};
  o.env = {{"CHORUS_STDOUT_TERMINAL", "1"}};
  o.unset_env = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"};
  Subprocess run(kMnist, o);
  ASSERT_TRUE(run.wait_for(300s)) << run.output_text();
  ASSERT_EQ(run.exit_code(), 0) << run.output_text();
  const std::string out = run.stdout_text();
  EXPECT_FALSE(contains(out, "curr epoch")) << out;
  EXPECT_FALSE(std::regex_search(out, std::regex("(^|\n)loss: "))) << out;
  // 1024 samples, batch 128: 8 steps an epoch; each epoch's bar ends full, then '\n'.
  EXPECT_TRUE(contains(out, "epoch 1/2 [####################] 8/8 loss ")) << out;
  EXPECT_TRUE(contains(out, "epoch 2/2 [####################] 8/8 loss ")) << out;
  EXPECT_TRUE(std::regex_search(out, std::regex("epoch 2/2 \\[#+\\] 8/8 loss [0-9.]+ +[0-9]+ samples/s ETA 0:00\r\n")))
      << out;
  EXPECT_FALSE(contains(out, "\x1b")) << "escape codes are the launcher's to add on a pipe: " << out;
  EXPECT_TRUE(contains(out, "Accuracy: ")) << out;
  EXPECT_TRUE(contains(out, "rank 0 params ")) << out;
}

TEST(ChorusMnist, BadArgumentsAndDataAreNamed) {
  std::string missing = testing::TempDir() + "no_such_dataset_dir";
  auto run = job(1, {"--data-dir", missing, "--epochs", "1"});
  ASSERT_TRUE(run->wait_for(60s));
  EXPECT_NE(run->exit_code(), 0);
  EXPECT_TRUE(contains(run->stderr_text(), missing)) << run->output_text();
}

}  // namespace
