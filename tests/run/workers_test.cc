// WorkerGroup with real processes: build/bin/workers_test_helper (tests/run/helpers) is
// the worker, driven by the steps on its command line.
//
// The test process makes itself a child subreaper, as chorusrun does, so that orphaned
// grandchildren of workers come back to it: otherwise their zombies would stay in the
// process group wherever init does not reap them, and "no process of the group is left"
// could not be checked. Every test ends with no child of the test process left.
#include "run/workers.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "chorus/error.h"
#include "comm/common/deadline.h"

namespace chorus::run {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

const std::string kHelper = std::string(CHORUS_BIN_DIR) + "/workers_test_helper";

// How long a worker that was asked to exit (or to print) may take; generous for a loaded
// 2-core machine.
constexpr milliseconds kWorkerDeadline{20000};

WorkerSpec helper_spec(int rank, const std::vector<std::string>& steps) {
  WorkerSpec spec;
  spec.rank = rank;
  spec.local_rank = rank;
  spec.argv = {kHelper};
  spec.argv.insert(spec.argv.end(), steps.begin(), steps.end());
  spec.env = {{"PATH", "/usr/bin:/bin"}};
  return spec;
}

// Pumps the group until every worker has exited; returns the exits by rank.
std::map<int, WorkerExit> wait_all(WorkerGroup& group) {
  Deadline deadline(kWorkerDeadline);
  while (group.running() > 0 && !deadline.expired()) group.poll(deadline.remaining());
  EXPECT_EQ(group.running(), 0) << "workers still running after the deadline";
  std::map<int, WorkerExit> by_rank;
  for (const auto& exit : group.exits()) by_rank[exit.rank] = exit;
  return by_rank;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> sorted_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::stringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::sort(lines.begin(), lines.end());
  return lines;
}

// Pumps the group until the log file at `path` contains `text` (a worker reached a step).
bool await_log(WorkerGroup& group, const std::string& path, const std::string& text) {
  Deadline deadline(kWorkerDeadline);
  while (read_file(path).find(text) == std::string::npos) {
    if (deadline.expired()) return false;
    group.poll(milliseconds(20));
  }
  return true;
}

bool group_gone(pid_t pgid) { return kill(-pgid, 0) == -1 && errno == ESRCH; }

int pidfd_open(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

// A directory below /tmp, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    char name[] = "/tmp/workers_test.XXXXXX";
    if (mkdtemp(name) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = name;
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Points this process's stdout and stderr (fds 1 and 2) at memory files until finish(),
// to see what WorkerGroup copies to the console.
class ConsoleCapture {
 public:
  ConsoleCapture() {
    std::fflush(nullptr);
    for (int fd : {1, 2}) {
      saved_[fd - 1] = dup(fd);
      files_[fd - 1] = memfd_create("console", MFD_CLOEXEC);
      dup2(files_[fd - 1], fd);
    }
  }
  ~ConsoleCapture() { finish(); }

  // Restores the console; returns what was written to stdout and stderr.
  std::pair<std::string, std::string> finish() {
    if (!finished_) {
      std::fflush(nullptr);
      for (int fd : {1, 2}) {
        dup2(saved_[fd - 1], fd);
        close(saved_[fd - 1]);
        captured_[fd - 1] = read_all(files_[fd - 1]);
        close(files_[fd - 1]);
      }
      finished_ = true;
    }
    return {captured_[0], captured_[1]};
  }

 private:
  static std::string read_all(int fd) {
    std::string text;
    char buffer[4096];
    for (off_t offset = 0;;) {
      ssize_t n = pread(fd, buffer, sizeof buffer, offset);
      if (n <= 0) return text;
      text.append(buffer, static_cast<size_t>(n));
      offset += n;
    }
  }

  int saved_[2] = {-1, -1};
  int files_[2] = {-1, -1};
  std::string captured_[2];
  bool finished_ = false;
};

class WorkersTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0); }

  // Every worker, grandchild and helper process of the test has been reaped.
  void TearDown() override {
    siginfo_t info{};
    EXPECT_EQ(waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT), -1)
        << "a child process was left behind: pid " << info.si_pid;
  }

  // Output to log files only, for the tests that are not about the console.
  OutputOptions logs_only() const {
    OutputOptions output;
    output.log_dir = logs_.path();
    output.redirects = Streams::kBoth;
    return output;
  }

  std::string log_path(int rank, const std::string& stream) const {
    return logs_.path() + "/rank_" + std::to_string(rank) + "." + stream + ".log";
  }

  TempDir logs_;
};

