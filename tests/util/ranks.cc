#include "util/ranks.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "chorus/error.h"

extern char** environ;

namespace chorus::test {

CommOptions test_options() {
  CommOptions options = CommOptions::from_env();
  options.timeout = std::chrono::seconds(120);
  options.connect_timeout = std::chrono::seconds(60);
  options.listen_address = "127.0.0.1";
  return options;
}

bool direct_shm(const CommOptions& o) {
  return o.transport != TransportKind::kTcp &&
         (o.algorithm == Algorithm::kAuto || o.algorithm == Algorithm::kShmDirect ||
          o.algorithm == Algorithm::kHierarchical);
}

std::string describe(const std::exception_ptr& error) {
  if (!error) return "<no error>";
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    return std::string("chorus::Error (") + error_kind_name(e.kind()) + "): " + e.what();
  } catch (const std::exception& e) {
    return std::string("std::exception: ") + e.what();
  } catch (...) {
    return "unknown exception";
  }
}

namespace {

bool is_aborted_error(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    return e.kind() == ErrorKind::kAborted;
  } catch (...) {
    return false;
  }
}

// Completion bookkeeping shared with the rank threads. Held by shared_ptr so that a
// thread still running when the harness gives up never touches freed memory.
struct JoinState {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<bool> done;
  int remaining = 0;
  std::vector<std::exception_ptr> errors;
};

}  // namespace

std::vector<std::exception_ptr> run_threads(int size, const std::function<void(int)>& fn,
                                            seconds deadline,
                                            const std::function<void(int)>& on_failure) {
  auto state = std::make_shared<JoinState>();
  state->done.assign(size, false);
  state->remaining = size;
  state->errors.assign(size, nullptr);

  std::vector<std::thread> threads;
  threads.reserve(size);
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([state, rank, &fn, &on_failure] {
      std::exception_ptr error;
      try {
        fn(rank);
      } catch (...) {
        error = std::current_exception();
      }
      if (error && on_failure) {
        try {
          on_failure(rank);
        } catch (...) {
          // Best effort: the original failure is what gets reported.
        }
      }
      std::lock_guard<std::mutex> lock(state->mu);
      state->errors[rank] = error;
      state->done[rank] = true;
      if (--state->remaining == 0) state->cv.notify_all();
    });
  }

  std::unique_lock<std::mutex> lock(state->mu);
  if (!state->cv.wait_for(lock, deadline, [&] { return state->remaining == 0; })) {
    std::ostringstream stuck;
    for (int rank = 0; rank < size; ++rank) {
      if (!state->done[rank]) stuck << " " << rank;
    }
    std::fprintf(stderr,
                 "\n*** chorus test harness: rank threads still running after %lld s "
                 "(stuck ranks:%s of %d). A stuck thread cannot be joined; aborting.\n",
                 static_cast<long long>(deadline.count()), stuck.str().c_str(), size);
    for (int rank = 0; rank < size; ++rank) {
      if (state->done[rank] && state->errors[rank]) {
        std::fprintf(stderr, "  rank %d failed: %s\n", rank,
                     describe(state->errors[rank]).c_str());
      }
    }
    std::fflush(stderr);
    std::abort();
  }
  lock.unlock();
  for (std::thread& t : threads) t.join();
  return state->errors;
}

int run_case_batches(int size, size_t count, const std::function<size_t(size_t)>& batch_end,
                     const std::function<void(size_t, size_t, std::vector<size_t>&)>& run_batch,
                     const std::function<void(const std::vector<size_t>&, const RankFailure&)>&
                         on_failure,
                     int max_failures) {
  int failures = 0;
  size_t begin = 0;
  while (begin < count && failures < max_failures) {
    const size_t end = batch_end(begin);
    std::vector<size_t> at(size, begin);
    try {
      run_batch(begin, end, at);
      begin = end;
    } catch (const RankFailure& failure) {
      on_failure(at, failure);
      ++failures;
      begin = *std::max_element(at.begin(), at.end()) + 1;
    }
  }
  return failures;
}

void rethrow_rank_failures(const std::vector<std::exception_ptr>& errors) {
  std::ostringstream roots, aborted;
  int failed = 0;
  for (size_t rank = 0; rank < errors.size(); ++rank) {
    if (!errors[rank]) continue;
    ++failed;
    std::ostringstream& out = is_aborted_error(errors[rank]) ? aborted : roots;
    out << "\n  rank " << rank << ": " << describe(errors[rank]);
  }
  if (failed == 0) return;
  throw RankFailure(std::to_string(failed) + " of " + std::to_string(errors.size()) +
                    " ranks failed:" + roots.str() + aborted.str());
}

