// chorusrun end to end: real launchers, real workers (chorus_test_worker), simulated
// nodes on distinct loopback addresses (127.0.0.2, 127.0.0.3).
#include <gtest/gtest.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <iterator>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "comm/common/socket.h"
#include "run/cpu_binding.h"
#include "util/chorusrun.h"
#include "util/ranks.h"
#include "util/checks.h"

namespace chorus {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using test::all_gone;
using test::Subprocess;

const std::string kWorker = test::test_worker_path();
const std::string kScripted = test::scripted_worker_path();

using chorus::test::contains;

std::unique_ptr<Subprocess> launcher(const std::vector<std::string>& args,
                                     std::map<std::string, std::string> env = {}) {
  return test::start_chorusrun(args, std::move(env));
}

// Launcher arguments for node `node` of a 2-node job with `nproc` workers each.
std::vector<std::string> node_args(int node, uint16_t port, int nproc,
                                   const std::vector<std::string>& extra,
                                   const std::vector<std::string>& program) {
  std::vector<std::string> a = test::simulated_node_options(node, port, nproc);
  a.insert(a.end(), extra.begin(), extra.end());
  a.push_back(kWorker);
  a.insert(a.end(), program.begin(), program.end());
  return a;
}

// Worker pids by rank, from the workers' "rank R of N connected (pid P" lines.
std::map<int, pid_t> pids_by_rank(const std::string& output) {
  std::map<int, pid_t> pids;
  std::regex re("rank ([0-9]+) of [0-9]+ connected \\(pid ([0-9]+)");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), re);
       it != std::sregex_iterator(); ++it) {
    pids[std::stoi((*it)[1])] = static_cast<pid_t>(std::stoi((*it)[2]));
  }
  return pids;
}

std::vector<pid_t> worker_pids(const std::string& output) {
  std::vector<pid_t> pids;
  for (auto [rank, pid] : pids_by_rank(output)) pids.push_back(pid);
  return pids;
}

