// Elastic jobs (--nnodes MIN:MAX; run/elastic.h) on simulated nodes: launchers on
// loopback addresses (127.0.0.2, .3, .4), node 0's hosting the store. Workers are
// chorus_test_worker elastic-round: each prints its place (rank, WORLD_SIZE, local and
// group ranks, CHORUS_RESTART_COUNT), allreduces across the round's world, and waits
// for the round to end unless it is the last one expected.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <map>
#include <memory>
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

// The launchers of one job; start(k) starts node k's.
struct Job {
  explicit Job(std::string nnodes, std::vector<std::string> extra = {})
      : nnodes(std::move(nnodes)), extra(std::move(extra)), port(test::pick_free_port()) {}
  ~Job() {
    for (auto& n : nodes) {
      if (!n || n->exited()) continue;
      kill(n->pid(), SIGKILL);  // its workers follow (PR_SET_PDEATHSIG)
      n->wait_for(10s);
    }
  }

  Subprocess& start(int k, int nproc, const std::string& until_round,
                    const std::map<std::string, std::string>& env = {}) {
    return start_program(k, nproc, {test::test_worker_path(), "elastic-round", until_round}, env);
  }

  Subprocess& start_program(int k, int nproc, const std::vector<std::string>& program,
                            const std::map<std::string, std::string>& env = {}) {
    std::vector<std::string> args = {
        "--nnodes", nnodes, "--node-rank", std::to_string(k), "--nproc-per-node",
        std::to_string(nproc), "--master-addr", "127.0.0.2", "--master-port", std::to_string(port),
        "--local-addr", "127.0.0." + std::to_string(2 + k), "--rdzv-id",
        "elastic-" + std::to_string(port)};
    args.insert(args.end(), extra.begin(), extra.end());
    args.insert(args.end(), program.begin(), program.end());
    if (nodes.size() <= static_cast<size_t>(k)) nodes.resize(k + 1);
    nodes[k] = test::start_chorusrun(args, env);
    return *nodes[k];
  }

  // Waits until node k's stdout holds `text` `times` times (false after 60 s or when
  // the launcher ended first).
  bool says(int k, const std::string& text, size_t times = 1) {
    const auto deadline = Clock::now() + 60s;
    while (test::occurrences(nodes[k]->stdout_text(), text) < times) {
      if (nodes[k]->exited() || Clock::now() > deadline) return false;
      nodes[k]->wait_for(10ms);
    }
    return true;
  }

  // Waits (60 s at most) for node k's launcher to exit; true when it did, with `code`.
  bool ends(int k, int code) {
    return nodes[k]->wait_for(60s) && nodes[k]->exit_code() == code;
  }

  std::string all_output() const { return chorus::test::launchers_output(nodes); }

  std::string nnodes;
  std::vector<std::string> extra;
  uint16_t port;
  std::vector<std::unique_ptr<Subprocess>> nodes;
};

std::string place(int rank, int world, int local, int nproc, int group, int groups, int restart) {
  return "rank " + std::to_string(rank) + " world " + std::to_string(world) + " local " +
         std::to_string(local) + "/" + std::to_string(nproc) + " group " + std::to_string(group) +
         "/" + std::to_string(groups) + " restart " + std::to_string(restart);
}

// The case: three nodes, one's launcher SIGKILLed while the workers run. The
// round ends on every node; the two left start round 1 without it, with world size 4,
// and the job succeeds. The victim is the node that joined last (node rank 2), so the
// survivors keep node ranks 0 and 1. The last call is long so that round 0 waits for
// all three (it starts as soon as MAX have joined). Logs the time from the kill to the
// survivors' round-1 workers having started.
TEST(Elastic, LostNodeLeavesASmallerJobThatFinishes) {
  Job job("2:3", {"--max-restarts", "1", "--rdzv-conf", "last_call_timeout=60"});
  for (int k : {0, 1, 2}) job.start(k, 2, "1");
  for (int k : {0, 1, 2}) ASSERT_TRUE(job.says(k, "allreduced", 2)) << job.all_output();
  int victim = -1;
  for (int k : {1, 2}) {
    if (contains(job.nodes[k]->stdout_text(), "world 6 local 0/2 group 2/3 restart 0")) victim = k;
  }
  ASSERT_NE(victim, -1) << job.all_output();
  const int survivor = 3 - victim;  // the other launcher started as --node-rank 1 or 2
  ASSERT_EQ(kill(job.nodes[victim]->pid(), SIGKILL), 0);
  const auto killed = Clock::now();
  ASSERT_TRUE(job.says(0, "restart 1", 2) && job.says(survivor, "restart 1", 2)) << job.all_output();
  const auto restarted = Clock::now();
  int group = 0;
  for (int k : {0, survivor}) {
    ASSERT_TRUE(job.ends(k, 0)) << job.all_output();
    const std::string out = job.nodes[k]->stdout_text();
    for (int l : {0, 1}) EXPECT_TRUE(contains(out, place(2 * group + l, 4, l, 2, group, 2, 1))) << out;
    EXPECT_EQ(test::occurrences(out, "allreduced"), 4u) << out;  // two rounds, two workers
    const std::string err = job.nodes[k]->stderr_text();
    EXPECT_TRUE(contains(err, "round 1: 2 node(s)")) << err;
    EXPECT_TRUE(contains(err, "the launcher of node 2 (host " + net::hostname() + ") was lost"))
        << err;
    ++group;
  }
  std::printf("[ timing ] SIGKILL of node 2's launcher to both survivors' round-1 workers "
              "started: %lld ms\n",
              static_cast<long long>(
                  std::chrono::duration_cast<std::chrono::milliseconds>(restarted - killed).count()));
}

