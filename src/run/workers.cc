// WorkerGroup: fork/exec, one poll() loop over output pipes and pidfds, and process
// group kills.
//
// Exit statuses are collected with WNOWAIT when a worker's pidfd fires; the zombie is
// reaped only after its whole process group has been SIGKILLed (terminate(), the
// destructor, or the next start()). While the leader is a zombie its pid — which is
// also its process group id — cannot be reused, so kill(-pgid) never reaches a stranger
// even after the worker has exited; that is what lets us kill a worker's leftover
// grandchildren at the end.
#include "run/workers.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <system_error>
#include <thread>

#include "comm/common/deadline.h"
#include "comm/common/socket.h"

namespace chorus::run {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
using net::Fd;

// After a worker's pidfd fires, how long its pipes may stay open (a grandchild holding
// them) before the exit is reported anyway.
constexpr milliseconds kDrainAfterExit{200};
// A line with no newline for this long is passed on in pieces of this size.
constexpr size_t kMaxLineBytes = 64 * 1024;
constexpr size_t kReadBytes = 64 * 1024;
// Bound for processes that were sent SIGKILL to die and be reaped.
constexpr milliseconds kKilledDeadline{5000};
// Bound for a child to exec (or report why it could not).
constexpr milliseconds kExecDeadline{30000};
// A console that accepts nothing for this long loses the rest of the line batch, so that
// a stuck reader of chorusrun's output cannot stop the supervision.
constexpr milliseconds kConsoleStallDeadline{10000};

constexpr int kStdout = 0;
constexpr int kStderr = 1;

std::string error_text(int err) { return std::generic_category().message(err); }

// Pipes and /dev/null must not land on fds 0..2, or the child's dup2() onto 0..2 would
// clobber one of its own sources.
Fd above_stdio(int fd) {
  if (fd < 0 || fd > 2) return Fd(fd);
  int moved = fcntl(fd, F_DUPFD_CLOEXEC, 3);
  int err = errno;
  ::close(fd);
  if (moved < 0) {
    errno = err;
    net::throw_errno("fcntl(F_DUPFD_CLOEXEC)", errno);
  }
  return Fd(moved);
}

struct Pipe {
  Fd read_end;
  Fd write_end;
};

void set_nonblocking(int fd) {
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    net::throw_errno("fcntl(O_NONBLOCK)", errno);
  }
}

// The launcher's end does not block; the worker's end does (a worker writing faster
// than the launcher copies waits, as it would on a terminal).
Pipe make_pipe() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) net::throw_errno("pipe2", errno);
  Pipe p;
  p.read_end = above_stdio(fds[0]);
  p.write_end = above_stdio(fds[1]);
  set_nonblocking(p.read_end.get());
  return p;
}

// Writes all of `data`; waits (bounded) when `fd` is non-blocking and full. Output that
// cannot be written (closed console, full disk) is dropped: a worker's output must
// never stop the launcher from supervising.
void write_all(int fd, const std::string& data) {
  size_t done = 0;
  Deadline stall(kConsoleStallDeadline);
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
      stall = Deadline(kConsoleStallDeadline);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN && !stall.expired()) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, stall.remaining_ms());
    } else {
      return;
    }
  }
}

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

// Splits complete lines off the front of `u.partial`; more than kMaxLineBytes without a
// line end are passed on as a line of kMaxLineBytes. Empty status lines ("\r" before
// the text, as some bars draw) are dropped.
std::vector<Line> take_lines(Unsplit& u) {
  std::vector<Line> lines;
  std::string& partial = u.partial;
  size_t start = 0;
  if (u.after_cr && !partial.empty()) {
    u.after_cr = false;
    if (partial[0] == '\n') {
      lines.push_back({std::move(u.cr_text), false});
      start = 1;
    }
  }
  while (true) {
    size_t end = partial.find_first_of("\r\n", start);
    size_t limit = start + kMaxLineBytes;
    if (end != std::string::npos && end <= limit) {
      std::string text = partial.substr(start, end - start);
      if (partial[end] == '\n' || (end + 1 < partial.size() && partial[end + 1] == '\n')) {
        lines.push_back({std::move(text), false});
        start = end + (partial[end] == '\n' ? 1 : 2);
        continue;
      }
      if (end + 1 == partial.size()) {  // a lone '\r' so far
        u.after_cr = true;
        u.cr_text = text;
      }
      if (!text.empty()) lines.push_back({std::move(text), true});
      start = end + 1;
    } else if (partial.size() > limit) {
      lines.push_back({partial.substr(start, kMaxLineBytes), false});
      start = limit;
    } else {
      break;
    }
  }
  partial.erase(0, start);
  return lines;
}