TEST_F(WorkersTest, ThreeWorkersCopyOutputToTheConsoleWithPrefixesWhereTeed) {
  OutputOptions output;
  output.tee = Streams::kStdout;
  output.last_lines = 3;
  WorkerGroup group(output);
  std::vector<WorkerSpec> specs;
  std::vector<std::string> expected_out, expected_err;
  for (int rank = 0; rank < 3; ++rank) {
    std::string r = std::to_string(rank);
    specs.push_back(
        helper_spec(rank, {"errlines", "2", "e" + r, "sleep", "0.2", "lines", "5", "o" + r}));
    for (int k = 1; k <= 5; ++k)
      expected_out.push_back("[rank " + r + "]: o" + r + " " + std::to_string(k));
    for (int k = 1; k <= 2; ++k) expected_err.push_back("e" + r + " " + std::to_string(k));
  }
  ConsoleCapture console;
  group.start(specs);
  auto exits = wait_all(group);
  auto [out, err] = console.finish();

  ASSERT_EQ(exits.size(), 3u);
  for (int rank = 0; rank < 3; ++rank) {
    std::string o = "o" + std::to_string(rank);
    EXPECT_FALSE(exits[rank].failed()) << exits[rank].describe();
    EXPECT_EQ(exits[rank].last_lines, (std::vector<std::string>{o + " 3", o + " 4", o + " 5"}));
    EXPECT_GT(exits[rank].pid, 0);
  }
  std::sort(expected_out.begin(), expected_out.end());
  std::sort(expected_err.begin(), expected_err.end());
  EXPECT_EQ(sorted_lines(out), expected_out);
  EXPECT_EQ(sorted_lines(err), expected_err);
}

TEST_F(WorkersTest, LastLinesMergeStreamsInArrivalOrder) {
  WorkerGroup group(logs_only());
  group.start({helper_spec(0, {"err", "first", "sleep", "0.3", "out", "second"})});
  auto exits = wait_all(group);
  EXPECT_EQ(exits[0].last_lines, (std::vector<std::string>{"first", "second"}));
}

TEST_F(WorkersTest, LogFilesAreWrittenAndAppendedByTheNextStart) {
  OutputOptions output;
  output.log_dir = logs_.path() + "/nested/logs";
  WorkerGroup group(output);
  auto specs = {helper_spec(0, {"lines", "2", "o0", "errlines", "1", "e0"}),
                helper_spec(1, {"lines", "2", "o1", "errlines", "1", "e1"})};
  for (int run = 1; run <= 2; ++run) {
    ConsoleCapture console;
    group.start(specs);
    EXPECT_EQ(wait_all(group).size(), 2u);
    console.finish();
    EXPECT_EQ(group.exits().size(), 2u) << "exits() holds only the latest start";
  }
  for (int rank = 0; rank < 2; ++rank) {
    std::string r = std::to_string(rank);
    std::string once_out = "o" + r + " 1\no" + r + " 2\n";
    EXPECT_EQ(read_file(output.log_dir + "/rank_" + r + ".stdout.log"), once_out + once_out);
    EXPECT_EQ(read_file(output.log_dir + "/rank_" + r + ".stderr.log"),
              "e" + r + " 1\ne" + r + " 1\n");
  }
}

// Status lines (ended by a lone '\r', as progress bars draw) on a terminal console: shown
// in place, other workers' lines scroll above them (clear, line, redraw), a stderr line
// clears and redraws the stdout status, and the owner's '\n' leaves the last one,
// finished. Log files and reports keep only the finished line. The sleeps order the
// workers' writes; the expected bytes are exact.
TEST_F(WorkersTest, StatusLinesAreRedrawnInPlaceOnATerminal) {
  OutputOptions output;
  output.tee = Streams::kStdout;
  output.terminals = Streams::kBoth;
  output.log_dir = logs_.path();
  WorkerGroup group(output);
  ConsoleCapture console;
  group.start({helper_spec(0, {"partial", "bar 1\r", "sleep", "1", "partial", "bar 2\r", "sleep", "1",
                               "partial", "\n"}),
               helper_spec(1, {"sleep", "0.5", "out", "r1 line", "sleep", "1", "err", "e1"})});
  auto exits = wait_all(group);
  auto [out, err] = console.finish();
  const std::string clear = "\r\x1b[K", end = "\x1b[K";
  EXPECT_EQ(out, clear + "[rank 0]: bar 1" + end +                             // drawn
                     clear + "[rank 1]: r1 line\n" + "[rank 0]: bar 1" + end +  // scrolled above
                     clear + "[rank 0]: bar 2" + end +                          // redrawn
                     clear + "[rank 0]: bar 2" + end +                          // around e1
                     clear + "[rank 0]: bar 2\n");                              // finished
  EXPECT_EQ(err, "e1\n");
  EXPECT_EQ(read_file(log_path(0, "stdout")), "bar 2\n");
  EXPECT_EQ(exits[0].last_lines, (std::vector<std::string>{"bar 2"}));
  EXPECT_EQ(exits[1].last_lines, (std::vector<std::string>{"r1 line", "e1"}));
}

