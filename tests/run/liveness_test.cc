// chorusrun's launchers keep each other alive (run/liveness.h): simulated nodes on
// loopback addresses (127.0.0.2, .3, .4), one node's launcher SIGKILLed or stopped; the
// others must end, naming that node and its host rather than one of their own workers,
// and leave the flight recorder's traces in files with one line each on the console.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "comm/common/socket.h"
#include "util/checks.h"
#include "util/chorusrun.h"
#include "util/ranks.h"

namespace chorus {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using test::Subprocess;
using test::contains;

// Workers that print their pid, say they are ready, and sleep: they never talk to the
// workers of other nodes, so only the launchers can notice that a node is gone.
const std::vector<std::string> kSleepers = {test::scripted_worker_path(), "pid", "out", "ready",
                                            "sleep", "120"};
// Workers in an endless allreduce across the nodes.
const std::vector<std::string> kAllreduce = {test::test_worker_path(), "allreduce-loop", "0",
                                             "100000"};

// `nnodes` simulated nodes with two workers each; node k's launcher and workers on
// 127.0.0.(2 + k), node 0's hosting the store.
struct Job {
  Job(int nnodes, const std::vector<std::string>& program,
      const std::map<std::string, std::string>& env = {},
      const std::vector<std::string>& extra = {}) {
    const uint16_t port = test::pick_free_port();
    for (int k = 0; k < nnodes; ++k) {
      std::vector<std::string> args = {
          "--nnodes", std::to_string(nnodes), "--node-rank", std::to_string(k),
          "--nproc-per-node", "2", "--master-addr", "127.0.0.2", "--master-port",
          std::to_string(port), "--local-addr", "127.0.0." + std::to_string(2 + k),
          "--rdzv-id", "liveness-" + std::to_string(port)};
      args.insert(args.end(), extra.begin(), extra.end());
      args.insert(args.end(), program.begin(), program.end());
      nodes.push_back(test::start_chorusrun(args, env));
    }
  }
  ~Job() {
    for (auto& n : nodes) {
      if (n->exited()) continue;
      kill(n->pid(), SIGKILL);  // its workers follow (PR_SET_PDEATHSIG)
      n->wait_for(10s);
    }
  }

  // Waits until every node's stdout has shown `marker` twice (both workers).
  bool all_say(const std::string& marker) {
    const auto deadline = Clock::now() + 60s;
    for (auto& n : nodes) {
      while (test::occurrences(n->stdout_text(), marker) < 2) {
        if (n->exited() || Clock::now() > deadline) return false;
        n->wait_for(20ms);
      }
    }
    return true;
  }

  std::string all_output() const { return chorus::test::launchers_output(nodes); }