// Clears a terminal's current line (the cursor goes to its start).
constexpr const char* kClearLine = "\r\x1b[K";

pid_t pidfd_open(pid_t pid) { return static_cast<pid_t>(syscall(SYS_pidfd_open, pid, 0)); }

// ----- the child side of fork(): async-signal-safe calls only -----

// Everything the child needs, built before fork() because the child of a multithreaded
// process must not allocate.
struct ExecPlan {
  std::vector<std::string> argv_storage;
  std::vector<std::string> env_storage;
  std::vector<char*> argv;
  std::vector<char*> envp;
  int stdin_fd = -1;
  int stdout_fd = -1;
  int stderr_fd = -1;
  int error_fd = -1;  // CLOEXEC pipe: receives errno when exec fails
  pid_t launcher = 0;
  int max_fd = 0;  // for the close_range() fallback
  CpuMask cpus;  // WorkerSpec::cpus
};

ExecPlan make_plan(const WorkerSpec& spec) {
  ExecPlan plan;
  plan.argv_storage = spec.argv;
  for (const auto& [name, value] : spec.env) plan.env_storage.push_back(name + "=" + value);
  for (auto& arg : plan.argv_storage) plan.argv.push_back(arg.data());
  for (auto& entry : plan.env_storage) plan.envp.push_back(entry.data());
  plan.argv.push_back(nullptr);
  plan.envp.push_back(nullptr);
  plan.launcher = getpid();
  plan.cpus = CpuMask(spec.cpus);
  rlimit limit{};
  plan.max_fd = getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY
                    ? static_cast<int>(std::min<rlim_t>(limit.rlim_cur, 1 << 20))
                    : 1 << 16;
  return plan;
}

[[noreturn]] void child_fail(const ExecPlan& plan, int err) {
  ssize_t ignored = ::write(plan.error_fd, &err, sizeof err);
  (void)ignored;
  _exit(127);
}

// Ignored signals and the signal mask survive exec, so the worker would inherit the
// launcher's; handlers are reset by exec, but one could run in the child before it.
void reset_signals() {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) sigaction(sig, &dfl, nullptr);  // fails for KILL/STOP
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
}

// Descriptors above 2 close at exec; the error pipe stays usable until then.
void close_other_fds(const ExecPlan& plan) {
  if (close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) == 0) return;
  for (int fd = 3; fd < plan.max_fd; ++fd) fcntl(fd, F_SETFD, FD_CLOEXEC);
}

[[noreturn]] void exec_worker(const ExecPlan& plan) {
  setpgid(0, 0);
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) child_fail(plan, errno);
  // The launcher may have died before prctl(): then no signal would ever come.
  if (getppid() != plan.launcher) _exit(127);
  if (dup2(plan.stdin_fd, 0) < 0 || dup2(plan.stdout_fd, 1) < 0 || dup2(plan.stderr_fd, 2) < 0)
    child_fail(plan, errno);
  close_other_fds(plan);
  plan.cpus.apply();
  reset_signals();  // last: signals were blocked by the parent around fork()
  execvpe(plan.argv[0], plan.argv.data(), plan.envp.data());
  child_fail(plan, errno);
}

// Blocks every signal while forking, so that no launcher signal handler runs in the
// child before reset_signals(); a signal sent to the new group stays pending until then.
pid_t fork_with_signals_blocked() {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pid_t pid = fork();
  int err = errno;
  if (pid != 0) pthread_sigmask(SIG_SETMASK, &old, nullptr);
  errno = err;
  return pid;
}