// Where the console is not a terminal, status lines are dropped and a bar's finished
// line (its text before '\n', however the '\r's were placed) is kept; "\r\n" ends a
// line like '\n'.
TEST_F(WorkersTest, StatusLinesAreDroppedWhereTheConsoleIsNotATerminal) {
  OutputOptions output;
  output.log_dir = logs_.path();
  WorkerGroup group(output);
  ConsoleCapture console;
  group.start({helper_spec(0, {"partial", "p 1\r", "sleep", "0.2", "partial", "p 2\r\n", "partial",
                               "\rq 1", "sleep", "0.2", "partial", "\rq 2", "sleep", "0.2", "partial",
                               "\n", "out", "crlf\r"})});
  auto exits = wait_all(group);
  auto [out, err] = console.finish();
  EXPECT_EQ(out, "p 2\nq 2\ncrlf\n");
  EXPECT_EQ(read_file(log_path(0, "stdout")), "p 2\nq 2\ncrlf\n");
  EXPECT_EQ(exits[0].last_lines, (std::vector<std::string>{"p 2", "q 2", "crlf"}));
}

// A worker that ends while its status is shown leaves it on the terminal: what comes
// next starts on a new line.
TEST_F(WorkersTest, AnEndedWorkersStatusStaysOnTheTerminal) {
  OutputOptions output;
  output.terminals = Streams::kStdout;
  WorkerGroup group(output);
  ConsoleCapture console;
  group.start({helper_spec(0, {"partial", "s 1\r", "exit", "3"})});
  auto exits = wait_all(group);
  auto [out, err] = console.finish();
  EXPECT_EQ(out, "\r\x1b[Ks 1\x1b[K\n");
  EXPECT_EQ(exits[0].exit_code, 3);
  EXPECT_TRUE(exits[0].last_lines.empty());
}

TEST_F(WorkersTest, RedirectedStreamsStayOffTheConsole) {
  OutputOptions output;
  output.tee = Streams::kBoth;
  output.redirects = Streams::kStdout;
  output.log_dir = logs_.path();
  WorkerGroup group(output);
  ConsoleCapture console;
  group.start({helper_spec(0, {"lines", "2", "o0", "errlines", "1", "e0"})});
  auto exits = wait_all(group);
  auto [out, err] = console.finish();
  EXPECT_EQ(out, "");
  EXPECT_EQ(err, "[rank 0]: e0 1\n");
  EXPECT_EQ(read_file(log_path(0, "stdout")), "o0 1\no0 2\n");
  EXPECT_EQ(read_file(log_path(0, "stderr")), "e0 1\n");
  EXPECT_EQ(exits[0].last_lines.size(), 3u) << "redirected lines are still kept for reports";
}

TEST_F(WorkersTest, RedirectsWithoutALogDirectoryAreRejected) {
  OutputOptions output;
  output.redirects = Streams::kStderr;
  EXPECT_THROW(WorkerGroup group(output), InvalidArgumentError);
}

// A worker with WorkerSpec::cpus runs on those CPUs only, threads it starts included
// (the affinity is set before exec); one without keeps the launcher's.
TEST_F(WorkersTest, WorkersAreBoundToTheirCpus) {
  const std::vector<int> allowed = allowed_cpus();
  ASSERT_FALSE(allowed.empty());
  WorkerGroup group(logs_only());
  WorkerSpec bound = helper_spec(0, {"cpus"});
  bound.cpus = {allowed.back()};
  WorkerSpec unbound = helper_spec(1, {"cpus"});
  group.start({bound, unbound});
  auto exits = wait_all(group);
  for (int rank : {0, 1}) ASSERT_FALSE(exits[rank].failed()) << exits[rank].describe();
  auto first_line = [&](int rank) {
    std::ifstream in(log_path(rank, "stdout"));
    std::string line;
    std::getline(in, line);
    return line;
  };
  EXPECT_EQ(first_line(0), "cpus " + std::to_string(allowed.back()));
  EXPECT_EQ(first_line(1), "cpus " + cpu_list(allowed));
}