// Two nodes run (MIN 2, no last call); a third arrives. The running round ends (its
// workers get SIGTERM), round 1 admits the newcomer as node 2, and all finish on 3.
TEST(Elastic, NodeJoiningARunningJobIsAdmittedAtTheNextRound) {
  Job job("2:3", {"--rdzv-conf", "last_call_timeout=0"});
  job.start(0, 2, "1");
  job.start(1, 2, "1");
  ASSERT_TRUE(job.says(0, "allreduced", 2) && job.says(1, "allreduced", 2)) << job.all_output();
  EXPECT_TRUE(contains(job.nodes[0]->stdout_text(), place(0, 4, 0, 2, 0, 2, 0))) << job.all_output();
  job.start(2, 1, "1");
  const auto started = Clock::now();
  ASSERT_TRUE(job.says(0, "restart 1", 2) && job.says(1, "restart 1", 2) && job.says(2, "restart 1"))
      << job.all_output();
  std::printf("[ timing ] start of node 2's launcher to every round-1 worker started: %lld ms\n",
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                         Clock::now() - started).count()));
  for (int k : {0, 1, 2}) {
    ASSERT_TRUE(job.ends(k, 0)) << job.all_output();
  }
  EXPECT_TRUE(contains(job.nodes[0]->stdout_text(), place(1, 5, 1, 2, 0, 3, 1))) << job.all_output();
  EXPECT_TRUE(contains(job.nodes[1]->stdout_text(), place(3, 5, 1, 2, 1, 3, 1))) << job.all_output();
  EXPECT_TRUE(contains(job.nodes[2]->stdout_text(), place(4, 5, 0, 1, 2, 3, 1))) << job.all_output();
  EXPECT_EQ(test::occurrences(job.nodes[2]->stdout_text(), "allreduced"), 1u) << job.all_output();
  EXPECT_TRUE(contains(job.nodes[0]->stderr_text(), "the round before ended: a node joined"))
      << job.all_output();
}

// An elastic job of nodes with 1 and 2 workers, nodes of their own identity, the
// hierarchical allreduce forced: it falls back on the non-uniform nodes and is right.
TEST(Elastic, NodesWithOneAndTwoWorkers) {
  Job job("1:2", {"--rdzv-conf", "last_call_timeout=60"});
  job.start(0, 1, "0", {{"CHORUS_NODE_ID", "simA"}, {"CHORUS_ALGO", "hier"}});
  job.start(1, 2, "0", {{"CHORUS_NODE_ID", "simB"}, {"CHORUS_ALGO", "hier"}});
  for (int k : {0, 1}) {
    ASSERT_TRUE(job.ends(k, 0)) << job.all_output();
  }
  EXPECT_TRUE(contains(job.nodes[0]->stdout_text(), place(0, 3, 0, 1, 0, 2, 0))) << job.all_output();
  EXPECT_TRUE(contains(job.nodes[1]->stdout_text(), place(1, 3, 0, 2, 1, 2, 0))) << job.all_output();
  EXPECT_TRUE(contains(job.nodes[1]->stdout_text(), place(2, 3, 1, 2, 1, 2, 0))) << job.all_output();
  EXPECT_EQ(test::occurrences(job.nodes[1]->stdout_text(), "allreduced"), 2u) << job.all_output();
}

