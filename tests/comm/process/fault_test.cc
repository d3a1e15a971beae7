// Fault injection (issue 6): ranks killed (SIGKILL) or stopped (SIGSTOP) at a random
// point of a random collective, over tcp and shared memory, on 1 node and on 2
// simulated nodes; a network cut between two network namespaces; and a soak of 10,000
// random collectives with every result checked.
//
// Every scenario starts 4 worker processes (build/bin/chorus_test_worker
// collectives-loop: every collective kind in turn, one stdout line per operation), waits
// until the victim prints the chosen operation, waits a random 0-2 ms more, and kills or
// stops it. Then every survivor must exit with the chorus::Error exit code (3) within its
// deadline (5 s after a death: docs/design.md's "within seconds for a dead process"; the
// operation timeout after a stop), its error must name the operation it was in (and,
// after a death, the dead rank), chorus-trace over the survivors' flight recorders must
// name the victim as the rank without a trace, and no process nor shared-memory segment
// of the scenario may be left. Each scenario prints a line ("scenario 3: SIGKILL rank 2
// during reduce_scatter ...: survivors failed in ...") and each test a summary
// ("[fault summary] ...: N scenarios run, N survived; ...").
//
// Randomness comes from one seed per test, printed; CHORUS_FAULT_SEED=<seed> repeats
// the same choices (victims, operations, delays, sizes; not the kernel's scheduling).
// CHORUS_FAULT_SCENARIOS=<n> changes the number of scenarios per test.
//
// The tests set CHORUS_TRANSPORT for their workers themselves, so the suite need not
// run twice (as collectives_test does with CHORUS_TRANSPORT=tcp); the soak has one test
// per transport.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "chorus/chorus.h"
#include "util/expected.h"
#include "util/ranks.h"
#include "util/checks.h"