// Runs chorusrun with `args`, its stdin, stdout and stderr on a pseudo-terminal, for up
// to 120 s (then it is killed). Returns what it wrote there (the terminal turns "\n"
// into "\r\n") and sets `exit_code` (-1: killed or timed out).
std::string run_on_terminal(const std::vector<std::string>& args, int& exit_code) {
  std::vector<std::string> argv{test::chorusrun_path()};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> c_argv;
  for (auto& a : argv) c_argv.push_back(a.data());
  c_argv.push_back(nullptr);
  int master = -1;
  pid_t pid = forkpty(&master, nullptr, nullptr, nullptr);
  if (pid < 0) throw std::runtime_error("forkpty failed");
  if (pid == 0) {
    execv(c_argv[0], c_argv.data());
    _exit(127);
  }
  std::string text;
  const auto deadline = Clock::now() + 120s;
  char buffer[4096];
  while (Clock::now() < deadline) {
    pollfd p{master, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    ssize_t n = read(master, buffer, sizeof buffer);
    if (n <= 0) break;  // EIO: every holder of the terminal's other side has closed it
    text.append(buffer, static_cast<size_t>(n));
  }
  // The terminal closes as chorusrun's files do, a moment before it can be reaped.
  int status = 0;
  pid_t reaped = 0;
  while ((reaped = waitpid(pid, &status, WNOHANG)) == 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  if (reaped != pid) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    status = -1;
  }
  close(master);
  exit_code = status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return text;
}

// On a terminal, chorusrun tells its workers (CHORUS_STDOUT_TERMINAL=1, for progress
// bars) and redraws their status lines in place; on a pipe it does neither, even when
// the variable came from its own environment.
TEST(Chorusrun, StatusLinesOfWorkersAreRedrawnOnATerminalOnly) {
  const std::vector<std::string> args{"--standalone", "--nproc-per-node", "1", kScripted, "env-dump",
                                      "partial", "st 1\r", "sleep", "0.3", "partial", "\n", "out", "done"};
  int code = -1;
  const std::string on_terminal = run_on_terminal(args, code);
  EXPECT_EQ(code, 0) << on_terminal;
  EXPECT_TRUE(contains(on_terminal, "CHORUS_STDOUT_TERMINAL=1\r\n")) << on_terminal;
  EXPECT_TRUE(contains(on_terminal, "\r\x1b[Kst 1\x1b[K\r\x1b[Kst 1\r\ndone\r\n")) << on_terminal;

  auto run = launcher(args, {{"CHORUS_STDOUT_TERMINAL", "1"}});
  ASSERT_TRUE(run->wait_for(120s)) << run->output_text();
  EXPECT_EQ(run->exit_code(), 0) << run->output_text();
  const std::string out = run->stdout_text();
  EXPECT_FALSE(contains(out, "CHORUS_STDOUT_TERMINAL")) << out;
  EXPECT_TRUE(contains(out, "\nst 1\ndone\n")) << out;
  EXPECT_FALSE(contains(out, "\r")) << out;
}

// CHORUS_JOB_TOKEN set to "" counts as unset, for the launcher and its workers alike: a
// standalone job gets a fresh random token (64 hex digits), and a job with an rdzv id
// uses the id, so the workers still authenticate to the launchers' store.
TEST(Chorusrun, AnEmptyJobTokenCountsAsUnset) {
  auto standalone = launcher({"--standalone", "--nproc-per-node", "2", kScripted, "env-dump"},
                             {{"CHORUS_JOB_TOKEN", ""}});
  ASSERT_TRUE(standalone->wait_for(120s)) << standalone->output_text();
  EXPECT_EQ(standalone->exit_code(), 0) << standalone->output_text();
  const std::string out = standalone->stdout_text();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("CHORUS_JOB_TOKEN=([0-9a-f]*)\n"))) << out;
  EXPECT_EQ(m[1].length(), 64) << out;

  uint16_t port = test::pick_free_port();
  auto with_id = launcher({"--nproc-per-node", "2", "--master-port", std::to_string(port), "--rdzv-id",
                           "job-" + std::to_string(port), kWorker, "allreduce-loop", "2", "100"},
                          {{"CHORUS_JOB_TOKEN", ""}});
  ASSERT_TRUE(with_id->wait_for(120s)) << with_id->output_text();
  EXPECT_EQ(with_id->exit_code(), 0) << with_id->output_text();
  EXPECT_EQ(test::occurrences(with_id->stdout_text(), "ok"), 2u) << with_id->output_text();
}

TEST(Chorusrun, OneNodeTwoWorkers) {
  uint16_t port = test::pick_free_port();
  auto run = launcher({"--nproc-per-node", "2", "--master-port", std::to_string(port), "--tee",
                       "3", kWorker, "allreduce-loop", "5", "1000"});
  ASSERT_TRUE(run->wait_for(120s)) << run->output_text();
  EXPECT_EQ(run->exit_code(), 0) << run->output_text();
  std::string out = run->output_text();
  EXPECT_TRUE(contains(out, "[rank 0]: ok")) << out;
  EXPECT_TRUE(contains(out, "[rank 1]: ok")) << out;
}

TEST(Chorusrun, StandalonePicksAFreePort) {
  auto run = launcher({"--standalone", "--nproc_per_node=3", kWorker, "allreduce-loop", "3", "77"});
  ASSERT_TRUE(run->wait_for(120s)) << run->output_text();
  EXPECT_EQ(run->exit_code(), 0) << run->output_text();
  EXPECT_EQ(test::occurrences(run->stdout_text(), "ok"), 3u) << run->output_text();
}