TEST_F(WorkersTest, ExitCodeIsReported) {
  WorkerGroup group(logs_only());
  group.start({helper_spec(0, {"exit", "7"})});
  auto exits = wait_all(group);
  EXPECT_EQ(exits[0].exit_code, 7);
  EXPECT_EQ(exits[0].signal, 0);
  EXPECT_EQ(exits[0].status_code(), 7);
  EXPECT_TRUE(exits[0].failed());
  EXPECT_EQ(exits[0].describe(), "exit code 7");
}

TEST_F(WorkersTest, DeathBySignalIsReported) {
  WorkerGroup group(logs_only());
  group.start({helper_spec(0, {"raise", std::to_string(SIGKILL)})});
  auto exits = wait_all(group);
  EXPECT_EQ(exits[0].signal, SIGKILL);
  EXPECT_EQ(exits[0].status_code(), 137);
  EXPECT_TRUE(exits[0].failed());
  EXPECT_EQ(exits[0].describe(), "signal 9 (SIGKILL)");
}

TEST_F(WorkersTest, SignalNames) {
  EXPECT_EQ(signal_name(SIGTERM), "SIGTERM");
  EXPECT_EQ(signal_name(SIGSEGV), "SIGSEGV");
  EXPECT_EQ(signal_name(0), "signal 0");
  EXPECT_EQ(signal_name(1000), "signal 1000");
}

TEST_F(WorkersTest, ExecFailureNamesProgramAndRankAndStopsTheOthers) {
  WorkerGroup group(logs_only());
  WorkerSpec missing = helper_spec(1, {});
  missing.argv = {"no_such_program_for_chorus_tests", "arg"};
  try {
    group.start({helper_spec(0, {"sleep", "60"}), missing});
    FAIL() << "start() did not throw";
  } catch (const SystemError& e) {
    EXPECT_STREQ(e.what(),
                 "cannot start 'no_such_program_for_chorus_tests' for rank 1: "
                 "No such file or directory");
  }
  EXPECT_EQ(group.running(), 0);
  EXPECT_TRUE(group.pids().empty());
  // Rank 0 was killed and reaped before the exception: the test process has no child.
  siginfo_t info{};
  EXPECT_EQ(waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT), -1);
}

TEST_F(WorkersTest, PollReturnsAtTheFirstExit) {
  WorkerGroup group(logs_only());
  group.start({helper_spec(0, {"sleep", "60"}), helper_spec(1, {"exit", "0"})});
  auto started = Clock::now();
  auto exits = group.poll(kWorkerDeadline);
  EXPECT_LT(Clock::now() - started, seconds(5));
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].rank, 1);
  EXPECT_EQ(group.running(), 1);
  EXPECT_EQ(group.pids().size(), 1u);
}

TEST_F(WorkersTest, PollReturnsWhenWakeFdIsReadable) {
  WorkerGroup group(logs_only());
  group.start({helper_spec(0, {"sleep", "60"})});
  int wake[2];
  ASSERT_EQ(pipe(wake), 0);
  ASSERT_EQ(write(wake[1], "x", 1), 1);
  auto started = Clock::now();
  auto exits = group.poll(kWorkerDeadline, wake[0]);
  EXPECT_LT(Clock::now() - started, seconds(5));
  EXPECT_TRUE(exits.empty());
  EXPECT_EQ(group.running(), 1);
  close(wake[0]);
  close(wake[1]);
}

TEST_F(WorkersTest, SignalAllReachesEveryWorker) {
  WorkerGroup group(logs_only());
  group.start({helper_spec(0, {"sleep", "60"}), helper_spec(1, {"sleep", "60"})});
  group.signal_all(SIGUSR1);
  auto exits = wait_all(group);
  ASSERT_EQ(exits.size(), 2u);
  for (auto& [rank, exit] : exits) EXPECT_EQ(exit.signal, SIGUSR1) << "rank " << rank;
}

