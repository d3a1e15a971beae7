// Real processes over the TCP store on loopback: the `env://` start-up
// (MASTER_ADDR=127.0.0.1, a free MASTER_PORT, RANK, WORLD_SIZE; rank 0 hosts the store)
// and failure detection when a rank is killed or stopped. Ranks of one machine meet in
// shared memory (ctest also runs the suite with CHORUS_TRANSPORT=tcp).
//
// The worker is build/bin/chorus_test_worker (tests/comm/helpers). Every process runs in
// its own process group, and every test kills all groups at the end and checks that
// none is left.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "util/ranks.h"
#include "util/checks.h"

namespace chorus {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;
using test::Subprocess;

const std::string kWorker = std::string(CHORUS_BIN_DIR) + "/chorus_test_worker";

// Failure detection deadline for a killed peer (docs/design.md: "within seconds for
// a dead process").
constexpr seconds kDetectionDeadline{5};

using chorus::test::contains;

// ctest runs this suite as it is (ranks of this machine meet in shared memory) and with
// CHORUS_TRANSPORT=tcp, which the workers inherit.
bool over_shm() {
  const char* t = std::getenv("CHORUS_TRANSPORT");
  return t == nullptr || std::string(t) != "tcp";
}

// Whether the shared-memory algorithm runs the collectives: shared memory, and no
// CHORUS_ALGO forcing another (the routed suite forces the ring over the node's streams).
bool shm_algorithm_runs() {
  const char* algo = std::getenv("CHORUS_ALGO");
  return over_shm() && (algo == nullptr || std::string(algo) == "auto" || std::string(algo) == "shm");
}

// Environment variables that would change how a worker starts; the test sets what it
// needs and removes the rest.
const std::vector<std::string> kUnset = {"RANK",        "WORLD_SIZE",          "LOCAL_RANK",
                                         "LOCAL_WORLD_SIZE", "CHORUS_STORE_HOSTED",
                                         "CHORUS_SOCKET_IFNAME", "HCCL_SOCKET_IFNAME",
                                         "HCCL_IF_IP"};

// One `env://` job of worker processes on loopback.
class Job {
 public:
  Job(int world_size, const std::vector<std::string>& args,
      const std::map<std::string, std::string>& extra_env = {})
      : port_(test::pick_free_port()) {
    for (int rank = 0; rank < world_size; ++rank) {
      test::SpawnOptions options;
      options.args = args;
      options.unset_env = kUnset;
      options.env = {{"MASTER_ADDR", "127.0.0.1"},
                     {"MASTER_PORT", std::to_string(port_)},
                     {"RANK", std::to_string(rank)},
                     {"WORLD_SIZE", std::to_string(world_size)},
                     {"CHORUS_IF_IP", "127.0.0.1"},
                     {"CHORUS_CONNECT_TIMEOUT", "60"},
                     {"CHORUS_TIMEOUT", "120"}};
      for (const auto& [k, v] : extra_env) options.env[k] = v;
      procs_.push_back(std::make_unique<Subprocess>(kWorker, options));
    }
  }

  ~Job() { kill_all(); }

  // The shared-memory segments of this job still in /dev/shm (named after the pid of
  // the rank that created them).
  std::vector<std::string> leftover_segments() const {
    std::vector<std::string> found;
    for (const auto& p : procs_) {
      const std::string prefix = "chorus." + std::to_string(p->pid()) + ".";
      for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
        std::string name = e.path().filename().string();
        if (name.rfind(prefix, 0) == 0) found.push_back(name);
      }
    }
    return found;
  }

  Subprocess& rank(int r) { return *procs_.at(r); }
  int size() const { return static_cast<int>(procs_.size()); }

  // Kills every process group and checks that nothing of it is left.
  void kill_all() {
    for (auto& p : procs_) p->kill_group(SIGKILL);
    for (size_t r = 0; r < procs_.size(); ++r) {
      EXPECT_TRUE(procs_[r]->wait_for(seconds(30))) << "rank " << r << " did not die";
      EXPECT_FALSE(procs_[r]->group_alive()) << "a process of rank " << r << " is left behind";
    }
  }