// More workers than CPUs: by default each is bound to one CPU, in turn; --cpu-bind none
// leaves them the launcher's CPUs; share with one worker gives it all of them.
TEST(Chorusrun, WorkersThatOutnumberTheCpusAreBoundInTurn) {
  const std::vector<int> allowed = run::allowed_cpus();
  ASSERT_FALSE(allowed.empty());
  const int n = static_cast<int>(allowed.size()) + 1;
  struct Case {
    std::vector<std::string> bind;
    int nproc;
    std::function<std::string(int)> expected;
  };
  const Case cases[] = {
      {{}, n, [&](int r) { return std::to_string(allowed[r % allowed.size()]); }},
      {{"--cpu-bind", "none"}, n, [&](int) { return run::cpu_list(allowed); }},
      {{"--cpu-bind", "share"}, 1, [&](int) { return run::cpu_list(allowed); }},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"--standalone", "--nproc-per-node", std::to_string(c.nproc),
                                     "--tee", "1"};
    args.insert(args.end(), c.bind.begin(), c.bind.end());
    args.insert(args.end(), {kScripted, "cpus"});
    auto run = launcher(args);
    ASSERT_TRUE(run->wait_for(120s)) << run->output_text();
    ASSERT_EQ(run->exit_code(), 0) << run->output_text();
    const std::string out = run->stdout_text();
    for (int r = 0; r < c.nproc; ++r) {
      EXPECT_TRUE(contains(out, "[rank " + std::to_string(r) + "]: cpus " + c.expected(r) + "\n"))
          << "rank " << r << ", " << (c.bind.empty() ? "default" : c.bind[1]) << ":\n" << out;
    }
  }
}

TEST(Chorusrun, TwoNodesTwoWorkersEach) {
  uint16_t port = test::pick_free_port();
  auto start = Clock::now();
  auto n0 = launcher(node_args(0, port, 2, {}, {"allreduce-loop", "10", "100003"}));
  auto n1 = launcher(node_args(1, port, 2, {}, {"allreduce-loop", "10", "100003"}));
  ASSERT_TRUE(n0->wait_for_output("rank 3 of 4 connected", 60s) ||
              n1->wait_for_output("rank 3 of 4 connected", 60s))
      << n0->output_text() << n1->output_text();
  auto connected = Clock::now();
  ASSERT_TRUE(n0->wait_for(120s)) << n0->output_text();
  ASSERT_TRUE(n1->wait_for(120s)) << n1->output_text();
  EXPECT_EQ(n0->exit_code(), 0) << n0->output_text();
  EXPECT_EQ(n1->exit_code(), 0) << n1->output_text();
  EXPECT_EQ(test::occurrences(n0->stdout_text() + n1->stdout_text(), "ok"), 4u);
  // Ranks 0,1 on node 0 (127.0.0.2) and 2,3 on node 1.
  EXPECT_TRUE(contains(n0->stderr_text(), "rank 0 of 4 connected"));
  EXPECT_TRUE(contains(n1->stderr_text(), "rank 3 of 4 connected"));
  std::printf("[ timing ] chorusrun start to the last worker connected (2 nodes x 2): %lld ms\n",
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(connected - start).count()));
}