  std::vector<std::unique_ptr<Subprocess>> nodes;
};

std::vector<pid_t> scripted_pids(const std::string& stdout_text) {
  std::vector<pid_t> pids;
  std::regex re("pid ([0-9]+)\n");
  for (auto it = std::sregex_iterator(stdout_text.begin(), stdout_text.end(), re);
       it != std::sregex_iterator(); ++it) {
    pids.push_back(static_cast<pid_t>(std::stoi((*it)[1])));
  }
  return pids;
}

std::string names_lost(int node) {
  return "the launcher of node " + std::to_string(node) + " (host " + net::hostname() +
         ") was lost";
}

// The launchers left standing after `victim`'s was SIGKILLed must end (a generous
// deadline, so that a launcher that goes on fails the test instead of hanging it), with
// code 1, naming the victim, not one of their own workers. Logs how long the slowest took.
void expect_survivors_name(Job& job, int victim, Clock::time_point killed) {
  Clock::time_point last = killed;
  for (size_t k = 0; k < job.nodes.size(); ++k) {
    if (static_cast<int>(k) == victim) continue;
    Subprocess& n = *job.nodes[k];
    ASSERT_TRUE(n.wait_for(30s)) << "node " << k << " still running 30 s after node " << victim
                                 << "'s launcher was killed\n" << job.all_output();
    last = std::max(last, n.exit_time());
    EXPECT_EQ(n.exit_code(), 1) << job.all_output();
    const std::string err = n.stderr_text();
    EXPECT_TRUE(contains(err, "job failed: " + names_lost(victim))) << job.all_output();
    EXPECT_FALSE(contains(err, "job failed: rank")) << "node " << k << " blamed a worker\n" << err;
  }
  std::printf("[ timing ] SIGKILL of node %d's launcher to the exit of the last other: %lld ms\n",
              victim, static_cast<long long>(
                          std::chrono::duration_cast<std::chrono::milliseconds>(last - killed).count()));
}

// The case: workers that sleep, node 1's launcher SIGKILLed. Node 0 used to
// run on until its workers ended. Restarts left do not matter: a lost node cannot come
// back into the job.
TEST(Liveness, KilledLauncherOfASleepingNodeIsNamed) {
  for (int victim : {1, 0}) {
    SCOPED_TRACE("victim node " + std::to_string(victim));
    Job job(2, kSleepers, {}, {"--max-restarts", "2"});
    ASSERT_TRUE(job.all_say("ready")) << job.all_output();
    const int survivor = 1 - victim;
    const std::vector<pid_t> survivors = scripted_pids(job.nodes[survivor]->stdout_text());
    ASSERT_EQ(survivors.size(), 2u) << job.all_output();
    ASSERT_EQ(kill(job.nodes[victim]->pid(), SIGKILL), 0);
    expect_survivors_name(job, victim, Clock::now());
    EXPECT_TRUE(test::all_gone(survivors, 10s)) << "a worker outlived its launcher";
    EXPECT_FALSE(contains(job.nodes[survivor]->stderr_text(), "restarting")) << job.all_output();
  }
}

// Three nodes: nodes 0 and 2 both name node 1. With workers in an allreduce, node 2's
// workers fail as soon as node 1's die; node 2 must still find the launcher's loss
// rather than report its own worker.
TEST(Liveness, EveryOtherNodeNamesTheLostOne) {
  for (bool collective : {false, true}) {
    SCOPED_TRACE(collective ? "workers in an allreduce" : "sleeping workers");
    Job job(3, collective ? kAllreduce : kSleepers);
    ASSERT_TRUE(job.all_say(collective ? "started" : "ready")) << job.all_output();
    ASSERT_EQ(kill(job.nodes[1]->pid(), SIGKILL), 0);
    expect_survivors_name(job, 1, Clock::now());
  }
}

// Workers in a collective: node 1's workers die with their launcher, node 0's fail in
// the allreduce or are stopped by their launcher. The cause is still node 1's launcher. The workers' flight recorders
// write their traces to files in the default directory ($TMPDIR/chorus-traces-<uid>
// here) and put one line each on the console, naming the file.
TEST(Liveness, KilledLauncherDuringACollectiveIsTheCause) {
  const std::string tmp = testing::TempDir() + "liveness_tmp_" + std::to_string(getpid());
  std::filesystem::remove_all(tmp);
  std::filesystem::create_directories(tmp);
  Job job(2, kAllreduce, {{"TMPDIR", tmp}});
  ASSERT_TRUE(job.all_say("started")) << job.all_output();
  ASSERT_EQ(kill(job.nodes[1]->pid(), SIGKILL), 0);
  expect_survivors_name(job, 1, Clock::now());

  const std::string err = job.nodes[0]->stderr_text();
  const std::string dir = tmp + "/chorus-traces-" + std::to_string(getuid()) + "/";
  std::regex line_re("flight recorder of rank ([01]): [^\n]*; full trace in ([^\n]*)\n");
  int traces = 0;
  for (auto it = std::sregex_iterator(err.begin(), err.end(), line_re);
       it != std::sregex_iterator(); ++it, ++traces) {
    const std::string path = (*it)[2];
    EXPECT_EQ(path, dir + "chorus_trace_world_rank" + std::string((*it)[1]) + ".json") << err;
    std::ifstream in(path);
    std::string text((std::istreambuf_iterator<char>(in)), {});
    EXPECT_TRUE(contains(text, "\"operations\":[")) << path << ":\n" << text;
  }
  // Each of node 0's workers leaves its trace, whether its allreduce fails first or its
  // launcher's SIGTERM comes first (comm/communicator/stop_traces.h): under load the
  // SIGTERM often wins.
  EXPECT_EQ(traces, 2) << err;
  // The console: a few lines per worker, no trace.
  EXPECT_FALSE(contains(err, "\"operations\"")) << err;
  EXPECT_LT(test::occurrences(err, "\n"), 20u) << err;
  std::filesystem::remove_all(tmp);
}

// A launcher that is stopped keeps its connection: the missing heartbeats give it away,
// after CHORUS_HEARTBEAT_TIMEOUT. Node 0 stopped: its store does not answer.
TEST(Liveness, StoppedLauncherMissesItsHeartbeats) {
  for (int victim : {1, 0}) {
    SCOPED_TRACE("victim node " + std::to_string(victim));
    Job job(2, kSleepers, {{"CHORUS_HEARTBEAT_TIMEOUT", "1"}});
    ASSERT_TRUE(job.all_say("ready")) << job.all_output();
    ASSERT_EQ(kill(job.nodes[victim]->pid(), SIGSTOP), 0);
    const auto stopped = Clock::now();
    Subprocess& survivor = *job.nodes[1 - victim];
    ASSERT_TRUE(survivor.wait_for(30s)) << job.all_output();
    std::printf("[ timing ] SIGSTOP of node %d's launcher to the other's exit: %lld ms\n", victim,
                static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                           survivor.exit_time() - stopped).count()));
    EXPECT_EQ(survivor.exit_code(), 1) << job.all_output();
    const std::string err = survivor.stderr_text();
    EXPECT_TRUE(contains(err, "job failed: " + names_lost(victim))) << job.all_output();
    EXPECT_TRUE(contains(err, victim == 1 ? "it sent no heartbeat for" : "did not answer within"))
        << err;
    EXPECT_TRUE(contains(err, "CHORUS_HEARTBEAT_TIMEOUT")) << err;
    kill(job.nodes[victim]->pid(), SIGKILL);
  }
}

TEST(Liveness, ABadHeartbeatTimeoutIsNamed) {
  for (const char* value : {"0.1", "soon", ""}) {
    auto run = test::start_chorusrun({"--standalone", "--nproc-per-node", "1", test::scripted_worker_path(), "out", "hi"},
                                     {{"CHORUS_HEARTBEAT_TIMEOUT", value}});
    ASSERT_TRUE(run->wait_for(30s)) << run->output_text();
    EXPECT_EQ(run->exit_code(), 1) << value << ": " << run->output_text();
    EXPECT_TRUE(contains(run->stderr_text(), "CHORUS_HEARTBEAT_TIMEOUT")) << run->output_text();
    EXPECT_FALSE(contains(run->stdout_text(), "hi")) << run->output_text();
  }
}

}  // namespace
}  // namespace chorus