  std::string outputs() {
    std::string all;
    for (size_t r = 0; r < procs_.size(); ++r) {
      all += "--- rank " + std::to_string(r) + " (" + procs_[r]->status_text() + ")\n" +
             procs_[r]->output_text();
    }
    return all;
  }

 private:
  uint16_t port_;
  std::vector<std::unique_ptr<Subprocess>> procs_;
};

TEST(ProcessTest, FourProcessesAllSucceed) {
  Job job(4, {"allreduce-loop", "20", "100003"});
  for (int r = 0; r < job.size(); ++r) {
    ASSERT_TRUE(job.rank(r).wait_for(seconds(180))) << "rank " << r << " still running\n"
                                                    << job.outputs();
  }
  for (int r = 0; r < job.size(); ++r) {
    EXPECT_EQ(job.rank(r).exit_code(), 0) << "rank " << r << "\n" << job.outputs();
    EXPECT_TRUE(contains(job.rank(r).stdout_text(), "ok")) << job.outputs();
  }
  job.kill_all();
}

// Runs `world_size` workers in an endless large allreduce loop, SIGKILLs `victim` once
// all have started (plus a short random delay, so the kill lands at varying points of
// an operation), and expects every survivor to exit with a chorus::Error within
// kDetectionDeadline whose message names the operation, its sequence number, and the
// dead peer's rank and host.
// With `shared`, the workers' buffers are node-shared memory (the direct path).
void kill_one_and_expect_named_errors(int world_size, int victim, bool shared = false) {
  std::map<std::string, std::string> env;
  if (shared) env["CHORUS_TEST_SHARED"] = "1";
  Job job(world_size, {"allreduce-loop", "0", "4000000"}, env);
  for (int r = 0; r < job.size(); ++r) {
    ASSERT_TRUE(job.rank(r).wait_for_output("started", seconds(120)))
        << "rank " << r << " did not start\n" << job.outputs();
  }
  std::random_device seed_source;
  const unsigned seed = seed_source();
  std::mt19937 rng(seed);
  const milliseconds delay(std::uniform_int_distribution<int>(0, 300)(rng));
  SCOPED_TRACE("kill delay " + std::to_string(delay.count()) + " ms (seed " +
               std::to_string(seed) + ")");
  std::this_thread::sleep_for(delay);  // where in the loop the kill lands; not a sync

  job.rank(victim).kill_group(SIGKILL);
  const auto killed_at = Clock::now();
  const auto deadline = killed_at + kDetectionDeadline;
  for (int r = 0; r < job.size(); ++r) {
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    job.rank(r).wait_for(std::max(left, milliseconds(0)));
  }

  const std::string host = test::this_hostname();
  ASSERT_FALSE(host.empty());
  const std::string peer = "rank " + std::to_string(victim);
  EXPECT_EQ(job.rank(victim).term_signal(), SIGKILL) << job.outputs();
  for (int r = 0; r < job.size(); ++r) {
    if (r == victim) continue;
    Subprocess& p = job.rank(r);
    if (!p.exited()) {
      ADD_FAILURE() << "rank " << r << " still running " << kDetectionDeadline.count()
                    << " s after " << peer << " was killed\n" << job.outputs();
      continue;
    }
    const auto detected = std::chrono::duration_cast<milliseconds>(p.exit_time() - killed_at);
    EXPECT_LE(detected, kDetectionDeadline) << "rank " << r;
    std::printf("rank %d exited %lld ms after %s was killed\n", r,
                static_cast<long long>(detected.count()), peer.c_str());
    EXPECT_EQ(p.exit_code(), 3) << "rank " << r << " should fail with a chorus::Error\n"
                                << job.outputs();
    const std::string err = p.stderr_text();
    EXPECT_TRUE(contains(err, "allreduce")) << "rank " << r << ": no operation name\n" << err;
    EXPECT_TRUE(contains(err, "#")) << "rank " << r << ": no sequence number\n" << err;
    EXPECT_TRUE(contains(err, peer)) << "rank " << r << ": does not name " << peer << "\n" << err;
    EXPECT_TRUE(contains(err, host)) << "rank " << r << ": does not name the host '" << host
                                     << "'\n" << err;
  }
  job.kill_all();
  EXPECT_TRUE(job.leftover_segments().empty())
      << "segment left in /dev/shm: " << job.leftover_segments().front();
}

