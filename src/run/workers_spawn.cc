// Starting the workers of a WorkerGroup (workers_impl.h): pipes that stay off fds
// 0..2, fork() with signals blocked, the child's way to exec (async-signal-safe calls
// only), and the check that a worker did start.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "run/workers_impl.h"

namespace chorus::run {
namespace {

// Bound for a child to exec (or report why it could not).
constexpr milliseconds kExecDeadline{30000};

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

}  // namespace

// ----- start -----

void WorkerGroup::Impl::start(const std::vector<WorkerSpec>& specs) {
  if (running() > 0)
    throw InvalidArgumentError("WorkerGroup::start: " + std::to_string(running()) +
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

// Forks and execs one worker and adds it to `workers`, so that a failure after fork()
// leaves the child to release_all().
void WorkerGroup::Impl::spawn(const WorkerSpec& spec, int dev_null) {
  if (spec.argv.empty())
    throw InvalidArgumentError("no program given for rank " + std::to_string(spec.rank));
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

void WorkerGroup::Impl::check_started(Worker& worker, const WorkerSpec& spec, int exec_errno) {
  std::string rank = std::to_string(spec.rank);
  if (exec_errno != 0)
    throw SystemError("cannot start '" + spec.argv[0] + "' for rank " + rank + ": " +
                      error_text(exec_errno));
  worker.pidfd = Fd(pidfd_open(worker.pid));
  if (!worker.pidfd.valid())
    throw SystemError("pidfd_open for rank " + rank + ": " + error_text(errno) +
                      " (Linux 5.3 or newer is needed)");
}

}  // namespace chorus::run
