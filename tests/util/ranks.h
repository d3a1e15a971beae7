// Test harness: ranks as threads of this process, and real processes for the tests
// that need them.
//
// Threads: every rank runs on its own thread over one shared chorus::InMemoryStore.
// A failure in one rank (an exception) is captured with the rank number, the other
// ranks' communicators are aborted so that they stop waiting on the failed one, and
// the failures are rethrown in the calling (test) thread as one RankFailure.
// gtest's EXPECT_*/ADD_FAILURE are thread-safe and may be used inside rank bodies.
//
// Deadlines: every join has one. A rank thread that does not finish in time cannot be
// joined nor cancelled, so the harness prints which ranks are stuck and calls abort():
// a loud crash is better than a test run that hangs until some outer timeout.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "chorus/communicator.h"
#include "chorus/store.h"

namespace chorus::test {

using std::chrono::milliseconds;
using std::chrono::seconds;

// How long a group of rank threads may run before the process is aborted.
inline constexpr seconds kDefaultRankDeadline{300};

// CommOptions::from_env() with test-friendly deadlines (operation 120 s, connect 60 s,
// both shorter than kDefaultRankDeadline so the library reports a hang before the
// harness does) and listening on loopback only.
CommOptions test_options();

// Whether ranks of one node with options `o` run the direct shared-memory algorithms,
// which compare every rank's call at their first phase: shared memory, and no forced
// flat algorithm (CHORUS_ALGO=ring, say, whose messages go through the node's streams
// and fail as they do over tcp: a rank whose part only sends may complete).
bool direct_shm(const CommOptions& o);

// Thrown in the test thread when one or more ranks failed. what() lists every failed
// rank with its message, root causes (non-AbortedError) first.
class RankFailure : public std::runtime_error {
 public:
  explicit RankFailure(const std::string& message) : std::runtime_error(message) {}
};

// Runs fn(rank) for rank 0..size-1, each on its own thread, and joins them all before
// `deadline` (abort() after printing the stuck ranks otherwise). Returns each rank's
// exception (nullptr where fn returned). `on_failure(rank)` is called from the failing
// thread as soon as a rank throws (e.g. to abort the other ranks).
std::vector<std::exception_ptr> run_threads(int size, const std::function<void(int)>& fn,
                                            seconds deadline = kDefaultRankDeadline,
                                            const std::function<void(int)>& on_failure = {});

// Throws RankFailure describing the non-null entries of `errors`; returns otherwise.
void rethrow_rank_failures(const std::vector<std::exception_ptr>& errors);

// Text of an exception_ptr ("<no error>" for nullptr).
std::string describe(const std::exception_ptr& error);

// Sweeps of many cases run them back to back on the rank threads, batch by batch, each
// collective following the last with no join in between (as in a real job, where ranks
// drift apart between collectives): starting threads for every case cost more than the
// small cases themselves (1.7 ms per case on 8 ranks, 3.7 ms under AddressSanitizer).
//
// run_batch(begin, end, at) runs cases [begin, end) on every rank, each rank keeping the
// index of the case it is in at at[rank], and throws RankFailure when a rank failed.
// run_case_batches runs cases [0, count), each batch ending at batch_end(begin). When a
// batch fails, on_failure(at, failure) reports it (at: where every rank was) and the
// next batch starts after the furthest case a rank reached. Stops after max_failures
// failed batches; returns how many failed.
int run_case_batches(int size, size_t count, const std::function<size_t(size_t)>& batch_end,
                     const std::function<void(size_t, size_t, std::vector<size_t>&)>& run_batch,
                     const std::function<void(const std::vector<size_t>&, const RankFailure&)>&
                         on_failure,
                     int max_failures);

// `size` ranks as threads over a fresh InMemoryStore: each thread creates its
// communicator with Communicator::create(store, rank, size, options) and runs body.
// Throws RankFailure if any rank failed.
void run_ranks(int size, const std::function<void(Communicator&)>& body,
               CommOptions options = test_options(), seconds deadline = kDefaultRankDeadline);

// A group of `size` communicators kept alive across many run() calls, so that a long
// list of cases pays for connecting the group once.
//
//   RankGroup group(size, options);
//   group.run([&](Communicator& c) { ... });   // once per case or per list of cases
//
// When a run fails, every communicator is aborted (the others would wait on the failed
// rank) and the next run() builds a fresh group first. Not thread-safe: call run() from
// one thread.
class RankGroup {
 public:
  explicit RankGroup(int size, CommOptions options = test_options());
  ~RankGroup();
  RankGroup(const RankGroup&) = delete;
  RankGroup& operator=(const RankGroup&) = delete;