// MIN not reached within the join timeout: every node that came fails, naming them.
TEST(Elastic, TooFewNodesWithinTheJoinTimeoutAreNamed) {
  Job job("3:4", {"--rdzv-join-timeout", "1"});
  job.start(0, 1, "0");
  job.start(1, 1, "0");
  const std::string host = net::hostname();
  for (int k : {0, 1}) {
    ASSERT_TRUE(job.ends(k, 1)) << job.all_output();
    const std::string err = job.nodes[k]->stderr_text();
    EXPECT_TRUE(contains(err, "job failed: only 2 of at least 3 nodes (--nnodes 3:4) joined within "
                              "the join timeout of 1 s")) << err;
    EXPECT_TRUE(contains(err, "node 0 (host " + host + ", address 127.0.0.2), node 1 (host " +
                              host + ", address 127.0.0.3)")) << err;
    EXPECT_FALSE(contains(job.nodes[k]->stdout_text(), "rank")) << "a worker started\n" << err;
  }
}

// The node that joined last (node rank 2 of 3) in a full job.
int last_joined(Job& job) {
  for (int k = 1; k < static_cast<int>(job.nodes.size()); ++k) {
    if (job.nodes[k] && contains(job.nodes[k]->stdout_text(), "group 2/3 restart 0")) return k;
  }
  return -1;
}

// A launcher told to stop (SIGTERM) leaves: it ends with 128 + 15, and the others go
// on without it in a round of two.
TEST(Elastic, StoppedLauncherLeavesAndTheRestGoOn) {
  Job job("2:3", {"--max-restarts", "1", "--rdzv-conf", "last_call_timeout=60"});
  for (int k : {0, 1, 2}) job.start(k, 1, "1");
  for (int k : {0, 1, 2}) ASSERT_TRUE(job.says(k, "allreduced")) << job.all_output();
  const int victim = last_joined(job);
  ASSERT_NE(victim, -1) << job.all_output();
  ASSERT_EQ(kill(job.nodes[victim]->pid(), SIGTERM), 0);
  ASSERT_TRUE(job.ends(victim, 128 + SIGTERM)) << job.all_output();
  ASSERT_TRUE(job.ends(0, 0)) << job.all_output();
  ASSERT_TRUE(job.ends(3 - victim, 0)) << job.all_output();
  EXPECT_TRUE(contains(job.nodes[0]->stdout_text(), place(0, 2, 0, 1, 0, 2, 1))) << job.all_output();
  EXPECT_TRUE(contains(job.nodes[3 - victim]->stdout_text(), place(1, 2, 0, 1, 1, 2, 1)))
      << job.all_output();
  EXPECT_TRUE(contains(job.nodes[0]->stderr_text(), "the launcher of node 2 received SIGTERM"))
      << job.all_output();
}

// A full job (MAX nodes) loses one; a launcher that arrives afterwards is admitted into
// the room left, skipping the rounds it missed, and the job finishes on three again.
TEST(Elastic, LateLauncherTakesThePlaceOfALostOne) {
  Job job("2:3", {"--max-restarts", "1", "--rdzv-conf", "last_call_timeout=60"});
  for (int k : {0, 1, 2}) job.start(k, 1, "2");
  for (int k : {0, 1, 2}) ASSERT_TRUE(job.says(k, "allreduced")) << job.all_output();
  const int victim = last_joined(job);
  ASSERT_NE(victim, -1) << job.all_output();
  ASSERT_EQ(kill(job.nodes[victim]->pid(), SIGKILL), 0);
  ASSERT_TRUE(job.says(0, "restart 1")) << job.all_output();
  job.start(3, 1, "2");
  for (int k : {0, 3 - victim, 3}) ASSERT_TRUE(job.ends(k, 0)) << job.all_output();
  EXPECT_TRUE(contains(job.nodes[0]->stdout_text(), place(0, 2, 0, 1, 0, 2, 1))) << job.all_output();
  EXPECT_TRUE(contains(job.nodes[3]->stdout_text(), place(2, 3, 0, 1, 2, 3, 2))) << job.all_output();
  EXPECT_EQ(test::occurrences(job.nodes[3]->stdout_text(), "allreduced"), 1u) << job.all_output();
}

// A stopped launcher keeps its connection (and its alive key): its missing heartbeats
// give it away, and the next round must leave it out all the same.
TEST(Elastic, StoppedHostIsLeftOut) {
  Job job("2:3", {"--max-restarts", "1", "--rdzv-conf", "last_call_timeout=60"});
  for (int k : {0, 1, 2}) job.start(k, 1, "1", {{"CHORUS_HEARTBEAT_TIMEOUT", "1"}});
  for (int k : {0, 1, 2}) ASSERT_TRUE(job.says(k, "allreduced")) << job.all_output();
  const int victim = last_joined(job);
  ASSERT_NE(victim, -1) << job.all_output();
  ASSERT_EQ(kill(job.nodes[victim]->pid(), SIGSTOP), 0);
  ASSERT_TRUE(job.ends(0, 0)) << job.all_output();
  ASSERT_TRUE(job.ends(3 - victim, 0)) << job.all_output();
  EXPECT_TRUE(contains(job.nodes[0]->stdout_text(), place(0, 2, 0, 1, 0, 2, 1))) << job.all_output();
  EXPECT_TRUE(contains(job.nodes[0]->stderr_text(), "it sent no heartbeat")) << job.all_output();
  kill(job.nodes[victim]->pid(), SIGKILL);
}