namespace chorus {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;
using test::Subprocess;

const std::string kWorker = std::string(CHORUS_BIN_DIR) + "/chorus_test_worker";
const std::string kTrace = std::string(CHORUS_BIN_DIR) + "/chorus-trace";

constexpr int kWorld = 4;
// A dead peer is an error within this (tcp: the connection closes; shm: pidfd polling).
constexpr milliseconds kDeathDeadline{5000};
// CHORUS_TIMEOUT of the SIGSTOP scenarios: a stopped rank is only found by the deadline.
constexpr milliseconds kStopTimeout{3000};
// Added to the deadlines above: the survivor still has to write its error and exit,
// and the machine runs other tests at the same time.
constexpr milliseconds kSlack{1500};
// Largest f32 count of one operation (alltoall and friends move 4x as much).
constexpr long kMaxCount = 150000;

// The worker's operation kinds, in its order (op I is kind I % 12).
constexpr const char* kKinds[] = {"allreduce",  "broadcast",      "reduce", "allgather",
                                  "allgatherv", "reduce_scatter", "gather", "scatter",
                                  "alltoall",   "alltoallv",      "barrier", "sendrecv"};
constexpr int kNumKinds = sizeof(kKinds) / sizeof(kKinds[0]);

using chorus::test::contains;

double secs(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string fmt_s(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f s", s);
  return buf;
}

// The seed of this test: CHORUS_FAULT_SEED, else a fresh one. Printed either way.
unsigned test_seed() {
  unsigned seed;
  if (const char* s = std::getenv("CHORUS_FAULT_SEED")) {
    seed = static_cast<unsigned>(std::strtoul(s, nullptr, 10));
  } else {
    seed = std::random_device{}();
  }
  std::printf("seed %u (CHORUS_FAULT_SEED=%u repeats this test's choices)\n", seed, seed);
  std::fflush(stdout);
  return seed;
}

// A positive count from environment variable `name`, `fallback` when unset or not one.
int count_from_env(const char* name, int fallback) {
  if (const char* s = std::getenv(name)) {
    int n = std::atoi(s);
    if (n > 0) return n;
  }
  return fallback;
}

int scenario_count(int fallback) { return count_from_env("CHORUS_FAULT_SCENARIOS", fallback); }
// SIGSTOP scenarios: CHORUS_FAULT_STOP_SCENARIOS where set (each waits out the operation
// timeout), else as scenario_count().
int stop_scenario_count(int fallback) {
  return count_from_env("CHORUS_FAULT_STOP_SCENARIOS", scenario_count(fallback));
}

// Environment variables that would change how a worker starts or runs.
const std::vector<std::string> kUnset = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "CHORUS_STORE_HOSTED",
    "CHORUS_SOCKET_IFNAME", "HCCL_SOCKET_IFNAME", "HCCL_IF_IP", "CHORUS_ALGO", "CHORUS_DEBUG",
    "CHORUS_JOB_TOKEN", "CHORUS_RESTART_COUNT", "HCCL_EXEC_TIMEOUT", "HCCL_CONNECT_TIMEOUT"};

// What a survivor's error names for the worker's operation `kind`.
std::vector<std::string> library_names(const std::string& kind) {
  if (kind == "sendrecv") return {"send", "recv"};
  return {kind};
}

// The last "op I KIND" line of a worker's stdout: {I, KIND}, or {-1, ""}.
std::pair<long, std::string> last_op(const std::string& out) {
  size_t at = out.rfind("op ");
  while (at != std::string::npos && at != 0 && out[at - 1] != '\n') {
    at = at == 0 ? std::string::npos : out.rfind("op ", at - 1);
  }
  if (at == std::string::npos) return {-1, ""};
  std::istringstream in(out.substr(at + 3));
  long index = -1;
  std::string kind;
  in >> index >> kind;
  return {index, kind};
}

// The error a worker printed: from its last "chorus error (" to the end of stderr.
std::string error_part(const std::string& err) {
  size_t at = err.rfind("chorus error (");
  return at == std::string::npos ? "" : err.substr(at);
}

// "worker: rank R failed in op I (KIND)": {I, KIND}, or {-1, ""}.
std::pair<long, std::string> failed_op(const std::string& err) {
  size_t at = err.find("failed in op ");
  if (at == std::string::npos) return {-1, ""};
  std::istringstream in(err.substr(at + std::strlen("failed in op ")));
  long index = -1;
  std::string kind;
  in >> index >> kind;
  if (kind.size() >= 2 && kind.front() == '(' && kind.back() == ')') {
    kind = kind.substr(1, kind.size() - 2);
  }
  return {index, kind};
}

// ---------------------------------------------------------------------------------
// Killed and stopped ranks.

struct Config {
  std::string transport;  // "tcp" or "shm" (CHORUS_TRANSPORT)
  int nodes;              // 1, or 2 simulated nodes (CHORUS_NODE_ID) of 2 ranks each
  // CHORUS_SHM_CMA: "all" makes the 4 ranks of one node read each other's buffers in
  // every collective that can (by default only nodes of two do).
  std::string shm_cma = "1";
  std::string label() const {
    return transport + ", " + std::to_string(nodes) + (nodes == 1 ? " node" : " nodes") +
           (shm_cma == "1" ? "" : ", CHORUS_SHM_CMA=" + shm_cma);
  }
};

enum class Fault { kKill, kStop };
const char* fault_name(Fault f) { return f == Fault::kKill ? "SIGKILL" : "SIGSTOP"; }

// What one test saw over its scenarios.
struct Stats {
  int run = 0, survived = 0;
  double min_s = 1e9, max_s = 0;
  void detection(double s) {
    min_s = std::min(min_s, s);
    max_s = std::max(max_s, s);
  }
};

// 4 worker processes of one scenario; the destructor kills whatever is left.
class Workers {
 public:
  Workers(const Config& cfg, Fault fault, unsigned worker_seed, const std::string& trace_dir) {
    const uint16_t port = test::pick_free_port();
    const std::string node_prefix = "fault-" + std::to_string(getpid()) + "-node";
    for (int rank = 0; rank < kWorld; ++rank) {
      test::SpawnOptions o;
      o.args = {"collectives-loop", "0", std::to_string(kMaxCount), std::to_string(worker_seed)};
      o.unset_env = kUnset;
      const bool node_b = cfg.nodes == 2 && rank >= kWorld / 2;
      o.env = {{"MASTER_ADDR", "127.0.0.1"},
               {"MASTER_PORT", std::to_string(port)},
               {"RANK", std::to_string(rank)},
               {"WORLD_SIZE", std::to_string(kWorld)},
               {"CHORUS_IF_IP", "127.0.0.1"},
               {"CHORUS_TRANSPORT", cfg.transport},
               {"CHORUS_SHM_CMA", cfg.shm_cma},
               {"CHORUS_NODE_ID", node_prefix + (node_b ? "B" : "A")},
               {"CHORUS_CONNECT_TIMEOUT", "60"},
               {"CHORUS_TRACE_DIR", trace_dir},
               // After a death the timeout must not be what reports it.
               {"CHORUS_TIMEOUT", fault == Fault::kStop
                                      ? std::to_string(kStopTimeout.count()) + "ms"
                                      : "120"}};
      procs_.push_back(std::make_unique<Subprocess>(kWorker, o));
      pids_.push_back(procs_.back()->pid());
    }
  }
  ~Workers() {
    for (auto& p : procs_) p->kill_group(SIGKILL);
    for (auto& p : procs_) p->wait_for(seconds(30));
  }

  Subprocess& rank(int r) { return *procs_.at(r); }
  const std::vector<pid_t>& pids() const { return pids_; }

  std::string outputs() {
    std::string all;
    for (size_t r = 0; r < procs_.size(); ++r) {
      std::string out = procs_[r]->stdout_text();
      // The op lines are many: keep the last ones.
      if (out.size() > 600) out = "...\n" + out.substr(out.size() - 600);
      all += "--- rank " + std::to_string(r) + " (" + procs_[r]->status_text() + ")\n" + out +
             procs_[r]->stderr_text();
    }
    return all;
  }