TEST_F(WorkersTest, TerminateStopsSleepingWorkersWithSigterm) {
  WorkerGroup group(logs_only());
  group.start({helper_spec(0, {"sleep", "60"}), helper_spec(1, {"sleep", "60"})});
  auto started = Clock::now();
  auto exits = group.terminate(seconds(10));
  EXPECT_LT(Clock::now() - started, seconds(2));
  ASSERT_EQ(exits.size(), 2u);
  for (const auto& exit : exits) EXPECT_EQ(exit.signal, SIGTERM) << "rank " << exit.rank;
  EXPECT_EQ(group.running(), 0);
}

TEST_F(WorkersTest, TerminateKillsWorkersThatIgnoreSigtermAfterTheGrace) {
  WorkerGroup group(logs_only());
  group.start({helper_spec(0, {"ignore-term", "out", "ready", "sleep", "60"}),
               helper_spec(1, {"ignore-term", "out", "ready", "sleep", "60"})});
  ASSERT_TRUE(await_log(group, log_path(0, "stdout"), "ready"));
  ASSERT_TRUE(await_log(group, log_path(1, "stdout"), "ready"));
  constexpr milliseconds kGrace{500};
  auto started = Clock::now();
  auto exits = group.terminate(kGrace);
  auto elapsed = Clock::now() - started;
  EXPECT_GE(elapsed, kGrace);
  EXPECT_LT(elapsed, kGrace + seconds(2));
  ASSERT_EQ(exits.size(), 2u);
  for (const auto& exit : exits) EXPECT_EQ(exit.signal, SIGKILL) << "rank " << exit.rank;
  EXPECT_EQ(exits[0].last_lines, std::vector<std::string>{"ready"});
}

TEST_F(WorkersTest, TerminateLeavesNoProcessOfTheGroup) {
  WorkerGroup group(logs_only());
  group.start({helper_spec(0, {"grandchild", "out", "ready", "sleep", "60"})});
  pid_t pgid = group.pids().at(0);
  ASSERT_TRUE(await_log(group, log_path(0, "stdout"), "ready"));
  auto started = Clock::now();
  auto exits = group.terminate(seconds(1));
  EXPECT_LT(Clock::now() - started, seconds(3));
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].signal, SIGTERM);
  EXPECT_TRUE(group_gone(pgid)) << "the grandchild (which ignores SIGTERM) survived";
}

TEST_F(WorkersTest, DestructorLeavesNoProcessOfTheGroup) {
  pid_t pgid = 0;
  {
    WorkerGroup group(logs_only());
    group.start({helper_spec(0, {"grandchild", "ignore-term", "out", "ready", "sleep", "60"})});
    pgid = group.pids().at(0);
    ASSERT_TRUE(await_log(group, log_path(0, "stdout"), "ready"));
  }
  EXPECT_TRUE(group_gone(pgid));
}

TEST_F(WorkersTest, GrandchildrenOfExitedWorkersDieAtTerminate) {
  WorkerGroup group(logs_only());
  group.start({helper_spec(0, {"grandchild", "exit", "0"})});
  pid_t pgid = group.pids().at(0);
  auto exits = wait_all(group);  // reported after the drain: the grandchild holds the pipes
  EXPECT_EQ(exits[0].exit_code, 0);
  EXPECT_FALSE(group_gone(pgid)) << "the grandchild should still be running here";
  group.terminate(seconds(1));
  EXPECT_TRUE(group_gone(pgid));
}

TEST_F(WorkersTest, WorkersDieWithTheLauncher) {
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  pid_t launcher = fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {  // a launcher that is SIGKILLed while its worker runs
    close(pipe_fds[0]);
    try {
      WorkerGroup group(logs_only());
      group.start({helper_spec(0, {"sleep", "60"})});
      pid_t worker = group.pids().at(0);
      if (write(pipe_fds[1], &worker, sizeof worker) != sizeof worker) _exit(1);
      while (true) pause();
    } catch (...) {
      _exit(1);
    }
  }
  close(pipe_fds[1]);
  pid_t worker = 0;
  pollfd readable{pipe_fds[0], POLLIN, 0};
  if (poll(&readable, 1, static_cast<int>(kWorkerDeadline.count())) == 1 &&
      read(pipe_fds[0], &worker, sizeof worker) != sizeof worker)
    worker = 0;
  close(pipe_fds[0]);
  int worker_fd = worker > 0 ? pidfd_open(worker) : -1;
  kill(launcher, SIGKILL);
  ASSERT_EQ(waitpid(launcher, nullptr, 0), launcher);
  ASSERT_GT(worker, 0) << "the launcher did not report its worker";
  ASSERT_GE(worker_fd, 0);

  pollfd exited{worker_fd, POLLIN, 0};
  bool died = poll(&exited, 1, 2000) == 1;
  close(worker_fd);
  if (!died) kill(worker, SIGTERM);  // so that the reaping below does not wait 60 s
  EXPECT_TRUE(died) << "the worker outlived its launcher by 2 s";
  // The worker was adopted by this process (the subreaper): reap it and see how it died.
  siginfo_t info{};
  ASSERT_EQ(waitid(P_PID, static_cast<id_t>(worker), &info, WEXITED), 0);
  EXPECT_EQ(info.si_code, CLD_KILLED);
  EXPECT_EQ(info.si_status, SIGKILL);
}

