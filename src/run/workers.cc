// WorkerGroup: its one poll() loop over output pipes and pidfds, and its members. What
// the loop dispatches to, and how workers start and end, is in the files that
// workers_impl.h lists.
#include "run/workers.h"

#include <poll.h>

#include <cerrno>

#include "run/workers_impl.h"

namespace chorus::run {

// ----- poll -----

std::vector<WorkerExit> WorkerGroup::Impl::poll(milliseconds max_wait, int wake_fd) {
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
Deadline WorkerGroup::Impl::next_wakeup(const Deadline& deadline) const {
  Deadline next = deadline;
  for (const auto& w : workers)
    if (w->state == State::kExited) next = next.earlier(Deadline::at(w->drain_until));
  return next;
}

// One poll() over every open pipe, armed pidfd and wake_fd. Returns whether wake_fd
// became readable.
bool WorkerGroup::Impl::wait_and_dispatch(const Deadline& until, int wake_fd) {
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