TEST(ProcessTest, KilledRankIsNamedBySurvivors) { kill_one_and_expect_named_errors(4, 2); }

// The same on node-shared buffers: a rank killed while its peers read and write its
// buffer directly is named as dead, and nothing of the job is left in /dev/shm (its
// buffers are memory files without a name, which die with the last process).
TEST(ProcessTest, KilledRankOfTheDirectPathIsNamedBySurvivors) {
  kill_one_and_expect_named_errors(3, 1, true);
}

// Node-shared buffers are mapped by a peer when it first works on them, once: after a
// loop of 20 allreduces a rank maps at most its two peers' buffers, not one per call,
// and some rank did map them (the direct path ran across processes).
TEST(ProcessTest, DirectPathMapsEachPeerBufferOnce) {
  if (!shm_algorithm_runs()) GTEST_SKIP() << "the shared-memory algorithm does not run here";
  Job job(3, {"allreduce-loop", "20", "100003"}, {{"CHORUS_TEST_SHARED", "1"}});
  for (int r = 0; r < job.size(); ++r) {
    ASSERT_TRUE(job.rank(r).wait_for(seconds(180))) << "rank " << r << " still running\n" << job.outputs();
  }
  bool some = false;
  for (int r = 0; r < job.size(); ++r) {
    EXPECT_EQ(job.rank(r).exit_code(), 0) << "rank " << r << "\n" << job.outputs();
    const std::string out = job.rank(r).stdout_text();
    EXPECT_TRUE(contains(out, "mapped 0") || contains(out, "mapped 1") || contains(out, "mapped 2"))
        << job.outputs();
    some = some || contains(out, "mapped 2");
  }
  EXPECT_TRUE(some) << job.outputs();
  job.kill_all();
  EXPECT_TRUE(job.leftover_segments().empty());
}

// Whether process `pid` is stopped (state T in /proc/<pid>/stat).
bool is_stopped(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  const std::string stat((std::istreambuf_iterator<char>(in)), {});
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'T';
}

// With no core to spare (as many ranks as cores), a large allreduce on node-shared
// buffers is entered at issue and its pieces are shared work: the first rank to wait
// does all of them while its peers compute (DDP's first bucket). Here the peers issue
// it and stop (SIGSTOP), so nothing of theirs runs: rank 0 must still finish the call,
// and a peer, once continued, must find the sum in its buffer before it waits. Were a
// peer's part of the call left to its own threads, rank 0 would wait until the deadline.
TEST(ProcessTest, TheFirstRankToWaitDoesEveryPieceWhileItsPeersAreStopped) {
  if (!shm_algorithm_runs()) GTEST_SKIP() << "the shared-memory algorithm does not run here";
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  if (cores > 8) GTEST_SKIP() << "as many ranks as cores (" << cores << ") would be more than 8";
  Job job(std::max(2, cores), {"first-waiter", "196615"});
  ASSERT_TRUE(job.rank(0).wait_for_output("reduced", seconds(60)))
      << "rank 0 did not finish the allreduce while its peers were stopped\n" << job.outputs();
  for (int r = 1; r < job.size(); ++r) {
    const auto until = Clock::now() + seconds(60);
    while (!is_stopped(job.rank(r).pid()) && Clock::now() < until) std::this_thread::sleep_for(milliseconds(5));
    ASSERT_TRUE(is_stopped(job.rank(r).pid())) << "rank " << r << " did not stop\n" << job.outputs();
    job.rank(r).kill_group(SIGCONT);
  }
  for (int r = 0; r < job.size(); ++r) {
    ASSERT_TRUE(job.rank(r).wait_for(seconds(60))) << "rank " << r << " still running\n" << job.outputs();
    EXPECT_EQ(job.rank(r).exit_code(), 0) << "rank " << r << "\n" << job.outputs();
    EXPECT_TRUE(contains(job.rank(r).stdout_text(), "ok")) << job.outputs();
  }
  job.kill_all();
}