TEST(Chorusrun, KilledWorkerStopsBothNodes) {
  uint16_t port = test::pick_free_port();
  auto n0 = launcher(node_args(0, port, 2, {}, {"allreduce-loop", "0", "200000"}));
  auto n1 = launcher(node_args(1, port, 2, {}, {"allreduce-loop", "0", "200000"}));
  ASSERT_TRUE(n0->wait_for_output("started", 60s)) << n0->output_text();
  ASSERT_TRUE(n1->wait_for_output("started", 60s)) << n1->output_text();
  std::map<int, pid_t> pids = pids_by_rank(n0->stderr_text() + n1->stderr_text());
  ASSERT_EQ(pids.size(), 4u) << n0->output_text() << n1->output_text();
  std::vector<pid_t> all = worker_pids(n0->stderr_text() + n1->stderr_text());

  ASSERT_EQ(kill(pids[3], SIGKILL), 0);  // rank 3, on node 1
  auto killed = Clock::now();
  ASSERT_TRUE(n0->wait_for(10s)) << "node 0 still running 10 s after the kill\n" << n0->output_text();
  ASSERT_TRUE(n1->wait_for(10s)) << "node 1 still running 10 s after the kill\n" << n1->output_text();
  auto took = std::max(n0->exit_time(), n1->exit_time()) - killed;
  std::printf("[ timing ] SIGKILL of a worker to the exit of both launchers: %lld ms\n",
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()));
  for (Subprocess* n : {n0.get(), n1.get()}) {
    EXPECT_EQ(n->exit_code(), 128 + SIGKILL) << n->output_text();
    std::string err = n->stderr_text();
    EXPECT_TRUE(contains(err, "job failed: rank 3 (node 1")) << err;
    EXPECT_TRUE(contains(err, "SIGKILL")) << err;
    EXPECT_TRUE(contains(err, "pid " + std::to_string(pids[3]))) << err;
    EXPECT_TRUE(contains(err, "last output of rank 3")) << err;
  }
  EXPECT_TRUE(all_gone(all, 5s)) << "a worker outlived its launcher";
  // Each worker led its own process group: nothing of any group may be left.
  for (pid_t pgid : all) {
    EXPECT_TRUE(kill(-pgid, 0) == -1 && errno == ESRCH) << "process group " << pgid << " remains";
  }
}

TEST(Chorusrun, NodesThatNeverComeAreNamed) {
  uint16_t port = test::pick_free_port();
  auto n0 = launcher(node_args(0, port, 1, {}, {"allreduce-loop", "1", "1"}),
                     {{"CHORUS_CONNECT_TIMEOUT", "2"}});
  ASSERT_TRUE(n0->wait_for(30s)) << n0->output_text();
  EXPECT_EQ(n0->exit_code(), 1) << n0->output_text();
  EXPECT_TRUE(contains(n0->stderr_text(), "node(s) 1 of 2 never arrived")) << n0->output_text();
}

// Nodes with different numbers of workers: ranks in node order (node 1's after node
// 0's), WORLD_SIZE their sum, LOCAL_WORLD_SIZE each node's own. The simulated nodes
// have their own identity (CHORUS_NODE_ID), so the forced hierarchical allreduce meets
// nodes of 2 and 1 ranks, must fall back (Topology::uniform()), and still be right.
TEST(Chorusrun, DifferentWorkerCountsPerNodeAreLaidOutInNodeOrder) {
  uint16_t port = test::pick_free_port();
  auto n0 = launcher(node_args(0, port, 2, {}, {"elastic-round", "0"}),
                     {{"CHORUS_NODE_ID", "simnodeA"}, {"CHORUS_ALGO", "hier"}});
  auto n1 = launcher(node_args(1, port, 1, {}, {"elastic-round", "0"}),
                     {{"CHORUS_NODE_ID", "simnodeB"}, {"CHORUS_ALGO", "hier"}});
  ASSERT_TRUE(n0->wait_for(60s)) << n0->output_text();
  ASSERT_TRUE(n1->wait_for(60s)) << n1->output_text();
  EXPECT_EQ(n0->exit_code(), 0) << n0->output_text() << n1->output_text();
  EXPECT_EQ(n1->exit_code(), 0) << n0->output_text() << n1->output_text();
  const std::string out0 = n0->stdout_text(), out1 = n1->stdout_text();
  EXPECT_TRUE(contains(out0, "rank 0 world 3 local 0/2 group 0/2 restart 0")) << out0;
  EXPECT_TRUE(contains(out0, "rank 1 world 3 local 1/2 group 0/2 restart 0")) << out0;
  EXPECT_TRUE(contains(out1, "rank 2 world 3 local 0/1 group 1/2 restart 0")) << out1;
  EXPECT_EQ(test::occurrences(out0, "allreduced"), 2u) << out0;
  EXPECT_EQ(test::occurrences(out1, "allreduced"), 1u) << out1;
}