// A worker that fails ends the round; every node restarts while restarts remain, then
// the job fails with that worker's exit code on every node.
TEST(Elastic, WorkerFailuresUseUpTheRestarts) {
  Job job("1:2", {"--max-restarts", "1", "--rdzv-conf", "last_call_timeout=60"});
  const std::vector<std::string> failing = {test::scripted_worker_path(), "out", "started",
                                            "exit", "3"};
  job.start_program(0, 1, failing);
  job.start_program(1, 1, failing);
  for (int k : {0, 1}) {
    ASSERT_TRUE(job.ends(k, 3)) << job.all_output();
    const std::string err = job.nodes[k]->stderr_text();
    EXPECT_TRUE(contains(err, "round 1: 2 node(s)")) << err;
    EXPECT_FALSE(contains(err, "round 2")) << err;
    EXPECT_TRUE(contains(err, "job failed: rank ")) << err;
    EXPECT_EQ(test::occurrences(job.nodes[k]->stdout_text(), "started"), 2u) << job.all_output();
  }
}

// --join-at-checkpoint with workers that never stop at a checkpoint (these never look):
// at its deadline the round ends as without it, and round 1 admits the newcomer.
TEST(Elastic, JoinAtCheckpointEndsTheRoundAtItsDeadline) {
  Job job("2:3", {"--rdzv-conf", "last_call_timeout=0", "--join-at-checkpoint", "0.5"});
  job.start(0, 1, "1");
  job.start(1, 1, "1");
  ASSERT_TRUE(job.says(0, "allreduced") && job.says(1, "allreduced")) << job.all_output();
  job.start(2, 1, "1");
  for (int k : {0, 1, 2}) {
    ASSERT_TRUE(job.ends(k, 0)) << job.all_output();
  }
  const std::string err = job.nodes[0]->stderr_text();
  EXPECT_TRUE(contains(err, "the workers stop at their next checkpoint (--join-at-checkpoint 0.5)")) << err;
  EXPECT_TRUE(contains(err, "the round before ended: a node joined (host " + net::hostname() +
                                "); the workers reached no checkpoint within 0.5 s "
                                "(--join-at-checkpoint) and were stopped"))
      << err;
  EXPECT_TRUE(contains(job.nodes[2]->stdout_text(), place(2, 3, 0, 1, 2, 3, 1))) << job.all_output();
}

// The status of workers stopped at a checkpoint (75, chorus/elastic.h) means so only in
// a round whose workers were asked to stop; otherwise it is a failure like any other.
TEST(Elastic, StoppedAtCheckpointStatusUnaskedIsAFailure) {
  Job job("1:2", {"--rdzv-conf", "last_call_timeout=0", "--join-at-checkpoint", "30"});
  job.start_program(0, 1, {test::scripted_worker_path(), "exit", "75"});
  ASSERT_TRUE(job.ends(0, 75)) << job.all_output();
  EXPECT_TRUE(contains(job.nodes[0]->stderr_text(), "ended with exit code 75")) << job.all_output();
}

// Node 0 hosts the store: its loss ends the job on every other node, elastic or not.
TEST(Elastic, LostStoreHostEndsTheJob) {
  Job job("2:3", {"--max-restarts", "3", "--rdzv-conf", "last_call_timeout=60"});
  for (int k : {0, 1, 2}) job.start(k, 1, "1");
  for (int k : {0, 1, 2}) ASSERT_TRUE(job.says(k, "allreduced")) << job.all_output();
  ASSERT_EQ(kill(job.nodes[0]->pid(), SIGKILL), 0);
  for (int k : {1, 2}) {
    ASSERT_TRUE(job.ends(k, 1)) << job.all_output();
    EXPECT_TRUE(contains(job.nodes[k]->stderr_text(), "job failed: the launcher of node 0"))
        << job.all_output();
    EXPECT_FALSE(contains(job.nodes[k]->stdout_text(), "restart 1")) << job.all_output();
  }
}

}  // namespace
}  // namespace chorus
