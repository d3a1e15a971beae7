// chorusrun starts PyTorch programs as torchrun does: a script's env:// start-up with
// the gloo backend (rank 0 binds its own TCPStore on the workers' MASTER_PORT, which
// the launchers' store does not hold), on one node and on two simulated nodes; *.py
// through the interpreter, -m, --no-python, --local-rank-arg, and exported MASTER_PORT
// and PET_ variables. The torch cases are skipped, saying why, when /usr/bin/python3
// cannot import torch; the others need no torch.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "util/chorusrun.h"
#include "util/ranks.h"
#include "util/checks.h"

namespace chorus {
namespace {

using namespace std::chrono_literals;
using test::Subprocess;

const std::string kPython = "/usr/bin/python3";
const std::string kHelpers = std::string(CHORUS_SOURCE_DIR) + "/tests/run/helpers";
const std::string kScript = kHelpers + "/torch_allreduce.py";

using chorus::test::contains;

// Why torch cases cannot run here, or empty when they can.
const std::string& torch_missing() {
  static const std::string why = [] {
    std::string output;
    int code = test::run_command(kPython, {"-c", "import torch.distributed as d; "
                                                 "assert d.is_gloo_available()"},
                                 &output, 120s);
    return code == 0 ? std::string() : kPython + " cannot import torch with gloo: " + output;
  }();
  return why;
}

#define SKIP_WITHOUT_TORCH()                                   \
  if (!torch_missing().empty()) GTEST_SKIP() << torch_missing()

// Runs a launcher to its end and expects exit 0.
void expect_success(Subprocess& run) {
  ASSERT_TRUE(run.wait_for(300s)) << run.output_text();
  EXPECT_EQ(run.exit_code(), 0) << run.output_text();
}

// The MASTER_PORT values the workers printed.
std::set<std::string> worker_ports(const std::string& output) {
  std::set<std::string> ports;
  std::regex re("MASTER_PORT ([0-9]+), store port");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), re);
       it != std::sregex_iterator(); ++it) {
    ports.insert((*it)[1]);
  }
  return ports;
}

TEST(TorchPrograms, InterpreterAndScriptOnOneNode) {
  SKIP_WITHOUT_TORCH();
  uint16_t port = test::pick_free_port();
  auto run = test::start_chorusrun({"--nproc-per-node", "2", "--master-port",
                                    std::to_string(port), kPython, kScript,
                                    "--expect-world-size", "2"});
  expect_success(*run);
  std::string out = run->stdout_text();
  EXPECT_TRUE(contains(out, "torch rank 0 of 2 ok: local rank 0")) << run->output_text();
  EXPECT_TRUE(contains(out, "torch rank 1 of 2 ok: local rank 1")) << run->output_text();
  EXPECT_EQ(test::occurrences(out, "store port " + std::to_string(port) + ","), 2u) << out;
  // Both ranks were given one MASTER_PORT, not the store's.
  std::set<std::string> ports = worker_ports(out);
  EXPECT_EQ(ports.size(), 1u) << out;
  EXPECT_EQ(ports.count(std::to_string(port)), 0u) << out;
}

TEST(TorchPrograms, StandaloneScriptRunsWithThePythonInterpreter) {
  SKIP_WITHOUT_TORCH();
  // torch_allreduce.py is not executable: it can only have run through the interpreter.
  auto run = test::start_chorusrun(
      {"--standalone", "--nproc-per-node", "2", kScript, "--expect-world-size", "2"});
  expect_success(*run);
  EXPECT_EQ(test::occurrences(run->stdout_text(), "python " + kPython + ", run as script"), 2u)
      << run->output_text();
}

TEST(TorchPrograms, TwoSimulatedNodesOfTwoWorkers) {
  SKIP_WITHOUT_TORCH();
  uint16_t port = test::pick_free_port();
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int node = 0; node < 2; ++node) {
    std::vector<std::string> args = test::simulated_node_options(node, port, 2);
    args.insert(args.end(), {kScript, "--expect-world-size", "4"});
    nodes.push_back(test::start_chorusrun(args));
  }
  std::string all;
  for (auto& n : nodes) {
    expect_success(*n);
    all += n->stdout_text();
  }
  for (int r = 0; r < 4; ++r) {
    EXPECT_TRUE(contains(all, "torch rank " + std::to_string(r) + " of 4 ok: local rank " +
                                  std::to_string(r % 2)))
        << all;
  }
  EXPECT_TRUE(contains(nodes[1]->stdout_text(), "torch rank 3 of 4 ok")) << all;
  std::set<std::string> ports = worker_ports(all);
  EXPECT_EQ(ports.size(), 1u) << "the nodes' workers disagree on MASTER_PORT\n" << all;
}

TEST(TorchPrograms, ModuleRunsAsPythonDashM) {
  SKIP_WITHOUT_TORCH();
  auto run = test::start_chorusrun(
      {"--standalone", "--nproc-per-node", "2", "-m", "torch_allreduce", "--expect-world-size",
       "2"},
      {{"PYTHONPATH", kHelpers}});
  expect_success(*run);
  EXPECT_EQ(test::occurrences(run->stdout_text(), "run as module torch_allreduce"), 2u) << run->output_text();
}

TEST(TorchPrograms, LocalRankArgumentAsTorchDistributedLaunchPassesIt) {
  SKIP_WITHOUT_TORCH();
  auto run = test::start_chorusrun({"--standalone", "--nproc_per_node=2", "--local_rank_arg",
                                    kScript, "--expect-world-size", "2",
                                    "--expect-local-rank-arg"});
  expect_success(*run);
  EXPECT_EQ(test::occurrences(run->stdout_text(), "torch rank"), 2u) << run->output_text();
}