void run_ranks(int size, const std::function<void(Communicator&)>& body, CommOptions options,
               seconds deadline) {
  auto store = std::make_shared<InMemoryStore>();
  std::vector<std::shared_ptr<Communicator>> comms(size);
  std::mutex comms_mu;
  auto abort_others = [&](int failed_rank) {
    std::lock_guard<std::mutex> lock(comms_mu);
    for (int rank = 0; rank < size; ++rank) {
      if (rank != failed_rank && comms[rank]) {
        comms[rank]->abort("test harness: rank " + std::to_string(failed_rank) + " failed");
      }
    }
  };
  auto errors = run_threads(
      size,
      [&](int rank) {
        auto comm = Communicator::create(store, rank, size, options);
        {
          std::lock_guard<std::mutex> lock(comms_mu);
          comms[rank] = comm;
        }
        body(*comm);
      },
      deadline, abort_others);
  // Communicators may take part in a collective shutdown: release them all at once.
  run_threads(size, [&](int rank) { comms[rank].reset(); }, seconds(60));
  rethrow_rank_failures(errors);
}

RankGroup::RankGroup(int size, CommOptions options) : size_(size), options_(std::move(options)) {
  connect();
}

RankGroup::~RankGroup() { destroy(); }

void RankGroup::connect() {
  store_ = std::make_shared<InMemoryStore>();
  comms_.assign(size_, nullptr);
  auto errors = run_threads(size_, [&](int rank) {
    comms_[rank] = Communicator::create(store_, rank, size_, options_);
  });
  for (const auto& error : errors) {
    if (error) {
      destroy();
      rethrow_rank_failures(errors);
    }
  }
}

void RankGroup::destroy() {
  if (comms_.empty()) return;
  run_threads(size_, [&](int rank) { comms_[rank].reset(); }, seconds(60));
  comms_.clear();
  store_.reset();
}

void RankGroup::run(const std::function<void(Communicator&)>& body, seconds deadline) {
  if (comms_.empty()) connect();
  auto abort_others = [&](int failed_rank) {
    for (int rank = 0; rank < size_; ++rank) {
      if (rank != failed_rank) {
        comms_[rank]->abort("test harness: rank " + std::to_string(failed_rank) + " failed");
      }
    }
  };
  auto errors = run_threads(size_, [&](int rank) { body(*comms_[rank]); }, deadline, abort_others);
  bool failed = std::any_of(errors.begin(), errors.end(), [](auto& e) { return e != nullptr; });
  if (failed) {
    for (auto& comm : comms_) comm->abort("test harness: a rank failed");
    destroy();
    rethrow_rank_failures(errors);
  }
}

Communicator& RankGroup::comm(int rank) {
  if (comms_.empty()) connect();
  return *comms_.at(rank);
}

// ---------------------------------------------------------------------------------
// Processes.

uint16_t pick_free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    int err = errno;
    ::close(fd);
    throw std::runtime_error(std::string("bind 127.0.0.1:0: ") + std::strerror(err));
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::string this_hostname() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "";
  return buf;
}