  int size() const { return size_; }
  const CommOptions& options() const { return options_; }

  // Runs body on every rank (one thread each) and waits for all before `deadline`.
  // Throws RankFailure if any rank failed.
  void run(const std::function<void(Communicator&)>& body, seconds deadline = kDefaultRankDeadline);

  // The communicator of `rank` (valid until the next failed run()).
  Communicator& comm(int rank);

 private:
  void connect();
  void destroy();

  int size_;
  CommOptions options_;
  std::shared_ptr<InMemoryStore> store_;
  std::vector<std::shared_ptr<Communicator>> comms_;
};

// ---------------------------------------------------------------------------------
// Processes.

// A free TCP port on 127.0.0.1 at the time of the call (bound to port 0, then closed).
uint16_t pick_free_port();

// This machine's host name (as gethostname() reports it).
std::string this_hostname();

struct SpawnOptions {
  std::vector<std::string> args;               // argv[1..]
  std::map<std::string, std::string> env;      // set (overrides the inherited value)
  std::vector<std::string> unset_env;          // removed from the inherited environment
};

// One child process in its own process group, stdout and stderr captured to temporary
// files. The destructor kills the whole process group (SIGKILL) and reaps the child,
// so no process outlives its Subprocess. Methods are not thread-safe.
class Subprocess {
 public:
  // fork/exec `program`. Throws std::runtime_error when it cannot be started (an exec
  // failure shows as exit code 127 with the reason in stderr).
  Subprocess(const std::string& program, const SpawnOptions& options);
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }

  // Waits until the child exits or `timeout` passes. Returns whether it has exited.
  bool wait_for(milliseconds timeout);
  bool exited() const { return reaped_; }
  // When the exit was observed (steady clock); valid once exited().
  std::chrono::steady_clock::time_point exit_time() const { return exit_time_; }
  // Exit status, valid once exited(): exit_code() is -1 when killed by a signal.
  int exit_code() const;
  int term_signal() const;  // 0 when it exited normally
  std::string status_text() const;  // "exit code 3", "killed by signal 9", "running"

  // Sends `signal` to the child's whole process group.
  void kill_group(int signal = 9);
  // True while any process of the child's group is alive (or a zombie).
  bool group_alive() const;

  // Everything captured so far.
  std::string stdout_text() const;
  std::string stderr_text() const;
  std::string output_text() const { return stdout_text() + stderr_text(); }

  // Waits until stdout or stderr contains `needle` (true) or the child exits or
  // `timeout` passes (false).
  bool wait_for_output(const std::string& needle, milliseconds timeout);

 private:
  bool try_reap(int wait_flags);

  pid_t pid_ = -1;
  int pidfd_ = -1;
  bool reaped_ = false;
  int status_ = 0;
  std::chrono::steady_clock::time_point exit_time_{};
  std::string out_path_, err_path_;
};

// The direct children of process `pid` (from /proc/PID/task/*/children), in no
// particular order; empty when it has none or is gone.
std::vector<pid_t> child_pids(pid_t pid);

// The chorus shared-memory segments in /dev/shm created by any of `pids` (named
// chorus.<pid>.<random> after the rank that created them).
std::vector<std::string> shm_segments_of(const std::vector<pid_t>& pids);

// Runs `program` with `args` (a Subprocess, stdin from /dev/null) and waits up to
// `timeout`. Returns its exit code (-1 when it was killed by a signal or ran past the
// timeout, and was then killed); `output`, when given, receives its stdout and stderr.
int run_command(const std::string& program, const std::vector<std::string>& args,
                std::string* output = nullptr, milliseconds timeout = seconds(60));

}  // namespace chorus::test