 private:
  std::vector<std::unique_ptr<Subprocess>> procs_;
  std::vector<pid_t> pids_;
};

// One scenario: returns whether every check passed (each failed check is also a test
// failure). `kind` is the operation kind the fault should land in.
bool run_scenario(int number, const Config& cfg, Fault fault, int kind, std::mt19937& rng,
                  Stats& stats) {
  const unsigned worker_seed = rng();
  const int victim = static_cast<int>(rng() % kWorld);
  const auto delay = std::chrono::microseconds(rng() % 2000);
  const long skip = 1 + static_cast<long>(rng() % kNumKinds);
  const std::string what = std::string("scenario ") + std::to_string(number) + ": " +
                           fault_name(fault) + " rank " + std::to_string(victim) + " (" +
                           cfg.label() + ", worker seed " + std::to_string(worker_seed) + ")";
  SCOPED_TRACE(what);
  ++stats.run;
  bool ok = true;
  auto fail = [&ok](const std::string& message) {
    ok = false;
    ADD_FAILURE() << message;
  };

  // The flight recorders write here; chorus-trace then names the rank without a trace.
  const std::string trace_dir = testing::TempDir() + "chorus_fault_traces_" +
                                std::to_string(getpid()) + "_" + std::to_string(number);
  std::filesystem::remove_all(trace_dir);
  std::filesystem::create_directories(trace_dir);
  struct RemoveDir {
    std::string path;
    ~RemoveDir() { std::filesystem::remove_all(path); }
  } remove_traces{trace_dir};
  Workers job(cfg, fault, worker_seed, trace_dir);
  for (int r = 0; r < kWorld; ++r) {
    if (!job.rank(r).wait_for_output("started", seconds(120))) {
      fail("rank " + std::to_string(r) + " did not start\n" + job.outputs());
      return false;
    }
  }
  // The target: the first operation of kind `kind` at least `skip` operations ahead.
  Subprocess& v = job.rank(victim);
  long target = last_op(v.stdout_text()).first + skip;
  while (target % kNumKinds != kind) ++target;
  const std::string needle = "op " + std::to_string(target) + " ";
  const auto wait_until = Clock::now() + seconds(120);
  while (!contains(v.stdout_text(), needle)) {
    if (v.exited() || Clock::now() > wait_until) {
      fail("rank " + std::to_string(victim) + " never reached op " + std::to_string(target) +
           "\n" + job.outputs());
      return false;
    }
    v.wait_for(milliseconds(0));
    std::this_thread::sleep_for(milliseconds(1));
  }
  std::this_thread::sleep_for(delay);
  for (int r = 0; r < kWorld; ++r) {
    if (job.rank(r).wait_for(milliseconds(0))) {
      fail("rank " + std::to_string(r) + " exited before the fault\n" + job.outputs());
      return false;
    }
  }
  // Taken before the signal: if this thread is preempted in between, the measured
  // times only grow.
  const auto fault_at = Clock::now();
  v.kill_group(fault == Fault::kKill ? SIGKILL : SIGSTOP);

  // Wait for every survivor, polling each so that exit times are exact to ~1 ms.
  const milliseconds bound =
      (fault == Fault::kKill ? kDeathDeadline : kStopTimeout) + kSlack;
  const auto give_up = fault_at + bound + seconds(20);  // past the bound: report a hang
  for (;;) {
    bool all = true;
    for (int r = 0; r < kWorld; ++r) {
      if (r != victim && !job.rank(r).wait_for(milliseconds(0))) all = false;
    }
    if (all || Clock::now() > give_up) break;
    std::this_thread::sleep_for(milliseconds(1));
  }
  // Where the victim was: its last printed operation.
  const auto [victim_op, victim_kind] = last_op(v.stdout_text());

  std::vector<std::string> times;
  int names_victim_count = 0;
  bool some_timed_out = false;
  std::map<int, std::string> errors;  // survivor -> its chorus error
  const std::string peer = "rank " + std::to_string(victim);
  const std::string peer_named = peer + " (host";  // how errors name a rank
  for (int r = 0; r < kWorld; ++r) {
    if (r == victim) continue;
    Subprocess& p = job.rank(r);
    const std::string who = "rank " + std::to_string(r);
    if (!p.exited()) {
      fail(who + " still running " + fmt_s(secs(Clock::now() - fault_at)) + " after the " +
           fault_name(fault) + " of " + peer + "\n" + job.outputs());
      times.push_back(who + " hung");
      continue;
    }
    const double t = secs(p.exit_time() - fault_at);
    stats.detection(t);
    times.push_back(fmt_s(t) + " (op " + std::to_string(failed_op(p.stderr_text()).first) + ")");
    if (p.exit_time() - fault_at > bound) {
      fail(who + " exited " + fmt_s(t) + " after the fault, past its deadline of " +
           fmt_s(secs(bound)) + "\n" + job.outputs());
    }
    const std::string err = p.stderr_text();
    if (p.exit_code() != 3) {
      fail(who + " should fail with a chorus::Error (exit code 3), got " + p.status_text() +
           "\n" + job.outputs());
      continue;
    }
    const auto [op_index, op_kind] = failed_op(err);
    const std::string error = error_part(err);
    if (op_index < 0 || error.empty()) {
      fail(who + ": no 'failed in op' line or no chorus error in its stderr\n" + err);
      continue;
    }
    // (Which operation a survivor fails in is not tied to the victim's: a survivor can
    // finish operations that need nothing more from the victim, e.g. a barrier the
    // victim has entered, a send/recv between two other ranks, a broadcast it roots.)
    bool named = false;
    for (const std::string& n : library_names(op_kind)) named = named || contains(error, n);
    if (!named || !contains(error, "#")) {
      fail(who + "'s error does not name its operation (" + op_kind + ", with its sequence "
           "number)\n" + error);
    }
    const bool names_victim = contains(error, peer_named);
    if (names_victim) ++names_victim_count;
    some_timed_out = some_timed_out || contains(error, "timed out");
    errors[r] = error;
  }
  if (fault == Fault::kKill) {
    // A death is seen by every survivor's transport, or reaches it as the cause of an
    // abort (a rank that aborts lingers before closing, so its abort notice is not lost
    // to a connection reset): every survivor names the dead rank.
    for (const auto& [r, error] : errors) {
      if (contains(error, peer_named)) continue;
      fail("rank " + std::to_string(r) + "'s error does not name the dead " + peer + "\n" +
           error);
    }
  }
  if (fault == Fault::kStop) {
    // A stopped rank is alive: the operation deadline finds it. A rank names the peer
    // it was waiting for (in shared memory every local peer that has not arrived; over
    // tcp, which also carries the collectives shm has no direct algorithm for, the peer
    // it receives from), and the first timeout aborts the others, so the stopped rank
    // may be in no error at all: every survivor may name a survivor that was waiting
    // for it. chorus-trace names it (below), which is what the flight recorder is for.
    if (!some_timed_out) fail("no survivor reports a timeout\n" + job.outputs());
  }
  // The survivors' flight recorders, merged: the victim is the rank without a trace.
  std::string trace;
  const int trace_rc = test::run_command(kTrace, {trace_dir}, &trace, seconds(30));
  if (trace_rc != 0 || !contains(trace, peer + ": no trace")) {
    fail("chorus-trace does not name " + peer + " as the rank without a trace (exit " +
         std::to_string(trace_rc) + ")\n" + trace);
  }

  // The victim, then everything: nothing may be left.
  if (fault == Fault::kStop && v.exited()) {
    fail("the stopped " + peer + " exited (" + v.status_text() + ")");
  }
  v.kill_group(SIGKILL);
  if (!v.wait_for(seconds(30))) fail(peer + " did not die after SIGKILL");
  if (fault == Fault::kKill && v.term_signal() != SIGKILL) {
    fail(peer + " should have died of SIGKILL, got " + v.status_text());
  }
  for (int r = 0; r < kWorld; ++r) {
    job.rank(r).kill_group(SIGKILL);
    if (!job.rank(r).wait_for(seconds(30))) fail("rank " + std::to_string(r) + " was not reaped");
    if (job.rank(r).group_alive()) fail("a process of rank " + std::to_string(r) + " is left");
  }
  const auto segments = test::shm_segments_of(job.pids());
  if (!segments.empty()) fail("shared-memory segment left in /dev/shm: " + segments.front());

  std::string line = "scenario " + std::to_string(number) + ": " + fault_name(fault) + " rank " +
                     std::to_string(victim) + " during " +
                     (victim_kind.empty() ? std::string("?") : victim_kind) + " (op " +
                     std::to_string(victim_op) + ", aimed at " + kKinds[kind] + " op " +
                     std::to_string(target) + " +" + std::to_string(delay.count()) + " us) (" +
                     cfg.label() + "): " + std::to_string(names_victim_count) +
                     " of " + std::to_string(kWorld - 1) + " errors name it" +
                     "; survivors failed in";
  for (size_t i = 0; i < times.size(); ++i) line += (i ? ", " : " ") + times[i];
  line += ok ? " -- survived" : " -- FAILED";
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  if (ok) ++stats.survived;
  return ok;
}

// `count` scenarios of one fault and configuration, the operation kinds taken in a
// random order (all 12 when count >= 12).
void run_scenarios(Fault fault, const Config& cfg, int count) {
  std::mt19937 rng(test_seed());
  std::vector<int> kinds(kNumKinds);
  for (int k = 0; k < kNumKinds; ++k) kinds[k] = k;
  std::shuffle(kinds.begin(), kinds.end(), rng);
  Stats stats;
  const auto start = Clock::now();
  for (int i = 0; i < count; ++i) {
    run_scenario(i + 1, cfg, fault, kinds[i % kNumKinds], rng, stats);
  }
  std::printf("[fault summary] %s (%s): %d scenarios run, %d survived; survivors failed "
              "%s .. %s after the fault; %.1f s in all\n",
              fault_name(fault), cfg.label().c_str(), stats.run, stats.survived,
              fmt_s(stats.min_s).c_str(), fmt_s(stats.max_s).c_str(),
              secs(Clock::now() - start));
  EXPECT_EQ(stats.survived, stats.run);
}

// Per test (configuration and fault). A SIGKILL scenario takes ~0.2 s: every operation
// kind twice. A SIGSTOP scenario costs the operation timeout (3 s) while the machine
// idles.
constexpr int kKillScenarios = 2 * kNumKinds;
constexpr int kStopScenarios = 6;

TEST(FaultKill, TcpOneNode) { run_scenarios(Fault::kKill, {"tcp", 1}, scenario_count(kKillScenarios)); }
TEST(FaultKill, TcpTwoNodes) { run_scenarios(Fault::kKill, {"tcp", 2}, scenario_count(kKillScenarios)); }
TEST(FaultKill, ShmOneNode) { run_scenarios(Fault::kKill, {"shm", 1}, scenario_count(kKillScenarios)); }
TEST(FaultKill, ShmTwoNodes) { run_scenarios(Fault::kKill, {"shm", 2}, scenario_count(kKillScenarios)); }
TEST(FaultKill, ShmOneNodeCrossMemoryAttach) {
  run_scenarios(Fault::kKill, {"shm", 1, "all"}, scenario_count(kKillScenarios));
}
TEST(FaultStop, TcpOneNode) { run_scenarios(Fault::kStop, {"tcp", 1}, stop_scenario_count(kStopScenarios)); }
TEST(FaultStop, TcpTwoNodes) { run_scenarios(Fault::kStop, {"tcp", 2}, stop_scenario_count(kStopScenarios)); }
TEST(FaultStop, ShmOneNode) { run_scenarios(Fault::kStop, {"shm", 1}, stop_scenario_count(kStopScenarios)); }
TEST(FaultStop, ShmTwoNodes) { run_scenarios(Fault::kStop, {"shm", 2}, stop_scenario_count(kStopScenarios)); }
TEST(FaultStop, ShmOneNodeCrossMemoryAttach) {
  run_scenarios(Fault::kStop, {"shm", 1, "all"}, stop_scenario_count(kStopScenarios));
}

// ---------------------------------------------------------------------------------
// A cut network: two network namespaces made here, joined by a veth pair with
// link-local addresses that exist only inside them; the link goes down mid-allreduce.

std::string find_ip() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (::access(p, X_OK) == 0) return p;
  }
  return "";
}