TEST(Chorusrun, KilledLauncherTakesItsWorkersAlong) {
  uint16_t port = test::pick_free_port();
  auto run = launcher({"--nproc-per-node", "2", "--master-port", std::to_string(port), kWorker,
                       "allreduce-loop", "0", "1000"});
  ASSERT_TRUE(run->wait_for_output("started", 60s)) << run->output_text();
  std::vector<pid_t> pids = worker_pids(run->stderr_text());
  ASSERT_EQ(pids.size(), 2u) << run->output_text();
  ASSERT_EQ(kill(run->pid(), SIGKILL), 0);
  EXPECT_TRUE(all_gone(pids, 3s)) << "a worker outlived a SIGKILLed launcher";
}

TEST(Chorusrun, SecondSigintKillsAtOnce) {
  uint16_t port = test::pick_free_port();
  auto run = launcher({"--nproc-per-node", "2", "--master-port", std::to_string(port),
                       "--grace-period", "60", kScripted, "ignore-int", "ignore-term", "out",
                       "ready", "sleep", "120"});
  ASSERT_TRUE(run->wait_for_output("ready", 60s)) << run->output_text();
  ASSERT_TRUE(run->wait_for_output("ready\nready", 1s) || true);
  std::this_thread::sleep_for(200ms);  // both workers past their ignore steps
  ASSERT_EQ(kill(run->pid(), SIGINT), 0);
  // The workers ignore the forwarded SIGINT: the launcher waits out its grace period...
  EXPECT_FALSE(run->wait_for(1s)) << run->output_text();
  // ...until a second SIGINT, which kills them at once.
  ASSERT_EQ(kill(run->pid(), SIGINT), 0);
  ASSERT_TRUE(run->wait_for(5s)) << run->output_text();
  EXPECT_EQ(run->exit_code(), 128 + SIGINT) << run->output_text();
  EXPECT_TRUE(contains(run->stderr_text(), "received SIGINT")) << run->output_text();
}

TEST(Chorusrun, LogDirHoldsEveryRanksOutput) {
  uint16_t port = test::pick_free_port();
  std::string dir = testing::TempDir() + "chorusrun_logs_" + std::to_string(port);
  auto run = launcher({"--nproc-per-node", "2", "--master-port", std::to_string(port),
                       "--log-dir", dir, "--redirects", "1", kWorker, "allreduce-loop", "2", "10"});
  ASSERT_TRUE(run->wait_for(60s)) << run->output_text();
  EXPECT_EQ(run->exit_code(), 0) << run->output_text();
  EXPECT_FALSE(contains(run->stdout_text(), "ok")) << "stdout was redirected to the logs";
  for (int r = 0; r < 2; ++r) {
    std::ifstream out(dir + "/rank_" + std::to_string(r) + ".stdout.log");
    std::ifstream err(dir + "/rank_" + std::to_string(r) + ".stderr.log");
    std::string o((std::istreambuf_iterator<char>(out)), {}), e((std::istreambuf_iterator<char>(err)), {});
    EXPECT_TRUE(contains(o, "ok")) << "rank " << r << ": " << o;
    EXPECT_TRUE(contains(e, "rank " + std::to_string(r) + " of 2 connected")) << e;
  }
}

