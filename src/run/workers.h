// The workers of one node: started, watched, signalled and reaped by the launcher.
//
// Every worker is its own process group (so a signal reaches the worker and whatever
// it started) and is killed by the kernel if the launcher dies (PR_SET_PDEATHSIG).
// Its stdout and stderr go through pipes to the launcher, which copies them to its own
// stdout/stderr (with a "[rank N]: " prefix when tee is asked for), to per-rank log
// files when a log directory is given, and keeps the last lines for failure reports.
// Status lines (ended by '\r', see OutputOptions::terminals) are redrawn in place when
// the console is a terminal, as they would be without the launcher in between.
//
// Threading: one thread drives a WorkerGroup. Not copyable. That thread must outlive
// the workers: PR_SET_PDEATHSIG fires when the thread that forked a worker exits, not
// only when the launcher process does.
//
// Reaping: the group reaps its own workers; the process must not reap them behind its
// back (SIGCHLD set to SIG_IGN, waitpid(-1) elsewhere). An exited worker stays a zombie
// until terminate(), the next start() or the destructor kills its process group, so that
// its group id cannot be reused meanwhile. Orphaned grandchildren are reaped there too
// when the process is a child subreaper (prctl(PR_SET_CHILD_SUBREAPER)), as chorusrun
// should be: otherwise their zombies stay in the process group under an init that does
// not reap them.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "run/options.h"

namespace chorus::run {

struct WorkerSpec {
  int rank = 0;        // global rank (for prefixes and reports)
  int local_rank = 0;
  std::vector<std::string> argv;             // argv[0] is the program (PATH is searched)
  std::map<std::string, std::string> env;    // complete environment of the worker
  // CPUs the worker is bound to (set before exec, inherited by its threads); empty: the
  // launcher's affinity. A binding the kernel refuses (a CPU gone from the launcher's
  // cpuset meanwhile) is skipped: it only helps speed.
  std::vector<int> cpus;
};

struct OutputOptions {
  Streams tee = Streams::kNone;        // console lines of these streams get "[rank N]: "
  Streams redirects = Streams::kNone;  // these streams go to log files only
  std::string log_dir;                 // empty: no log files; else <log_dir>/rank_<N>.{stdout,stderr}.log
  size_t last_lines = 20;              // kept per worker for reports
  // Console streams that are terminals (chorusrun: isatty). On these, a worker's status
  // lines (text ended by a lone '\r', as progress bars write) are shown in place on the
  // terminal's last line, and other lines scroll above them. Elsewhere, and in log files
  // and reports, status lines are dropped; the line a bar ends with '\n' is kept.
  Streams terminals = Streams::kNone;
};

struct WorkerExit {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = 0;
  int exit_code = 0;   // valid when signal == 0
  int signal = 0;      // the terminating signal, 0 for a normal exit
  std::chrono::system_clock::time_point when;
  std::vector<std::string> last_lines;  // last output lines (stdout and stderr merged)

  bool failed() const { return signal != 0 || exit_code != 0; }
  // chorusrun's exit code for this worker: its exit code, or 128 + signal.
  int status_code() const { return signal != 0 ? 128 + signal : exit_code; }
  // "exit code 3" or "signal 9 (SIGKILL)".
  std::string describe() const;
};

class WorkerGroup {
 public:
  // Throws InvalidArgumentError when `output` redirects a stream without a log_dir.
  explicit WorkerGroup(OutputOptions output);
  ~WorkerGroup();  // kills (SIGKILL) and reaps every worker still running
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // Starts every worker. Throws SystemError naming the program when one cannot be
  // started, or its log directory or files cannot be made (the ones already started are killed
  // first). Log files are opened for append, so a restarted group adds to them. Throws
  // InvalidArgumentError for a spec without a program, and while workers of the
  // previous start are running; what is left of their process groups is killed.
  // exits() starts empty again.
  void start(const std::vector<WorkerSpec>& specs);

  // Copies output and reaps exited workers for up to `max_wait`, returning early when a
  // worker exits or `wake_fd` (if >= 0) becomes readable (it is not read). Returns the
  // exits seen in this call, in the order they were reaped. An exit is reported once the
  // worker's pipes are closed, or 200 ms after it exited when something it started
  // still holds them, so its last lines are in the report.
  std::vector<WorkerExit> poll(std::chrono::milliseconds max_wait, int wake_fd = -1);

  // Number of workers not yet reaped.
  int running() const;

  // Sends `signal` to every running worker's process group.
  void signal_all(int signal);

  // SIGTERM to all, then keeps pumping output and reaping until all have exited or
  // `grace` has passed; then SIGKILL to the rest and reap them. Returns the exits seen.
  std::vector<WorkerExit> terminate(std::chrono::milliseconds grace);

  // Every exit seen so far since start().
  const std::vector<WorkerExit>& exits() const;

  // Process ids and process group ids of the running workers (for tests/diagnostics).
  std::vector<pid_t> pids() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// "SIGTERM", "SIGKILL", ... or "signal N".
std::string signal_name(int signal);

}  // namespace chorus::run