// Two namespaces and the veth pair between them; removed by the destructor (deleting
// a namespace deletes its end of the pair, and the pair with it).
class NamespacePair {
 public:
  explicit NamespacePair(std::string ip) : ip_(std::move(ip)) {
    const std::string id = std::to_string(getpid());
    ns_a_ = "chorus-fault-" + id + "-a";
    ns_b_ = "chorus-fault-" + id + "-b";
    veth_a_ = "cfa" + id;  // interface names: at most 15 characters
    veth_b_ = "cfb" + id;
  }
  ~NamespacePair() { remove(); }

  static constexpr const char* kAddrA = "169.254.77.1";
  static constexpr const char* kAddrB = "169.254.77.2";

  // "" when both namespaces are up and connected, else why not.
  std::string create() {
    if (auto e = ip({"netns", "add", ns_a_}); !e.empty()) return e;
    created_a_ = true;
    if (auto e = ip({"netns", "add", ns_b_}); !e.empty()) return e;
    created_b_ = true;
    for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
             {"-n", ns_a_, "link", "add", veth_a_, "type", "veth", "peer", "name", veth_b_,
              "netns", ns_b_},
             {"-n", ns_a_, "addr", "add", std::string(kAddrA) + "/30", "dev", veth_a_},
             {"-n", ns_b_, "addr", "add", std::string(kAddrB) + "/30", "dev", veth_b_},
             {"-n", ns_a_, "link", "set", "lo", "up"},
             {"-n", ns_b_, "link", "set", "lo", "up"},
             {"-n", ns_a_, "link", "set", veth_a_, "up"},
             {"-n", ns_b_, "link", "set", veth_b_, "up"}}) {
      if (auto e = ip(args); !e.empty()) return e;
    }
    return "";
  }

  std::string cut() { return ip({"-n", ns_a_, "link", "set", veth_a_, "down"}); }

  void remove() {
    if (created_a_) ip({"netns", "delete", ns_a_});
    if (created_b_) ip({"netns", "delete", ns_b_});
    created_a_ = created_b_ = false;
  }

  bool listed() {
    std::string out;
    test::run_command(ip_, {"netns", "list"}, &out, seconds(30));
    return contains(out, ns_a_) || contains(out, ns_b_);
  }

  const std::string& ns_a() const { return ns_a_; }
  const std::string& ns_b() const { return ns_b_; }

 private:
  std::string ip(const std::vector<std::string>& args) {
    std::string out;
    int rc = test::run_command(ip_, args, &out, seconds(30));
    if (rc == 0) return "";
    std::string cmd = "ip";
    for (const auto& a : args) cmd += " " + a;
    return "'" + cmd + "' failed (" + std::to_string(rc) + "): " + out;
  }

  std::string ip_, ns_a_, ns_b_, veth_a_, veth_b_;
  bool created_a_ = false, created_b_ = false;
};