// Rank 0 hosts the store: its death must still surface as a communication error naming
// rank 0 within the deadline, not as a store timeout later.
TEST(ProcessTest, KilledStoreHostIsNamedBySurvivors) { kill_one_and_expect_named_errors(3, 0); }

// A stopped rank (SIGSTOP) is alive but silent: the others must run into the operation
// deadline and name it, over shared memory as over tcp.
TEST(ProcessTest, StoppedRankRunsIntoTheDeadlineNamingIt) {
  Job job(3, {"allreduce-loop", "0", "100000"}, {{"CHORUS_TIMEOUT", "2"}});
  for (int r = 0; r < job.size(); ++r) {
    ASSERT_TRUE(job.rank(r).wait_for_output("started", seconds(120)))
        << "rank " << r << " did not start\n" << job.outputs();
  }
  job.rank(1).kill_group(SIGSTOP);
  for (int r : {0, 2}) {
    ASSERT_TRUE(job.rank(r).wait_for(seconds(60))) << "rank " << r << " hangs\n" << job.outputs();
    EXPECT_EQ(job.rank(r).exit_code(), 3) << job.outputs();
    const std::string err = job.rank(r).stderr_text();
    EXPECT_TRUE(contains(err, "allreduce")) << err;
    EXPECT_TRUE(contains(err, "timed out") || contains(err, "aborted")) << err;
    // The shared-memory algorithm waits for every peer at once and names the stopped
    // one; a ring (over tcp, or forced over the node's streams) names the neighbour it
    // was receiving from, which may be the other survivor (issue 6's flight recorder
    // tells which rank is behind).
    if (shm_algorithm_runs()) {
      EXPECT_TRUE(contains(err, "rank 1 (host")) << err;
    }
  }
  EXPECT_TRUE(contains(job.rank(0).stderr_text() + job.rank(2).stderr_text(), "timed out"))
      << job.outputs();
  job.rank(1).kill_group(SIGCONT);
  job.kill_all();
}

// A segment whose creator is dead (a job killed while it set up) is removed by the next
// job on the machine; one whose creator lives is left alone.
// A rank stopped by SIGTERM (as chorusrun stops its workers when the job fails) while
// in an allreduce loop writes its flight recorder's trace, naming the signal, and still
// dies of SIGTERM.
TEST(ProcessTest, SigtermedRankLeavesItsTrace) {
  const std::string dir = testing::TempDir() + "chorus_sigterm_traces_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  Job job(2, {"allreduce-loop", "0", "100000"}, {{"CHORUS_TRACE_DIR", dir}});
  for (int r = 0; r < job.size(); ++r) {
    ASSERT_TRUE(job.rank(r).wait_for_output("started", seconds(120)))
        << "rank " << r << " did not start\n" << job.outputs();
  }
  ASSERT_EQ(kill(job.rank(0).pid(), SIGTERM), 0);
  ASSERT_TRUE(job.rank(0).wait_for(seconds(30))) << job.outputs();
  EXPECT_EQ(job.rank(0).term_signal(), SIGTERM) << job.outputs();
  const std::string path = dir + "/chorus_trace_world_rank0.json";
  EXPECT_TRUE(contains(job.rank(0).stderr_text(), "full trace in " + path)) << job.outputs();
  std::ifstream in(path);
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_TRUE(contains(text, "received SIGTERM")) << path << ":\n" << text;
  EXPECT_TRUE(contains(text, "\"op\":\"allreduce\"")) << path << ":\n" << text;
  job.kill_all();
  std::filesystem::remove_all(dir);
}