// errno sent by a child whose exec failed, or 0 once exec closed the pipe.
int read_exec_error(int error_fd) {
  Deadline deadline(kExecDeadline);
  while (true) {
    pollfd p{error_fd, POLLIN, 0};
    int ready = ::poll(&p, 1, deadline.remaining_ms());
    if (ready == 0) return 0;  // still exec'ing: its pidfd will tell what happens
    if (ready < 0 && errno == EINTR) continue;
    int err = 0;
    ssize_t n = ::read(error_fd, &err, sizeof err);
    if (n < 0 && errno == EINTR) continue;
    return n == static_cast<ssize_t>(sizeof err) ? err : 0;
  }
}

// Reaps the group's leader and — where this process is their subreaper
// (PR_SET_CHILD_SUBREAPER) — its orphaned members, waiting for ones that are dying.
// The group must have been sent SIGKILL.
void reap_group(pid_t pgid, const Deadline& deadline) {
  while (true) {
    siginfo_t info{};
    if (waitid(P_PGID, static_cast<id_t>(pgid), &info, WEXITED | WNOHANG) != 0) {
      if (errno == EINTR) continue;
      return;  // ECHILD: no child of ours is left in the group
    }
    if (info.si_pid != 0) continue;
    if (deadline.expired()) return;
    std::this_thread::sleep_for(milliseconds(1));  // SIGKILL takes effect asynchronously
  }
}

WorkerExit exit_from(const siginfo_t& info) {
  WorkerExit exit;
  exit.pid = info.si_pid;
  if (info.si_code == CLD_EXITED) {
    exit.exit_code = info.si_status;
  } else {
    exit.signal = info.si_status;  // CLD_KILLED or CLD_DUMPED
  }
  exit.when = std::chrono::system_clock::now();
  return exit;
}

}  // namespace

// ----- WorkerExit, signal_name -----

std::string WorkerExit::describe() const {
  if (signal != 0) return "signal " + std::to_string(signal) + " (" + signal_name(signal) + ")";
  return "exit code " + std::to_string(exit_code);
}

std::string signal_name(int signal) {
  const char* abbrev = signal > 0 ? sigabbrev_np(signal) : nullptr;
  if (abbrev == nullptr) return "signal " + std::to_string(signal);
  return std::string("SIG") + abbrev;
}