TEST(FaultNetwork, LinkCutMidAllreduceFailsWithinTheTimeout) {
  const std::string ip = find_ip();
  if (ip.empty()) GTEST_SKIP() << "iproute2 ('ip') is not installed: cannot make network namespaces";
  if (::geteuid() != 0) GTEST_SKIP() << "network namespaces need root (running as uid " << ::geteuid() << ")";
  std::mt19937 rng(test_seed());
  NamespacePair net(ip);
  if (std::string why = net.create(); !why.empty()) {
    GTEST_SKIP() << "cannot create network namespaces here: " << why;
  }
  const milliseconds timeout(3000);
  const uint16_t port = test::pick_free_port();  // any port is free in a fresh namespace
  std::vector<std::unique_ptr<Subprocess>> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    test::SpawnOptions o;
    o.args = {"netns", "exec", rank == 0 ? net.ns_a() : net.ns_b(), kWorker, "allreduce-loop",
              "0", "300000"};
    o.unset_env = kUnset;
    o.env = {{"MASTER_ADDR", NamespacePair::kAddrA},
             {"MASTER_PORT", std::to_string(port)},
             {"RANK", std::to_string(rank)},
             {"WORLD_SIZE", "2"},
             {"CHORUS_IF_IP", rank == 0 ? NamespacePair::kAddrA : NamespacePair::kAddrB},
             {"CHORUS_TRANSPORT", "tcp"},
             // The namespaces share /dev/shm: only distinct node ids keep them on tcp.
             {"CHORUS_NODE_ID", rank == 0 ? net.ns_a() : net.ns_b()},
             {"CHORUS_CONNECT_TIMEOUT", "30"},
             {"CHORUS_TIMEOUT", std::to_string(timeout.count()) + "ms"}};
    ranks.push_back(std::make_unique<Subprocess>(ip, o));  // `ip netns exec` execs in place
  }
  auto outputs = [&] {
    std::string all;
    for (int r = 0; r < 2; ++r) {
      all += "--- rank " + std::to_string(r) + " (" + ranks[r]->status_text() + ")\n" +
             ranks[r]->output_text();
    }
    return all;
  };
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(ranks[r]->wait_for_output("started", seconds(60)))
        << "rank " << r << " did not start\n" << outputs();
  }
  std::this_thread::sleep_for(milliseconds(rng() % 300));
  ASSERT_EQ(net.cut(), "");
  const auto cut_at = Clock::now();
  const milliseconds bound = timeout + kSlack;
  for (;;) {
    const bool a = ranks[0]->wait_for(milliseconds(0));
    const bool b = ranks[1]->wait_for(milliseconds(0));
    const bool all = a && b;
    if (all || Clock::now() > cut_at + bound + seconds(20)) break;
    std::this_thread::sleep_for(milliseconds(1));
  }
  std::string line = "network cut (veth down mid-allreduce, tcp, 2 namespaces): ranks failed in";
  for (int r = 0; r < 2; ++r) {
    Subprocess& p = *ranks[r];
    ASSERT_TRUE(p.exited()) << "rank " << r << " hangs after the cut\n" << outputs();
    const auto t = p.exit_time() - cut_at;
    line += " " + fmt_s(secs(t));
    EXPECT_LE(t, bound) << "rank " << r;
    EXPECT_EQ(p.exit_code(), 3) << outputs();
    const std::string error = error_part(p.stderr_text());
    EXPECT_TRUE(contains(error, "allreduce #")) << error;
    EXPECT_TRUE(contains(error, "timed out")) << error;
    EXPECT_TRUE(contains(error, "rank " + std::to_string(1 - r))) << error;
  }
  std::printf("%s\n", line.c_str());
  ranks.clear();
  net.remove();
  EXPECT_FALSE(net.listed()) << "a namespace of the test is left";
}