TEST_F(WorkersTest, UnterminatedLastLineIsKept) {
  WorkerGroup group(logs_only());
  group.start({helper_spec(0, {"out", "first", "partial", "no newline"})});
  auto exits = wait_all(group);
  EXPECT_EQ(exits[0].last_lines, (std::vector<std::string>{"first", "no newline"}));
  EXPECT_EQ(read_file(log_path(0, "stdout")), "first\nno newline\n");
}

TEST_F(WorkersTest, VeryLongLinesArePassedOnInPieces) {
  WorkerGroup group(logs_only());
  group.start({helper_spec(0, {"long-line", "150000", "out", "after"})});
  auto exits = wait_all(group);
  const auto& lines = exits[0].last_lines;
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0], std::string(65536, 'x'));
  EXPECT_EQ(lines[1], std::string(65536, 'x'));
  EXPECT_EQ(lines[2], std::string(150000 - 2 * 65536, 'x'));
  EXPECT_EQ(lines[3], "after");
}

TEST_F(WorkersTest, OutputStillUnreadAtExitIsInTheReport) {
  WorkerGroup group(logs_only());
  group.start({helper_spec(0, {"big-pipe", "1048576", "long-line", "500000", "out", "last"})});
  auto exits = wait_all(group);
  ASSERT_FALSE(exits[0].last_lines.empty());
  EXPECT_EQ(exits[0].last_lines.back(), "last");
}

TEST_F(WorkersTest, EnvironmentIsExactlyTheSpecs) {
  WorkerGroup group(logs_only());
  WorkerSpec spec = helper_spec(0, {"env-dump"});
  spec.env = {{"CHORUS_TEST_VALUE", "a b=c"}, {"EMPTY", ""}};
  group.start({spec});
  auto exits = wait_all(group);
  EXPECT_EQ(exits[0].last_lines, (std::vector<std::string>{"CHORUS_TEST_VALUE=a b=c", "EMPTY="}));
}

TEST_F(WorkersTest, WorkersGetOnlyStdioAndEmptyStdin) {
  int leaked = open("/dev/null", O_RDONLY);  // no O_CLOEXEC: exec alone would pass it on
  ASSERT_GE(leaked, 0);
  WorkerGroup group(logs_only());
  group.start({helper_spec(0, {"fds", "read-stdin"})});
  auto exits = wait_all(group);
  close(leaked);
  EXPECT_EQ(exits[0].last_lines, (std::vector<std::string>{"fds 0 1 2", "stdin 0 bytes"}));
}

TEST_F(WorkersTest, WorkersDoNotInheritIgnoredOrBlockedSignals) {
  struct sigaction ignore = {};
  struct sigaction old_action = {};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGTERM, &ignore, &old_action);
  sigset_t blocked, old_mask;
  sigemptyset(&blocked);
  sigaddset(&blocked, SIGUSR1);
  sigprocmask(SIG_BLOCK, &blocked, &old_mask);
  WorkerGroup group(logs_only());
  group.start({helper_spec(0, {"sleep", "60"}), helper_spec(1, {"sleep", "60"})});
  sigaction(SIGTERM, &old_action, nullptr);
  sigprocmask(SIG_SETMASK, &old_mask, nullptr);

  kill(-group.pids().at(0), SIGTERM);
  kill(-group.pids().at(1), SIGUSR1);
  auto exits = wait_all(group);
  EXPECT_EQ(exits[0].signal, SIGTERM);
  EXPECT_EQ(exits[1].signal, SIGUSR1);
}

}  // namespace
}  // namespace chorus::run
