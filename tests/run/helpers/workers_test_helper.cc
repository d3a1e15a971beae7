// A scriptable worker for tests/run/workers_test.cc. Its arguments are steps, run in
// order:
//   out TEXT          TEXT and a newline on stdout
//   err TEXT          TEXT and a newline on stderr
//   lines N TAG       "TAG 1" .. "TAG N" on stdout
//   errlines N TAG    "TAG 1" .. "TAG N" on stderr
//   partial TEXT      TEXT on stdout, no newline
//   big-pipe BYTES    makes the stdout pipe hold BYTES (F_SETPIPE_SZ), so that much
//                     output can still be unread when the worker exits
//   long-line BYTES   BYTES times 'x' and a newline on stdout
//   env-dump          every environment entry on stdout, one a line
//   pid               "pid PID" (its process id) on stdout
//   fds               "fds" and the numbers of its open file descriptors on stdout
//   cpus              "cpus" and its Cpus_allowed_list (from /proc/self/status) on stdout
//   read-stdin        reads stdin to its end; "stdin N bytes" on stdout
//   ignore-term       ignores SIGTERM from here on
//   ignore-int        ignores SIGINT from here on
//   grandchild        forks a child that stays in the process group, ignores SIGTERM,
//                     keeps stdout/stderr open and sleeps 60 s; prints "grandchild PID"
//   sleep SECONDS     sleeps (fractions allowed)
//   raise SIGNAL      kills itself with SIGNAL (a number)
//   exit CODE         exits with CODE
// Without an exit step it exits 0 after the last step. Output is written unbuffered, so
// that every line is out before the next step.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <ctime>
#include <string>

extern char** environ;

namespace {

void write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n <= 0) std::_Exit(99);
    done += static_cast<size_t>(n);
  }
}

void sleep_seconds(double seconds) {
  timespec left{static_cast<time_t>(seconds),
                static_cast<long>((seconds - static_cast<time_t>(seconds)) * 1e9)};
  while (nanosleep(&left, &left) != 0) {
  }
}

void numbered_lines(int fd, int count, const std::string& tag) {
  for (int k = 1; k <= count; ++k) write_all(fd, tag + " " + std::to_string(k) + "\n");
}

void start_grandchild() {
  pid_t pid = fork();
  if (pid < 0) std::_Exit(98);
  if (pid == 0) {
    signal(SIGTERM, SIG_IGN);
    sleep_seconds(60);
    std::_Exit(0);
  }
  write_all(1, "grandchild " + std::to_string(pid) + "\n");
}

void list_fds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) std::_Exit(94);
  std::string line = "fds";
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] == '.' || std::stoi(entry->d_name) == dirfd(dir)) continue;
    line += std::string(" ") + entry->d_name;
  }
  closedir(dir);
  write_all(1, line + "\n");
}

void list_cpus() {
  int fd = ::open("/proc/self/status", O_RDONLY);
  if (fd < 0) std::_Exit(91);
  std::string status;
  char buffer[4096];
  for (ssize_t n; (n = ::read(fd, buffer, sizeof buffer)) > 0;) status.append(buffer, static_cast<size_t>(n));
  ::close(fd);
  const std::string key = "Cpus_allowed_list:";
  size_t at = status.find(key);
  if (at == std::string::npos) std::_Exit(90);
  at += key.size();
  while (at < status.size() && (status[at] == ' ' || status[at] == '\t')) ++at;
  write_all(1, "cpus " + status.substr(at, status.find('\n', at) - at) + "\n");
}

void read_stdin() {
  char buffer[4096];
  size_t total = 0;
  for (ssize_t n; (n = ::read(0, buffer, sizeof buffer)) != 0;) {
    if (n < 0) std::_Exit(93);
    total += static_cast<size_t>(n);
  }
  write_all(1, "stdin " + std::to_string(total) + " bytes\n");
}

// Runs the step at argv[i]; returns the index of the next step.
int run_step(int argc, char** argv, int i) {
  std::string step = argv[i];
  auto arg = [&](int k) -> std::string {
    if (i + k >= argc) std::_Exit(97);
    return argv[i + k];
  };
  if (step == "out" || step == "err") {
    write_all(step == "out" ? 1 : 2, arg(1) + "\n");
    return i + 2;
  }
  if (step == "lines" || step == "errlines") {
    numbered_lines(step == "lines" ? 1 : 2, std::stoi(arg(1)), arg(2));
    return i + 3;
  }
  if (step == "partial") {
    write_all(1, arg(1));
    return i + 2;
  }
  if (step == "long-line") {
    write_all(1, std::string(std::stoul(arg(1)), 'x') + "\n");
    return i + 2;
  }
  if (step == "big-pipe") {
    if (fcntl(1, F_SETPIPE_SZ, std::stoi(arg(1))) < 0) std::_Exit(92);
    return i + 2;
  }
  if (step == "env-dump") {
    for (char** entry = environ; *entry != nullptr; ++entry)
      write_all(1, std::string(*entry) + "\n");
    return i + 1;
  }
  if (step == "pid") {
    write_all(1, "pid " + std::to_string(getpid()) + "\n");
    return i + 1;
  }
  if (step == "fds") {
    list_fds();
    return i + 1;
  }
  if (step == "cpus") {
    list_cpus();
    return i + 1;
  }
  if (step == "read-stdin") {
    read_stdin();
    return i + 1;
  }
  if (step == "ignore-term") {
    signal(SIGTERM, SIG_IGN);
    return i + 1;
  }
  if (step == "ignore-int") {
    signal(SIGINT, SIG_IGN);
    return i + 1;
  }
  if (step == "grandchild") {
    start_grandchild();
    return i + 1;
  }
  if (step == "sleep") {
    sleep_seconds(std::stod(arg(1)));
    return i + 2;
  }
  if (step == "raise") {
    int sig = std::stoi(arg(1));
    signal(sig, SIG_DFL);
    raise(sig);
    std::_Exit(96);  // not reached for a fatal signal
  }
  if (step == "exit") std::_Exit(std::stoi(arg(1)));
  write_all(2, "workers_test_helper: unknown step '" + step + "'\n");
  std::_Exit(95);
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc;) i = run_step(argc, argv, i);
  return 0;
}