// ---------------------------------------------------------------------------------
// Soak: 10,000 collectives of random kind, size, dtype, op, root and placement on 4
// ranks (threads of this process), issued in batches of 1-4 before waiting, each
// result checked against the closed forms of tests/util/expected.h.
// CHORUS_SOAK_OPS=<n> changes the number (scripts/sanitize.sh: 2,500, where each soak
// took 40-130 s instead of 3-4 s).

const int kSoakOps = count_from_env("CHORUS_SOAK_OPS", 10000);
constexpr size_t kSoakMaxBytes = size_t{1} << 20;  // largest buffer of one rank

enum class Kind {
  kAllreduce, kBroadcast, kReduce, kAllgather, kAllgatherv, kReduceScatter, kGather,
  kScatter, kAlltoall, kAlltoallv, kBarrier, kSendRecv, kCount
};
const char* kind_name(Kind k) {
  static const char* names[] = {"allreduce", "broadcast", "reduce", "allgather", "allgatherv",
                                "reduce_scatter", "gather", "scatter", "alltoall", "alltoallv",
                                "barrier", "sendrecv"};
  return names[static_cast<int>(k)];
}

struct SoakOp {
  Kind kind;
  DataType dtype;
  ReduceOp op;
  size_t count;
  int root;
  bool in_place;
  size_t first;     // offset into the closed-form patterns (varies the data)
  bool batch_end;   // wait for the batch after issuing this one

  std::string name() const {
    std::ostringstream s;
    s << kind_name(kind) << " " << dtype_name(dtype) << " " << op_name(op) << " count " << count
      << " root " << root << (in_place ? " in-place" : "") << " first " << first;
    return s.str();
  }
};

std::vector<SoakOp> soak_plan(std::mt19937& rng, int size) {
  std::vector<SoakOp> plan(kSoakOps);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  int left_in_batch = 0;
  for (SoakOp& o : plan) {
    o.kind = static_cast<Kind>(rng() % static_cast<unsigned>(Kind::kCount));
    o.dtype = kAllDataTypes[rng() % std::size(kAllDataTypes)];
    o.op = kAllReduceOps[rng() % std::size(kAllReduceOps)];
    o.root = static_cast<int>(rng() % size);
    o.in_place = rng() % 2 == 0;
    o.first = rng() % 1000;
    // Sizes: 0 and 1 often, else log-uniform up to a 1 MiB buffer per rank (odd
    // counts as often as even ones).
    const size_t es = dtype_size(o.dtype);
    const bool times_size = o.kind == Kind::kAllgather || o.kind == Kind::kAllgatherv ||
                            o.kind == Kind::kReduceScatter || o.kind == Kind::kGather ||
                            o.kind == Kind::kScatter || o.kind == Kind::kAlltoall ||
                            o.kind == Kind::kAlltoallv;
    const size_t max_count = kSoakMaxBytes / es / (times_size ? size : 1);
    const unsigned pick = rng() % 10;
    if (o.kind == Kind::kBarrier || pick == 0) {
      o.count = 0;
    } else if (pick == 1) {
      o.count = 1;
    } else {
      o.count = static_cast<size_t>(std::exp(unit(rng) * std::log(static_cast<double>(max_count))));
      o.count = std::clamp<size_t>(o.count, 1, max_count);
    }
    if (left_in_batch == 0) left_in_batch = 1 + static_cast<int>(rng() % 4);
    o.batch_end = --left_in_batch == 0;
  }
  plan.back().batch_end = true;
  return plan;
}

// A byte buffer holding the sentinel; data() is null when empty (count 0 passes null).
class Buffer {
 public:
  explicit Buffer(size_t bytes) : words_(new uint64_t[(bytes + 7) / 8]), bytes_(bytes) {
    if (bytes_ != 0) std::memset(words_.get(), test::kSentinelByte, bytes_);
  }
  uint8_t* data() { return bytes_ == 0 ? nullptr : reinterpret_cast<uint8_t*>(words_.get()); }

 private:
  std::unique_ptr<uint64_t[]> words_;
  size_t bytes_;
};