// Two jobs on one node, each with its own exported MASTER_PORT: each launcher's store
// is on that port, and neither job's workers collide with the other's.
TEST(TorchPrograms, ExportedMasterPortKeepsTwoJobsApart) {
  SKIP_WITHOUT_TORCH();
  uint16_t first = test::pick_free_port(), second = test::pick_free_port();
  std::vector<std::unique_ptr<Subprocess>> jobs;
  for (uint16_t port : {first, second}) {
    jobs.push_back(test::start_chorusrun({"--nproc-per-node", "2", kScript,
                                          "--expect-world-size", "2"},
                                         {{"MASTER_PORT", std::to_string(port)}}));
  }
  for (size_t j = 0; j < jobs.size(); ++j) {
    expect_success(*jobs[j]);
    uint16_t port = j == 0 ? first : second;
    EXPECT_EQ(test::occurrences(jobs[j]->stdout_text(), "store port " + std::to_string(port) + ","), 2u)
        << jobs[j]->output_text();
  }
}

// A job controller's torchrun variables (Kubeflow's PyTorchJob sets these).
TEST(TorchPrograms, PetVariablesConfigureTheJob) {
  SKIP_WITHOUT_TORCH();
  uint16_t port = test::pick_free_port();
  auto run = test::start_chorusrun(
      {kScript, "--expect-world-size", "2"},
      {{"PET_NPROC_PER_NODE", "2"}, {"PET_NNODES", "1:1"}, {"PET_MASTER_PORT", std::to_string(port)}});
  expect_success(*run);
  EXPECT_EQ(test::occurrences(run->stdout_text(), "store port " + std::to_string(port) + ","), 2u)
      << run->output_text();
}

// --- Without torch ---------------------------------------------------------------------

// A shell script named *.py, executable: what it prints shows how it was started.
std::string make_shell_script(const std::string& name) {
  std::string path = testing::TempDir() + name;
  std::ofstream(path) << "#!/bin/sh\necho \"shell rank $RANK args $*\"\n";
  EXPECT_EQ(chmod(path.c_str(), 0755), 0);
  return path;
}

TEST(TorchPrograms, NoPythonRunsADotPyProgramItself) {
  std::string script = make_shell_script("no_python_" + std::to_string(getpid()) + ".py");
  auto run = test::start_chorusrun(
      {"--standalone", "--nproc-per-node", "2", "--no-python", "--local-rank-arg", script, "a", "b"});
  expect_success(*run);
  std::string out = run->stdout_text();
  EXPECT_TRUE(contains(out, "shell rank 0 args a b --local_rank=0\n")) << run->output_text();
  EXPECT_TRUE(contains(out, "shell rank 1 args a b --local_rank=1\n")) << run->output_text();
}

// Without --no-python the same file goes to the interpreter: --python names it (here a
// shell, which reads the script as well; -u, torchrun's unbuffered flag, is harmless
// to it), and so does CHORUS_RUN_PYTHON.
TEST(TorchPrograms, DotPyProgramGoesToThePythonInterpreter) {
  std::string script = make_shell_script("interpreted_" + std::to_string(getpid()) + ".py");
  auto given = test::start_chorusrun({"--standalone", "--python", "/bin/sh", script, "x"});
  expect_success(*given);
  EXPECT_TRUE(contains(given->stdout_text(), "shell rank 0 args x\n")) << given->output_text();
  auto variable = test::start_chorusrun({"--standalone", script, "y"},
                                        {{"CHORUS_RUN_PYTHON", "/bin/sh"}});
  expect_success(*variable);
  EXPECT_TRUE(contains(variable->stdout_text(), "shell rank 0 args y\n")) << variable->output_text();
  // The default interpreter is Python, which cannot read a shell script.
  if (access(kPython.c_str(), X_OK) == 0) {
    auto python = test::start_chorusrun({"--standalone", script});
    ASSERT_TRUE(python->wait_for(60s)) << python->output_text();
    EXPECT_NE(python->exit_code(), 0) << python->output_text();
    EXPECT_TRUE(contains(python->stderr_text(), "SyntaxError")) << python->output_text();
  }
}

// Bad values of the new variables and options stop chorusrun before anything starts.
TEST(TorchPrograms, BadTorchrunValuesExitTwoNamingThem) {
  struct Case {
    std::vector<std::string> args;
    std::map<std::string, std::string> env;
    std::string names;
  };
  const Case cases[] = {
      {{"prog"}, {{"MASTER_PORT", "http"}}, "MASTER_PORT=http"},
      {{"prog"}, {{"MASTER_ADDR", "a b"}}, "MASTER_ADDR=\"a b\""},
      {{"prog"}, {{"PET_NNODES", "4:1"}}, "PET_NNODES=4:1: must be N or MIN:MAX"},
      {{"--rdzv-backend", "etcd", "prog"}, {}, "--rdzv-backend etcd: etcd rendezvous"},
      {{"--rdzv-conf", "timeout=9", "prog"}, {}, "--rdzv-conf timeout=9"},
      {{"-m", "--no-python", "mod"}, {}, "--module"},
  };
  for (const Case& c : cases) {
    auto run = test::start_chorusrun(c.args, c.env);
    ASSERT_TRUE(run->wait_for(10s)) << run->output_text();
    EXPECT_EQ(run->exit_code(), 2) << run->output_text();
    EXPECT_TRUE(contains(run->stderr_text(), c.names)) << run->stderr_text();
  }
}

}  // namespace
}  // namespace chorus