TEST(ProcessTest, StaleSegmentsOfDeadJobsAreRemoved) {
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  const std::string stale = "/dev/shm/chorus." + std::to_string(child) + ".00000000deadbeef";
  const std::string live = "/dev/shm/chorus." + std::to_string(getpid()) + ".00000000cafef00d";
  for (const std::string& path : {stale, live}) {
    std::FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr) << path;
    std::fclose(f);
  }
  Job job(2, {"allreduce-loop", "2", "1000"});
  for (int r = 0; r < job.size(); ++r) {
    ASSERT_TRUE(job.rank(r).wait_for(seconds(120))) << job.outputs();
    EXPECT_EQ(job.rank(r).exit_code(), 0) << job.outputs();
  }
  if (over_shm()) {
    EXPECT_FALSE(std::filesystem::exists(stale)) << stale << " was not removed";
  }
  EXPECT_TRUE(std::filesystem::exists(live)) << "a live process's segment was removed";
  std::filesystem::remove(stale);
  std::filesystem::remove(live);
  EXPECT_TRUE(job.leftover_segments().empty());
}

// CHORUS_DEBUG=INFO: every rank says how its communicator was set up (as NCCL_DEBUG=INFO
// does at init), and nothing is said without it.
TEST(ProcessTest, DebugInfoMakesEveryRankDescribeItsCommunicator) {
  for (const char* debug : {"INFO", "OFF"}) {
    Job job(3, {"allreduce-loop", "2", "1000"}, {{"CHORUS_DEBUG", debug}});
    for (int r = 0; r < job.size(); ++r) {
      ASSERT_TRUE(job.rank(r).wait_for(seconds(120))) << job.outputs();
      EXPECT_EQ(job.rank(r).exit_code(), 0) << job.outputs();
      const std::string err = job.rank(r).stderr_text();
      const std::string line = "communicator set up on rank " + std::to_string(r) + " of 3 (host ";
      if (std::string(debug) == "INFO") {
        EXPECT_TRUE(contains(err, line)) << err;
        EXPECT_TRUE(contains(err, ": 3 ranks on 1 node(s), 3 on this one, which talk over " +
                                      std::string(over_shm() ? "shared memory" : "tcp")))
            << err;
        EXPECT_TRUE(contains(err, ", reduce kernels ")) << err;
      } else {
        EXPECT_FALSE(contains(err, "communicator set up on")) << err;
      }
    }
  }
}

void expect_env_error(const std::map<std::string, std::string>& env,
                      const std::vector<std::string>& unset) {
  test::SpawnOptions options;
  options.args = {"allreduce-loop", "1", "1"};
  options.unset_env = kUnset;
  options.unset_env.insert(options.unset_env.end(), unset.begin(), unset.end());
  options.env = env;
  options.env["MASTER_ADDR"] = "127.0.0.1";
  options.env["MASTER_PORT"] = std::to_string(test::pick_free_port());
  options.env["CHORUS_CONNECT_TIMEOUT"] = "10";
  Subprocess p(kWorker, options);
  ASSERT_TRUE(p.wait_for(seconds(30))) << p.output_text();
  EXPECT_EQ(p.exit_code(), 3) << p.status_text() << "\n" << p.output_text();
  const std::string err = p.stderr_text();
  EXPECT_TRUE(contains(err, "RANK")) << err;
  EXPECT_TRUE(contains(err, "WORLD_SIZE")) << err;
  p.kill_group(SIGKILL);
  p.wait_for(seconds(10));
  EXPECT_FALSE(p.group_alive());
}

TEST(ProcessTest, RankWithoutWorldSizeFailsNamingBoth) {
  expect_env_error({{"RANK", "1"}}, {});
}

TEST(ProcessTest, WorldSizeWithoutRankFailsNamingBoth) {
  expect_env_error({{"WORLD_SIZE", "2"}}, {});
}

// chorus-bench's JSON rows of one run, counted by layout.
struct BenchRows {
  size_t out = 0, in = 0;
};