// One issued operation of one rank: its buffers, its Works, and how to check it.
struct Issued {
  std::vector<std::shared_ptr<Buffer>> buffers;
  std::vector<Work> works;
  std::function<std::string()> check;  // "" when the result is right
};

uint8_t* at(uint8_t* base, size_t index, DataType dtype) {
  return base == nullptr ? nullptr : base + index * dtype_size(dtype);
}

Issued issue(Communicator& c, const SoakOp& o) {
  using test::check_move;
  using test::check_sentinel;
  using test::fill_move;
  using test::fill_reduce_input;
  using test::ReduceExpectation;
  const int size = c.size(), rank = c.rank();
  const size_t n = o.count, es = dtype_size(o.dtype), f = o.first;
  const DataType dt = o.dtype;
  Issued is;
  auto buf = [&](size_t elements) {
    is.buffers.push_back(std::make_shared<Buffer>(elements * es));
    return is.buffers.back()->data();
  };
  const bool is_root = rank == o.root;
  switch (o.kind) {
    case Kind::kAllreduce: {
      uint8_t* send = buf(n);
      uint8_t* out = o.in_place ? send : buf(n);
      fill_reduce_input(dt, o.op, rank, send, f, n);
      is.works.push_back(c.allreduce(send, out, n, dt, o.op));
      const ReduceOp op = o.op;
      const bool in_place = o.in_place;
      is.check = [=] {
        std::string e = ReduceExpectation(dt, op, size).check(out, f, n);
        if (e.empty() && !in_place) e = test::check_reduce_input(dt, op, rank, send, f, n);
        return e;
      };
      break;
    }
    case Kind::kBroadcast: {
      uint8_t* send = buf(n);
      uint8_t* out = o.in_place ? send : buf(n);
      if (is_root) fill_move(dt, o.root, send, f, n);
      is.works.push_back(c.broadcast(send, out, n, dt, o.root));
      is.check = [=] { return check_move(dt, o.root, out, f, n); };
      break;
    }
    case Kind::kReduce: {
      uint8_t* send = buf(n);
      uint8_t* out = o.in_place ? send : buf(n);
      fill_reduce_input(dt, o.op, rank, send, f, n);
      is.works.push_back(c.reduce(send, out, n, dt, o.op, o.root));
      const ReduceOp op = o.op;
      const bool in_place = o.in_place;
      is.check = [=] {
        if (is_root) return ReduceExpectation(dt, op, size).check(out, f, n);
        if (!in_place) return check_sentinel(out, n * es);
        return std::string();
      };
      break;
    }
    case Kind::kAllgather: {
      uint8_t* recv = buf(size * n);
      uint8_t* send = o.in_place ? at(recv, rank * n, dt) : buf(n);
      fill_move(dt, rank, send, f, n);
      is.works.push_back(c.allgather(send, recv, n, dt));
      is.check = [=] {
        for (int r = 0; r < size; ++r) {
          std::string e = check_move(dt, r, at(recv, r * n, dt), f, n);
          if (!e.empty()) return "block of rank " + std::to_string(r) + ": " + e;
        }
        return std::string();
      };
      break;
    }
    case Kind::kAllgatherv: {
      auto counts = std::make_shared<std::vector<size_t>>(size);
      auto displs = std::make_shared<std::vector<size_t>>();
      size_t total = 0;
      std::vector<size_t> where(size);
      for (int r = 0; r < size; ++r) {
        (*counts)[r] = n == 0 ? 0 : (r + static_cast<int>(f)) % 3 == 1 ? n / 2 : n - r % 2;
        where[r] = total;
        total += (*counts)[r];
      }
      if (f % 2 == 1) *displs = where;  // explicit displacements half the time
      uint8_t* recv = buf(total);
      uint8_t* send = o.in_place ? at(recv, where[rank], dt) : buf((*counts)[rank]);
      fill_move(dt, rank, send, f, (*counts)[rank]);
      is.works.push_back(c.allgatherv(send, (*counts)[rank], recv, *counts, *displs, dt));
      is.check = [=] {
        for (int r = 0; r < size; ++r) {
          std::string e = check_move(dt, r, at(recv, where[r], dt), f, (*counts)[r]);
          if (!e.empty()) return "block of rank " + std::to_string(r) + ": " + e;
        }
        return std::string();
      };
      break;
    }
    case Kind::kReduceScatter: {
      uint8_t* send = buf(size * n);
      uint8_t* out = o.in_place ? at(send, rank * n, dt) : buf(n);
      fill_reduce_input(dt, o.op, rank, send, f, size * n);
      is.works.push_back(c.reduce_scatter(send, out, n, dt, o.op));
      const ReduceOp op = o.op;
      is.check = [=] { return ReduceExpectation(dt, op, size).check(out, f + rank * n, n); };
      break;
    }
    case Kind::kGather: {
      uint8_t* recv = buf(size * n);
      uint8_t* send = o.in_place && is_root ? at(recv, rank * n, dt) : buf(n);
      fill_move(dt, rank, send, f, n);
      is.works.push_back(c.gather(send, recv, n, dt, o.root));
      is.check = [=] {
        if (!is_root) return check_sentinel(recv, size * n * es);
        for (int r = 0; r < size; ++r) {
          std::string e = check_move(dt, r, at(recv, r * n, dt), f, n);
          if (!e.empty()) return "block of rank " + std::to_string(r) + ": " + e;
        }
        return std::string();
      };
      break;
    }
    case Kind::kScatter: {
      uint8_t* send = buf(size * n);
      uint8_t* out = o.in_place && is_root ? at(send, rank * n, dt) : buf(n);
      if (is_root) fill_move(dt, o.root, send, f, size * n);
      is.works.push_back(c.scatter(send, out, n, dt, o.root));
      is.check = [=] { return check_move(dt, o.root, out, f + rank * n, n); };
      break;
    }
    case Kind::kAlltoall: {
      uint8_t* send = buf(size * n);
      uint8_t* out = o.in_place ? send : buf(size * n);
      // Block q of rank r's send: move_value(r, f + q*n + j).
      fill_move(dt, rank, send, f, size * n);
      is.works.push_back(c.alltoall(send, out, n, dt));
      is.check = [=] {
        for (int p = 0; p < size; ++p) {
          std::string e = check_move(dt, p, at(out, p * n, dt), f + rank * n, n);
          if (!e.empty()) return "block from rank " + std::to_string(p) + ": " + e;
        }
        return std::string();
      };
      break;
    }
    case Kind::kAlltoallv: {
      auto cnt = [&](int from, int to) -> size_t {
        if (n == 0 || (from + 2 * to + static_cast<int>(f)) % 5 == 4) return 0;
        return n - static_cast<size_t>((from + to) % 2);
      };
      auto sc = std::make_shared<std::vector<size_t>>(size), sd = std::make_shared<std::vector<size_t>>(size),
           rc = std::make_shared<std::vector<size_t>>(size), rd = std::make_shared<std::vector<size_t>>(size);
      size_t st = 0, rt = 0;
      for (int q = size - 1; q >= 0; --q) {  // send blocks in reverse rank order
        (*sd)[q] = st;
        st += (*sc)[q] = cnt(rank, q);
      }
      for (int p = 0; p < size; ++p) {
        (*rd)[p] = rt;
        rt += (*rc)[p] = cnt(p, rank);
      }
      uint8_t* send = buf(st);
      uint8_t* recv = buf(rt);
      for (int q = 0; q < size; ++q) fill_move(dt, rank, at(send, (*sd)[q], dt), f + q * n, (*sc)[q]);
      is.works.push_back(c.alltoallv(send, *sc, *sd, recv, *rc, *rd, dt));
      is.check = [=] {
        for (int p = 0; p < size; ++p) {
          std::string e = check_move(dt, p, at(recv, (*rd)[p], dt), f + rank * n, (*rc)[p]);
          if (!e.empty()) return "block from rank " + std::to_string(p) + ": " + e;
        }
        return std::string();
      };
      break;
    }
    case Kind::kBarrier:
      is.works.push_back(c.barrier());
      is.check = [] { return std::string(); };
      break;
    case Kind::kSendRecv: {
      // A ring: even ranks send then receive, odd ranks the other way round, so that
      // the exchange cannot deadlock even if a send waits for its receive.
      const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
      uint8_t* send = buf(n);
      uint8_t* recv = buf(n);
      fill_move(dt, rank, send, f, n);
      if (rank % 2 == 0) {
        is.works.push_back(c.send(send, n, dt, next));
        is.works.push_back(c.recv(recv, n, dt, prev));
      } else {
        is.works.push_back(c.recv(recv, n, dt, prev));
        is.works.push_back(c.send(send, n, dt, next));
      }
      is.check = [=] { return check_move(dt, prev, recv, f, n); };
      break;
    }
    case Kind::kCount:
      break;
  }
  return is;
}