// ----- WorkerGroup -----

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
      throw std::invalid_argument("output redirects need a log directory");
  }

  static bool alive(const Worker& w) {
    return w.state == State::kRunning || w.state == State::kExited;
  }

  // ----- start -----

  void start(const std::vector<WorkerSpec>& specs) {
    if (running() > 0)
      throw std::logic_error("WorkerGroup::start: " + std::to_string(running()) +
                             " workers of the previous start are still running");
    release_all();  // leftovers (grandchildren) of a previous start must not survive it
    exits.clear();
    if (!options.log_dir.empty()) make_log_dir();
    try {
      Fd dev_null = above_stdio(::open("/dev/null", O_RDONLY | O_CLOEXEC));
      if (!dev_null.valid()) net::throw_errno("open /dev/null", errno);
      for (const auto& spec : specs) spawn(spec, dev_null.get());
    } catch (...) {
      release_all();
      throw;
    }
  }

  void make_log_dir() {
    std::error_code error;
    std::filesystem::create_directories(options.log_dir, error);
    if (error)
      throw std::runtime_error("cannot create log directory '" + options.log_dir +
                               "': " + error.message());
  }

  Fd open_log(int rank, int stream) {
    if (options.log_dir.empty()) return Fd();
    std::string path = options.log_dir + "/rank_" + std::to_string(rank) +
                       (stream == kStdout ? ".stdout.log" : ".stderr.log");
    Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
    if (!fd.valid())
      throw std::runtime_error("cannot open log file '" + path + "': " + error_text(errno));
    return fd;
  }

  // Forks and execs one worker and adds it to `workers`, so that a failure after fork()
  // leaves the child to release_all().
  void spawn(const WorkerSpec& spec, int dev_null) {
    if (spec.argv.empty())
      throw std::invalid_argument("no program given for rank " + std::to_string(spec.rank));
    auto worker = std::make_unique<Worker>();
    worker->rank = spec.rank;
    worker->local_rank = spec.local_rank;
    for (int stream : {kStdout, kStderr}) worker->outputs[stream].log = open_log(spec.rank, stream);
    Pipe out = make_pipe(), err = make_pipe(), exec_error = make_pipe();
    ExecPlan plan = make_plan(spec);
    plan.stdin_fd = dev_null;
    plan.stdout_fd = out.write_end.get();
    plan.stderr_fd = err.write_end.get();
    plan.error_fd = exec_error.write_end.get();

    pid_t pid = fork_with_signals_blocked();
    if (pid < 0) net::throw_errno("fork", errno);
    if (pid == 0) exec_worker(plan);
    setpgid(pid, pid);  // both sides do it, so that the group exists before either goes on
    worker->pid = pid;
    worker->outputs[kStdout].pipe = std::move(out.read_end);
    worker->outputs[kStderr].pipe = std::move(err.read_end);
    Worker& started = *workers.emplace_back(std::move(worker));
    out.write_end.reset();
    err.write_end.reset();
    exec_error.write_end.reset();
    check_started(started, spec, read_exec_error(exec_error.read_end.get()));
  }

  void check_started(Worker& worker, const WorkerSpec& spec, int exec_errno) {
    std::string rank = std::to_string(spec.rank);
    if (exec_errno != 0)
      throw std::runtime_error("cannot start '" + spec.argv[0] + "' for rank " + rank + ": " +
                               error_text(exec_errno));
    worker.pidfd = Fd(pidfd_open(worker.pid));
    if (!worker.pidfd.valid())
      throw std::runtime_error("pidfd_open for rank " + rank + ": " + error_text(errno) +
                               " (Linux 5.3 or newer is needed)");
  }

  // ----- poll -----

  std::vector<WorkerExit> poll(milliseconds max_wait, int wake_fd) {
    Deadline deadline(max_wait);
    std::vector<WorkerExit> seen;
    bool woken = false;
    do {
      woken = wait_and_dispatch(next_wakeup(deadline), wake_fd);
      report_finished(seen);
    } while (seen.empty() && !woken && !deadline.expired());
    return seen;
  }

  // The caller's deadline, or earlier when a draining worker's time runs out.
  Deadline next_wakeup(const Deadline& deadline) const {
    Deadline next = deadline;
    for (const auto& w : workers)
      if (w->state == State::kExited) next = next.earlier(Deadline::at(w->drain_until));
    return next;
  }

  // One poll() over every open pipe, armed pidfd and wake_fd. Returns whether wake_fd
  // became readable.
  bool wait_and_dispatch(const Deadline& until, int wake_fd) {
    std::vector<pollfd> fds;
    std::vector<Source> sources;
    for (const auto& w : workers) {
      for (int stream : {kStdout, kStderr}) {
        if (!w->outputs[stream].pipe.valid()) continue;
        fds.push_back({w->outputs[stream].pipe.get(), POLLIN, 0});
        sources.push_back({w.get(), stream});
      }
      if (w->state == State::kRunning) {
        fds.push_back({w->pidfd.get(), POLLIN, 0});
        sources.push_back({w.get(), kPidfd});
      }
    }
    if (wake_fd >= 0) {
      fds.push_back({wake_fd, POLLIN, 0});
      sources.push_back({nullptr, 0});
    }
    int ready = ::poll(fds.data(), fds.size(), until.remaining_ms());
    if (ready < 0 && errno != EINTR) net::throw_errno("poll", errno);
    bool woken = false;
    for (size_t i = 0; ready > 0 && i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      const Source& source = sources[i];
      if (source.worker == nullptr) {
        woken = true;
      } else if (source.stream == kPidfd) {
        notice_exit(*source.worker);
      } else {
        read_output(*source.worker, source.stream);
      }
    }
    return woken;
  }

  void read_output(Worker& w, int stream) {
    Output& output = w.outputs[stream];
    ssize_t n = ::read(output.pipe.get(), read_buffer.data(), read_buffer.size());
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n > 0) {
      output.unsplit.partial.append(read_buffer.data(), static_cast<size_t>(n));
      emit(w, stream, take_lines(output.unsplit));
      return;
    }
    close_output(w, stream);  // EOF (or a broken pipe)
  }

  // Closes a worker's pipe, passing on its unterminated last line.
  void close_output(Worker& w, int stream) {
    flush_partial(w, stream);
    w.outputs[stream].pipe.reset();
  }

  // Console copy (prefixed when tee'd, none when redirected), log copy, and last lines.
  // Status lines go to a terminal console only, where they replace the shown one; other
  // lines clear the shown status, scroll above it, and redraw it, except the owner's,
  // which ends it (an empty line keeps it as it is; another takes its place).
  void emit(Worker& w, int stream, const std::vector<Line>& lines) {
    if (lines.empty()) return;
    const bool to_console = !contains(options.redirects, stream);
    const bool terminal = to_console && contains(options.terminals, stream);
    std::string prefix =
        contains(options.tee, stream) ? "[rank " + std::to_string(w.rank) + "]: " : "";
    std::string console, log;
    bool hidden = false;  // the shown status (of this stream) is cleared in `console`
    for (const auto& line : lines) {
      if (line.status) {
        if (!terminal) continue;
        if (shown.owner != nullptr && shown.stream != stream) end_status();
        console.append(kClearLine).append(prefix).append(line.text).append("\x1b[K");
        shown = {&w, stream, prefix + line.text};
        hidden = false;
        continue;
      }
      if (to_console) {
        if (shown.owner == &w && shown.stream == stream) {
          if (line.text.empty()) {
            console.push_back('\n');
          } else {
            console.append(kClearLine).append(prefix).append(line.text).push_back('\n');
          }
          shown = {};
          hidden = false;
        } else {
          if (shown.owner != nullptr && shown.stream == stream && !hidden) {
            console.append(kClearLine);
            hidden = true;
          }
          console.append(prefix).append(line.text).push_back('\n');
        }
      }
      if (w.outputs[stream].log.valid()) log.append(line.text).push_back('\n');
      remember(w, line.text);
    }
    if (hidden) console.append(shown.text).append("\x1b[K");
    if (!console.empty()) write_console(stream, console);
    if (!log.empty()) write_all(w.outputs[stream].log.get(), log);
  }

  static int console_fd(int stream) { return stream == kStdout ? STDOUT_FILENO : STDERR_FILENO; }

  // Writes to a console stream. A status shown by the other stream on the same terminal
  // is cleared first and redrawn after.
  void write_console(int stream, const std::string& text) {
    const bool other_shown = shown.owner != nullptr && shown.stream != stream &&
                             contains(options.terminals, stream);
    if (other_shown) write_all(console_fd(shown.stream), kClearLine);
    write_all(console_fd(stream), text);
    if (other_shown) write_all(console_fd(shown.stream), shown.text + "\x1b[K");
  }

  // The shown status stays on the terminal as it is; what follows starts below it.
  void end_status() {
    if (shown.owner == nullptr) return;
    write_all(console_fd(shown.stream), "\n");
    shown = {};
  }

  void remember(Worker& w, const std::string& line) {
    if (options.last_lines == 0) return;
    w.last_lines.push_back(line);
    while (w.last_lines.size() > options.last_lines) w.last_lines.pop_front();
  }

  // The pidfd fired: take the status but leave the zombie (see the top of this file).
  void notice_exit(Worker& w) {
    siginfo_t info{};
    if (waitid(P_PID, static_cast<id_t>(w.pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
      if (errno == EINTR) return;
      // Someone else reaped it (SIGCHLD ignored, or a waitpid(-1) elsewhere): the status
      // is lost, but the exit must still be reported, and the pidfd disarmed.
      info.si_pid = w.pid;
      info.si_code = CLD_EXITED;
      info.si_status = -1;
      w.group_owned = false;  // its pid may be reused: never signal that group again
    } else if (info.si_pid == 0) {
      return;
    }
    w.exit = exit_from(info);
    w.exit.rank = w.rank;
    w.exit.local_rank = w.local_rank;
    w.state = State::kExited;
    w.drain_until = Clock::now() + kDrainAfterExit;
    w.pidfd.reset();
  }

  // Reports exited workers whose output has ended, or whose drain time is over (a
  // grandchild may hold the pipes open; what it writes later still goes to the console
  // and logs).
  void report_finished(std::vector<WorkerExit>& seen) {
    for (auto& w : workers) {
      if (w->state != State::kExited) continue;
      bool output_ended = !w->outputs[kStdout].pipe.valid() && !w->outputs[kStderr].pipe.valid();
      if (!output_ended && Clock::now() < w->drain_until) continue;
      for (int stream : {kStdout, kStderr}) flush_partial(*w, stream);
      w->exit.last_lines.assign(w->last_lines.begin(), w->last_lines.end());
      w->state = State::kReported;
      exits.push_back(w->exit);
      seen.push_back(w->exit);
    }
  }

  void flush_partial(Worker& w, int stream) {
    Unsplit& u = w.outputs[stream].unsplit;
    u.after_cr = false;
    if (!u.partial.empty()) emit(w, stream, {{std::move(u.partial), false}});
    u.partial.clear();
    // A worker whose output ended leaves its status on the terminal, finished.
    if (shown.owner == &w && shown.stream == stream) end_status();
  }

  // ----- signals, termination, cleanup -----

  int running() const {
    return static_cast<int>(
        std::count_if(workers.begin(), workers.end(), [](const auto& w) { return alive(*w); }));
  }

  void signal_running(int signal) {
    for (const auto& w : workers)
      if (alive(*w) && w->group_owned) kill(-w->pid, signal);
  }

  // Every group we still own, including those whose leader has exited (grandchildren).
  void kill_all_groups() {
    for (const auto& w : workers)
      if (w->state != State::kReaped && w->group_owned) kill(-w->pid, SIGKILL);
  }

  void pump_until_all_reported(const Deadline& deadline, std::vector<WorkerExit>& seen) {
    while (running() > 0 && !deadline.expired()) {
      for (auto& exit : poll(deadline.remaining(), -1)) seen.push_back(std::move(exit));
    }
  }

  std::vector<WorkerExit> terminate(milliseconds grace) {
    std::vector<WorkerExit> seen;
    signal_running(SIGTERM);
    pump_until_all_reported(Deadline(grace), seen);
    kill_all_groups();
    pump_until_all_reported(Deadline(kKilledDeadline), seen);
    reap_reported();
    return seen;
  }

  // Reaps the groups of reported workers; their groups must have been sent SIGKILL.
  void reap_reported() {
    Deadline deadline(kKilledDeadline);
    for (auto& w : workers) {
      if (w->state != State::kReported) continue;
      if (w->group_owned) reap_group(w->pid, deadline);
      w->state = State::kReaped;
      w->pidfd.reset();
      for (auto& output : w->outputs) {
        output.pipe.reset();
        output.log.reset();
      }
    }
  }

  // Kills and reaps every group without reporting anything; drops all workers.
  void release_all() {
    kill_all_groups();
    Deadline deadline(kKilledDeadline);
    for (const auto& w : workers)
      if (w->state != State::kReaped && w->group_owned) reap_group(w->pid, deadline);
    end_status();
    workers.clear();
  }

  // Output still in flight is copied out before the workers are dropped.
  void shut_down() {
    kill_all_groups();
    std::vector<WorkerExit> ignored;
    pump_until_all_reported(Deadline(kKilledDeadline), ignored);
    release_all();
  }
};

WorkerGroup::WorkerGroup(OutputOptions output) : impl_(std::make_unique<Impl>(std::move(output))) {}

WorkerGroup::~WorkerGroup() {
  try {
    impl_->shut_down();
  } catch (...) {
    impl_->release_all();  // poll() failed: still kill and reap, without the output
  }
}

void WorkerGroup::start(const std::vector<WorkerSpec>& specs) { impl_->start(specs); }

std::vector<WorkerExit> WorkerGroup::poll(std::chrono::milliseconds max_wait, int wake_fd) {
  return impl_->poll(max_wait, wake_fd);
}

int WorkerGroup::running() const { return impl_->running(); }

void WorkerGroup::signal_all(int signal) { impl_->signal_running(signal); }

std::vector<WorkerExit> WorkerGroup::terminate(std::chrono::milliseconds grace) {
  return impl_->terminate(grace);
}

const std::vector<WorkerExit>& WorkerGroup::exits() const { return impl_->exits; }

std::vector<pid_t> WorkerGroup::pids() const {
  std::vector<pid_t> pids;
  for (const auto& w : impl_->workers)
    if (Impl::alive(*w)) pids.push_back(w->pid);
  return pids;
}

}  // namespace chorus::run