// Runs chorus-bench on 3 local ranks (odd) from 12 B to 192 KiB by 4 (8 sizes), checked,
// with `args` added; fails the test on an exit status other than 0 or on any row with
// a wrong element, a crash or a hang. The ranks inherit CHORUS_TRANSPORT (the tcp: copy).
BenchRows run_bench(const std::vector<std::string>& args) {
  std::vector<std::string> all = {"--np", "3", "-b", "12", "-e", "196608", "-f", "4", "-n", "2",
                                  "-w", "1", "-c", "1", "--json"};
  all.insert(all.end(), args.begin(), args.end());
  std::string what;
  for (const std::string& a : args) what += " " + a;
  std::string out;
  const int rc = test::run_command(std::string(CHORUS_BIN_DIR) + "/chorus-bench", all, &out,
                                   seconds(120));
  EXPECT_EQ(rc, 0) << what << "\n" << out;
  BenchRows rows;
  size_t start = 0;
  for (size_t end; (end = out.find('\n', start)) != std::string::npos; start = end + 1) {
    const std::string line = out.substr(start, end - start);
    if (line.empty() || line[0] != '{') continue;
    EXPECT_TRUE(line.ends_with("\"wrong\":0}")) << what << ": " << line;
    if (contains(line, "\"mode\":\"out\"")) ++rows.out;
    else if (contains(line, "\"mode\":\"in\"")) ++rows.in;
    else ADD_FAILURE() << what << ": a row without a mode: " << line;
  }
  return rows;
}

const char* const kBenchCollectives[] = {"allreduce", "broadcast", "reduce", "allgather",
                                         "allgatherv", "reduce_scatter", "alltoall",
                                         "alltoallv", "gather", "scatter", "sendrecv"};

// chorus-bench checks every collective's result against the closed form, out of place
// and in place (--mode both, the default: one row of each per size; sendrecv has no
// in-place form). Over shared memory, and over tcp as the tcp: copy.
TEST(ProcessTest, ChorusBenchChecksEveryCollective) {
  for (const std::string op : kBenchCollectives) {
    const BenchRows rows = run_bench({"-o", op});
    EXPECT_EQ(rows.out, 8u) << op;
    EXPECT_EQ(rows.in, op == "sendrecv" ? 0u : 8u) << op;
  }
}

// In place, chorus-bench allocates no send buffer, and its check fills the input into
// the one buffer where communicator.h's layout puts it and reads the result from there
// (with --mode both it also poisons the send buffer first): a benchmark that ran the
// op out of place, or a library that left its result elsewhere, fails.
TEST(ProcessTest, ChorusBenchInPlaceChecksTheOneBuffer) {
  for (const std::string op : kBenchCollectives) {
    if (op == "sendrecv") continue;
    const BenchRows rows = run_bench({"-o", op, "-m", "in"});
    EXPECT_EQ(rows.out, 0u) << op;
    EXPECT_EQ(rows.in, 8u) << op;
  }
  const BenchRows rows = run_bench({"-m", "out"});
  EXPECT_EQ(rows.out, 8u);
  EXPECT_EQ(rows.in, 0u);
}

// --buffers shared: node-shared memory (chorus::allocate_shared), where the allreduce
// (in and out of place), the in-place reduce-scatter and allgather, and the broadcast
// take the direct path and the other collectives the ordinary one.
TEST(ProcessTest, ChorusBenchSharedBuffers) {
  for (const std::string op : {"allreduce", "reduce_scatter", "allgather", "broadcast", "alltoall"}) {
    const BenchRows rows = run_bench({"-o", op, "--buffers", "shared"});
    EXPECT_EQ(rows.out, 8u) << op;
    EXPECT_EQ(rows.in, 8u) << op;
  }
}

// A layout a collective does not have is a usage error (exit status 2) that says so.
TEST(ProcessTest, ChorusBenchRefusesSendrecvInPlace) {
  std::string out;
  const int rc = test::run_command(std::string(CHORUS_BIN_DIR) + "/chorus-bench",
                                   {"-o", "sendrecv", "-m", "in"}, &out, seconds(30));
  EXPECT_EQ(rc, 2) << out;
  EXPECT_TRUE(contains(out, "sendrecv has no in-place form")) << out;
}

}  // namespace
}  // namespace chorus
