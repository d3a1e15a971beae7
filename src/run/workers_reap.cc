// Exits, signals, termination and reaping of a WorkerGroup's workers (workers_impl.h).
//
// Exit statuses are collected with WNOWAIT when a worker's pidfd fires; the zombie is
// reaped only after its whole process group has been SIGKILLed (terminate(), the
// destructor, or the next start()). While the leader is a zombie its pid — which is
// also its process group id — cannot be reused, so kill(-pgid) never reaches a stranger
// even after the worker has exited; that is what lets us kill a worker's leftover
// grandchildren at the end.
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "run/workers_impl.h"

namespace chorus::run {
namespace {

// After a worker's pidfd fires, how long its pipes may stay open (a grandchild holding
// them) before the exit is reported anyway.
constexpr milliseconds kDrainAfterExit{200};
// Bound for processes that were sent SIGKILL to die and be reaped.
constexpr milliseconds kKilledDeadline{5000};
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

// ----- exits -----

// The pidfd fired: take the status but leave the zombie (see the top of this file).
void WorkerGroup::Impl::notice_exit(Worker& w) {
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
void WorkerGroup::Impl::report_finished(std::vector<WorkerExit>& seen) {
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

// ----- signals, termination, cleanup -----

int WorkerGroup::Impl::running() const {
  return static_cast<int>(
      std::count_if(workers.begin(), workers.end(), [](const auto& w) { return alive(*w); }));
}

void WorkerGroup::Impl::signal_running(int signal) {
  for (const auto& w : workers)
    if (alive(*w) && w->group_owned) kill(-w->pid, signal);
}

// Every group we still own, including those whose leader has exited (grandchildren).
void WorkerGroup::Impl::kill_all_groups() {
  for (const auto& w : workers)
    if (w->state != State::kReaped && w->group_owned) kill(-w->pid, SIGKILL);
}

void WorkerGroup::Impl::pump_until_all_reported(const Deadline& deadline,
                                                 std::vector<WorkerExit>& seen) {
  while (running() > 0 && !deadline.expired()) {
    for (auto& exit : poll(deadline.remaining(), -1)) seen.push_back(std::move(exit));
  }
}

std::vector<WorkerExit> WorkerGroup::Impl::terminate(milliseconds grace) {
  std::vector<WorkerExit> seen;
  signal_running(SIGTERM);
  pump_until_all_reported(Deadline(grace), seen);
  kill_all_groups();
  pump_until_all_reported(Deadline(kKilledDeadline), seen);
  reap_reported();
  return seen;
}

// Reaps the groups of reported workers; their groups must have been sent SIGKILL.
void WorkerGroup::Impl::reap_reported() {
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
void WorkerGroup::Impl::release_all() {
  kill_all_groups();
  Deadline deadline(kKilledDeadline);
  for (const auto& w : workers)
    if (w->state != State::kReaped && w->group_owned) reap_group(w->pid, deadline);
  end_status();
  workers.clear();
}

// Output still in flight is copied out before the workers are dropped.
void WorkerGroup::Impl::shut_down() {
  kill_all_groups();
  std::vector<WorkerExit> ignored;
  pump_until_all_reported(Deadline(kKilledDeadline), ignored);
  release_all();
}

}  // namespace chorus::run