namespace {

std::string make_temp_file(const char* suffix_hint, int* fd_out) {
  std::string path = std::string("/tmp/chorus-test-") + suffix_hint + "-XXXXXX";
  std::vector<char> buf(path.begin(), path.end());
  buf.push_back('\0');
  int fd = ::mkostemp(buf.data(), O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(std::string("mkostemp: ") + std::strerror(errno));
  *fd_out = fd;
  return std::string(buf.data());
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

Subprocess::Subprocess(const std::string& program, const SpawnOptions& options) {
  int out_fd = -1, err_fd = -1;
  out_path_ = make_temp_file("stdout", &out_fd);
  err_path_ = make_temp_file("stderr", &err_fd);

  // Everything the child needs is prepared here: between fork and exec only
  // async-signal-safe calls are allowed (this process has threads).
  std::vector<std::string> argv_storage{program};
  argv_storage.insert(argv_storage.end(), options.args.begin(), options.args.end());
  std::vector<std::string> env_storage;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string entry(*e);
    std::string name = entry.substr(0, entry.find('='));
    if (options.env.count(name) != 0) continue;
    if (std::find(options.unset_env.begin(), options.unset_env.end(), name) !=
        options.unset_env.end()) {
      continue;
    }
    env_storage.push_back(entry);
  }
  for (const auto& [name, value] : options.env) env_storage.push_back(name + "=" + value);
  std::vector<char*> argv, envp;
  for (auto& s : argv_storage) argv.push_back(s.data());
  argv.push_back(nullptr);
  for (auto& s : env_storage) envp.push_back(s.data());
  envp.push_back(nullptr);

  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) {
    int err = errno;
    ::close(out_fd);
    ::close(err_fd);
    throw std::runtime_error(std::string("fork: ") + std::strerror(err));
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    // Dies with the test process (the forking thread is the gtest main thread).
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd >= 0) ::dup2(null_fd, 0);
    ::dup2(out_fd, 1);
    ::dup2(err_fd, 2);
    ::execve(argv[0], argv.data(), envp.data());
    const char msg[] = "chorus test harness: execve failed: ";
    (void)!::write(2, msg, sizeof msg - 1);
    const char* reason = ::strerror(errno);  // not strictly async-signal-safe; best effort
    (void)!::write(2, reason, ::strlen(reason));
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also done by the child; whichever runs first wins the race
  ::close(out_fd);
  ::close(err_fd);
  pid_ = pid;
  pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
}

Subprocess::~Subprocess() {
  if (pid_ > 0) {
    kill_group(SIGKILL);
    if (!wait_for(std::chrono::seconds(30))) {
      std::fprintf(stderr, "chorus test harness: pid %d did not die after SIGKILL\n",
                   static_cast<int>(pid_));
    }
  }
  if (pidfd_ >= 0) ::close(pidfd_);
  if (std::getenv("CHORUS_TEST_KEEP_OUTPUT") == nullptr) {
    ::unlink(out_path_.c_str());
    ::unlink(err_path_.c_str());
  }
}

bool Subprocess::try_reap(int wait_flags) {
  if (reaped_) return true;
  int status = 0;
  pid_t r;
  do {
    r = ::waitpid(pid_, &status, wait_flags);
  } while (r < 0 && errno == EINTR);
  if (r == pid_) {
    reaped_ = true;
    status_ = status;
    exit_time_ = std::chrono::steady_clock::now();
  }
  return reaped_;
}

bool Subprocess::wait_for(milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!try_reap(WNOHANG)) {
    auto left = std::chrono::duration_cast<milliseconds>(deadline -
                                                         std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    if (pidfd_ >= 0) {
      // Readable once the child has exited.
      pollfd p{pidfd_, POLLIN, 0};
      ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count() + 1, 1 << 30)));
    } else {
      std::this_thread::sleep_for(std::min(left, milliseconds(2)));
    }
  }
  return true;
}

int Subprocess::exit_code() const {
  if (!reaped_ || !WIFEXITED(status_)) return -1;
  return WEXITSTATUS(status_);
}

int Subprocess::term_signal() const {
  if (!reaped_ || !WIFSIGNALED(status_)) return 0;
  return WTERMSIG(status_);
}

std::string Subprocess::status_text() const {
  if (!reaped_) return "running";
  if (WIFEXITED(status_)) return "exit code " + std::to_string(WEXITSTATUS(status_));
  if (WIFSIGNALED(status_)) return "killed by signal " + std::to_string(WTERMSIG(status_));
  return "status " + std::to_string(status_);
}

void Subprocess::kill_group(int signal) {
  if (pid_ > 0) ::kill(-pid_, signal);
}

bool Subprocess::group_alive() const { return pid_ > 0 && ::kill(-pid_, 0) == 0; }

std::string Subprocess::stdout_text() const { return read_file(out_path_); }
std::string Subprocess::stderr_text() const { return read_file(err_path_); }

bool Subprocess::wait_for_output(const std::string& needle, milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (output_text().find(needle) != std::string::npos) return true;
    if (exited()) return false;
    auto left = std::chrono::duration_cast<milliseconds>(deadline -
                                                         std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    // The output arrives in a file; look again every 10 ms, or at once on exit.
    wait_for(std::min(left, milliseconds(10)));
  }
}

std::vector<pid_t> child_pids(pid_t pid) {
  std::vector<pid_t> children;
  std::error_code ec;
  const std::filesystem::path tasks = "/proc/" + std::to_string(pid) + "/task";
  for (const auto& task : std::filesystem::directory_iterator(tasks, ec)) {
    std::ifstream in(task.path() / "children");
    long child = 0;
    while (in >> child) {
      if (std::find(children.begin(), children.end(), child) == children.end()) {
        children.push_back(static_cast<pid_t>(child));
      }
    }
  }
  return children;
}

std::vector<std::string> shm_segments_of(const std::vector<pid_t>& pids) {
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string name = e.path().filename().string();
    for (pid_t pid : pids) {
      const std::string prefix = "chorus." + std::to_string(pid) + ".";
      if (name.rfind(prefix, 0) == 0) found.push_back(name);
    }
  }
  return found;
}

int run_command(const std::string& program, const std::vector<std::string>& args,
                std::string* output, milliseconds timeout) {
  SpawnOptions options;
  options.args = args;
  Subprocess p(program, options);
  const bool done = p.wait_for(timeout);
  if (!done) {
    p.kill_group(SIGKILL);
    p.wait_for(seconds(10));
  }
  if (output) *output = p.output_text();
  return done ? p.exit_code() : -1;
}

}  // namespace chorus::test
