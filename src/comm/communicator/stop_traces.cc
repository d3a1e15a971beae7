#include "comm/communicator/stop_traces.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <mutex>
#include <thread>

#include "comm/common/logging.h"

namespace chorus::communicator {
namespace {

// Set before the handler is installed, never changed after: the handler reads them.
int g_wake_fd = -1;
pid_t g_owner = 0;  // the process that installed the handler (not a forked child)

void on_sigterm(int) {
  if (getpid() != g_owner) {
    // A child forked after installation: no thread of ours runs there.
    signal(SIGTERM, SIG_DFL);
    raise(SIGTERM);
    return;
  }
  const int saved = errno;
  const char byte = 1;
  ssize_t ignored = write(g_wake_fd, &byte, 1);  // a full pipe: a wake-up is pending anyway
  (void)ignored;
  errno = saved;
}

// Never destroyed: the writing thread may outlive main()'s statics.
struct Registry {
  std::mutex mutex;  // guards writers, next_id, installed; held while writers run
  std::map<uint64_t, std::function<void(const std::string&)>> writers;
  uint64_t next_id = 1;
  bool installed = false;
  int read_fd = -1;
};

Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

// The writing thread: waits for the handler's byte, writes every live communicator's
// trace, then lets SIGTERM do what it does by default.
void writer_thread(Registry& r) {
  char byte;
  while (read(r.read_fd, &byte, 1) != 1) {
    if (errno != EINTR) return;  // the pipe broke: SIGTERM stays a no-op write
  }
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    const std::string why =
        "the process received SIGTERM (chorusrun sends it to its workers when the job fails or "
        "is stopped)";
    for (auto& [id, write] : r.writers) {
      try {
        write(why);
      } catch (const std::exception& e) {
        CHORUS_LOG(kWarn, std::string("flight recorder on SIGTERM: ") + e.what());
      }
    }
    signal(SIGTERM, SIG_DFL);
  }
  sigset_t term;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  pthread_sigmask(SIG_UNBLOCK, &term, nullptr);
  kill(getpid(), SIGTERM);
}

// Under r.mutex. Installs the handler when SIGTERM's disposition is the default.
void install(Registry& r) {
  r.installed = true;
  struct sigaction old {};
  if (sigaction(SIGTERM, nullptr, &old) != 0) return;
  if ((old.sa_flags & SA_SIGINFO) != 0 || old.sa_handler != SIG_DFL) return;  // the program's
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    CHORUS_LOG(kWarn, "flight recorder: no pipe for SIGTERM (errno " << errno
                          << "); a worker stopped by SIGTERM leaves no trace");
    return;
  }
  fcntl(fds[1], F_SETFL, O_NONBLOCK);  // the handler never blocks
  r.read_fd = fds[0];
  g_wake_fd = fds[1];
  g_owner = getpid();
  std::thread(writer_thread, std::ref(r)).detach();
  struct sigaction act {};
  act.sa_handler = on_sigterm;
  sigemptyset(&act.sa_mask);
  act.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &act, nullptr);
}

}  // namespace

uint64_t add_stop_trace(std::function<void(const std::string& why)> write) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (!r.installed) install(r);
  const uint64_t id = r.next_id++;
  r.writers.emplace(id, std::move(write));
  return id;
}

void remove_stop_trace(uint64_t id) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.writers.erase(id);
}

}  // namespace chorus::communicator
