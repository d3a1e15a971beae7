// WorkerGroup::Impl, the state behind a WorkerGroup (workers.h). Internal to src/run/:
// only the src/run/workers*.cc files include it.
//
// One struct, its members defined in four files by concern:
// - workers.cc: the poll() loop over output pipes and pidfds, and WorkerGroup's own
//   members;
// - workers_spawn.cc: starting workers: fork/exec (the child side, async-signal-safe
//   calls only), pipes, and the check that a worker did start;
// - workers_output.cc: where a worker's output goes: split into lines, copied to the
//   console (status lines redrawn in place on a terminal), to the per-rank log files,
//   and kept as the last lines for reports;
// - workers_reap.cc: exits, signals, termination, and reaping process groups.
#pragma once

#include <sys/types.h>

#include <array>
#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "chorus/error.h"
#include "comm/common/deadline.h"
#include "comm/common/socket.h"
#include "run/workers.h"

namespace chorus::run {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
using net::Fd;

constexpr size_t kReadBytes = 64 * 1024;

constexpr int kStdout = 0;
constexpr int kStderr = 1;

inline std::string error_text(int err) { return std::generic_category().message(err); }

// A line of a worker's output: ended by '\n' (or "\r\n"), or a status line ended by a
// lone '\r' (a progress bar's redraw; OutputOptions::terminals).
struct Line {
  std::string text;
  bool status = false;
};

// What is left of a worker stream's output between reads.
struct Unsplit {
  std::string partial;  // bytes after the last line end
  // The previous read ended with '\r': the status line it ended (`cr_text`) was really
  // a "\r\n" line if the next read starts with '\n'.
  bool after_cr = false;
  std::string cr_text;
};

struct WorkerGroup::Impl {
  enum class State {
    kRunning,   // pidfd armed
    kExited,    // status collected, output still draining
    kReported,  // exit returned by poll(); zombie kept so its pgid stays ours
    kReaped,    // group killed and reaped; nothing left to do
  };

  struct Output {
    Fd pipe;         // non-blocking read end; closed at EOF
    Fd log;          // append-mode log file, or closed when there is no log_dir
    Unsplit unsplit;  // bytes after the last line end
  };

  struct Worker {
    int rank = 0;
    int local_rank = 0;
    pid_t pid = 0;  // also the process group id
    Fd pidfd;
    std::array<Output, 2> outputs;  // kStdout, kStderr
    std::deque<std::string> last_lines;
    State state = State::kRunning;
    bool group_owned = true;  // false once the leader was reaped behind our back
    WorkerExit exit;
    Clock::time_point drain_until;
  };

  // What a ready poll() entry belongs to.
  struct Source {
    Worker* worker;  // nullptr: wake_fd
    int stream;      // kStdout, kStderr, or kPidfd
  };
  static constexpr int kPidfd = 2;

  // The status line shown on a terminal console's last line (one for the terminal:
  // stdout and stderr are usually the same one), with its prefix; owner null: none.
  struct Shown {
    const Worker* owner = nullptr;
    int stream = kStdout;
    std::string text;
  } shown;

  OutputOptions options;
  std::vector<std::unique_ptr<Worker>> workers;
  std::vector<WorkerExit> exits;
  std::vector<char> read_buffer = std::vector<char>(kReadBytes);

  explicit Impl(OutputOptions o) : options(std::move(o)) {
    if (options.redirects != Streams::kNone && options.log_dir.empty())
      throw InvalidArgumentError("output redirects need a log directory");
  }

  static bool alive(const Worker& w) {
    return w.state == State::kRunning || w.state == State::kExited;
  }

  // ----- start (workers_spawn.cc) -----
  void start(const std::vector<WorkerSpec>& specs);
  void spawn(const WorkerSpec& spec, int dev_null);
  void check_started(Worker& worker, const WorkerSpec& spec, int exec_errno);

  // ----- poll (workers.cc) -----
  std::vector<WorkerExit> poll(milliseconds max_wait, int wake_fd);
  Deadline next_wakeup(const Deadline& deadline) const;
  bool wait_and_dispatch(const Deadline& until, int wake_fd);

  // ----- output and log files (workers_output.cc) -----
  void make_log_dir();
  Fd open_log(int rank, int stream);
  void read_output(Worker& w, int stream);
  void close_output(Worker& w, int stream);
  void emit(Worker& w, int stream, const std::vector<Line>& lines);
  static int console_fd(int stream);
  void write_console(int stream, const std::string& text);
  void end_status();
  void remember(Worker& w, const std::string& line);
  void flush_partial(Worker& w, int stream);

  // ----- exits, signals, termination, cleanup (workers_reap.cc) -----
  void notice_exit(Worker& w);
  void report_finished(std::vector<WorkerExit>& seen);
  int running() const;
  void signal_running(int signal);
  void kill_all_groups();
  void pump_until_all_reported(const Deadline& deadline, std::vector<WorkerExit>& seen);
  std::vector<WorkerExit> terminate(milliseconds grace);
  void reap_reported();
  void release_all();
  void shut_down();
};

}  // namespace chorus::run