TEST(Chorusrun, RestartAfterAFailureKeepsRanks) {
  uint16_t port = test::pick_free_port();
  std::map<std::string, std::string> env = {{"CHORUS_TEST_FAIL_RANK", "1"}};
  auto n0 = launcher(node_args(0, port, 2, {"--max-restarts", "2"}, {"allreduce-loop", "3", "1000"}), env);
  auto n1 = launcher(node_args(1, port, 2, {"--max-restarts", "2"}, {"allreduce-loop", "3", "1000"}), env);
  ASSERT_TRUE(n0->wait_for(120s)) << n0->output_text();
  ASSERT_TRUE(n1->wait_for(120s)) << n1->output_text();
  EXPECT_EQ(n0->exit_code(), 0) << n0->output_text();
  EXPECT_EQ(n1->exit_code(), 0) << n1->output_text();
  std::string all = n0->output_text() + n1->output_text();
  // Every rank connected once with restart count 0 and once with 1, on the same node.
  for (int r = 0; r < 4; ++r) {
    std::string prefix = "rank " + std::to_string(r) + " of 4 connected (pid ";
    const std::string& mine = r < 2 ? n0->stderr_text() : n1->stderr_text();
    EXPECT_EQ(test::occurrences(mine, prefix), 2u) << all;
  }
  EXPECT_TRUE(contains(all, "restart count 0")) << all;
  EXPECT_TRUE(contains(all, "restart count 1")) << all;
  EXPECT_FALSE(contains(all, "restart count 2")) << all;
  EXPECT_EQ(test::occurrences(n0->stdout_text() + n1->stdout_text(), "ok"), 4u) << all;
  EXPECT_TRUE(contains(all, "restarting all nodes (1 of 2 restarts)")) << all;
}

TEST(Chorusrun, SigtermToALauncherStopsItsWorkers) {
  uint16_t port = test::pick_free_port();
  auto run = launcher({"--nproc-per-node", "2", "--master-port", std::to_string(port),
                       "--grace-period", "3", kWorker, "allreduce-loop", "0", "1000"});
  ASSERT_TRUE(run->wait_for_output("started", 60s)) << run->output_text();
  std::vector<pid_t> pids = worker_pids(run->stderr_text());
  ASSERT_EQ(pids.size(), 2u) << run->output_text();
  ASSERT_EQ(kill(run->pid(), SIGTERM), 0);
  EXPECT_TRUE(all_gone(pids, 3500ms)) << "workers outlived the grace period\n" << run->output_text();
  ASSERT_TRUE(run->wait_for(10s)) << run->output_text();
  EXPECT_EQ(run->exit_code(), 128 + SIGTERM) << run->output_text();
  EXPECT_TRUE(contains(run->stderr_text(), "received SIGTERM")) << run->output_text();
}

TEST(Chorusrun, PortInUseIsNamed) {
  net::Fd taken = net::listen_on("127.0.0.1", 0);
  uint16_t port = net::local_address(taken.get()).port();
  auto run = launcher({"--nproc-per-node", "1", "--master-port", std::to_string(port), kWorker,
                       "allreduce-loop", "1", "1"});
  ASSERT_TRUE(run->wait_for(30s)) << run->output_text();
  EXPECT_NE(run->exit_code(), 0);
  std::string err = run->stderr_text();
  EXPECT_TRUE(contains(err, "address already in use")) << err;
  EXPECT_TRUE(contains(err, "127.0.0.1:" + std::to_string(port))) << err;
}

TEST(Chorusrun, BadOptionsExitTwoNamingTheOption) {
  struct Case {
    std::vector<std::string> args;
    std::string names;
  };
  for (const Case& c : std::vector<Case>{{{"--nproc-per-node", "0", kWorker}, "--nproc-per-node"},
                                         {{"--nnodes", "2", "--node-rank", "2", kWorker}, "--node-rank"},
                                         {{"--master-port", "70000", kWorker}, "--master-port"},
                                         {{"--nproc-per-node", "2"}, "program"}}) {
    auto run = launcher(c.args);
    ASSERT_TRUE(run->wait_for(10s));
    EXPECT_EQ(run->exit_code(), 2) << run->output_text();
    EXPECT_TRUE(contains(run->stderr_text(), c.names)) << run->stderr_text();
  }
}

}  // namespace
}  // namespace chorus