void soak(TransportKind transport) {
  std::mt19937 rng(test_seed());
  const std::vector<SoakOp> plan = soak_plan(rng, kWorld);
  CommOptions options = test::test_options();
  options.transport = transport;
  options.timeout = seconds(60);
  std::map<Kind, int> kinds;
  for (const SoakOp& o : plan) ++kinds[o.kind];
  std::mutex mu;
  std::vector<std::string> wrong;  // the first few wrong results
  int wrong_count = 0;
  const auto start = Clock::now();
  test::RankGroup group(kWorld, options);
  group.run(
      [&](Communicator& c) {
        std::vector<std::pair<size_t, Issued>> batch;
        for (size_t i = 0; i < plan.size(); ++i) {
          batch.emplace_back(i, issue(c, plan[i]));
          if (!plan[i].batch_end) continue;
          for (auto& [index, is] : batch) {
            for (Work& w : is.works) w.wait();
          }
          for (auto& [index, is] : batch) {
            std::string e = is.check();
            if (e.empty()) continue;
            std::lock_guard<std::mutex> lock(mu);
            if (++wrong_count <= 10) {
              wrong.push_back("op " + std::to_string(index) + " (" + plan[index].name() +
                              ") rank " + std::to_string(c.rank()) + ": " + e);
            }
          }
          batch.clear();
        }
      },
      seconds(600));
  const double took = secs(Clock::now() - start);
  std::string mix;
  for (const auto& [k, n] : kinds) mix += std::string(" ") + kind_name(k) + "=" + std::to_string(n);
  std::printf("soak (%s, %d ranks): %d collectives in %.1f s, %d wrong results;%s\n",
              transport == TransportKind::kTcp ? "tcp" : "shm", kWorld, kSoakOps, took,
              wrong_count, mix.c_str());
  EXPECT_EQ(wrong_count, 0);
  for (const std::string& w : wrong) ADD_FAILURE() << w;
}

TEST(FaultSoak, RandomCollectivesOverShm) { soak(TransportKind::kShm); }
TEST(FaultSoak, RandomCollectivesOverTcp) { soak(TransportKind::kTcp); }

}  // namespace
}  // namespace chorus
