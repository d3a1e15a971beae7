#include "run/attempt.h"

#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <sstream>
#include <thread>

#include "chorus/elastic.h"
#include "chorus/error.h"
#include "comm/common/deadline.h"
#include "comm/common/socket.h"
#include "run/cpu_binding.h"
#include "run/liveness.h"
#include "run/program.h"

namespace chorus::run {
namespace {

using json = nlohmann::json;
using std::chrono::milliseconds;

json worker_failure(const WorkerExit& e, int node) {
  return json{{"kind", "worker"},        {"rank", e.rank},
              {"node", node},            {"local_rank", e.local_rank},
              {"pid", e.pid},            {"host", net::hostname()},
              {"how", e.describe()},     {"status", e.status_code()},
              {"time", local_time_text(e.when)}, {"last_lines", e.last_lines}};
}

}  // namespace

json launcher_stop(int node, int signal) {
  return json{{"kind", "signal"},
              {"node", node},
              {"host", net::hostname()},
              {"how", signal_name(signal)},
              {"status", 128 + signal},
              {"time", local_time_text(std::chrono::system_clock::now())}};
}

void print_summary(const json& f) {
  std::ostringstream out;
  if (f["kind"] == "worker") {
    out << "chorusrun: job failed: rank " << f["rank"].get<int>() << " (node "
        << f["node"].get<int>() << " on host " << f["host"].get<std::string>()
        << ", local rank " << f["local_rank"].get<int>() << ", pid " << f["pid"].get<int>()
        << ") ended with " << f["how"].get<std::string>() << " at "
        << f["time"].get<std::string>() << "\n";
    const auto& lines = f["last_lines"];
    if (lines.empty()) {
      out << "chorusrun: rank " << f["rank"].get<int>() << " printed nothing\n";
    } else {
      out << "chorusrun: last output of rank " << f["rank"].get<int>() << ":\n";
      for (const auto& l : lines) out << "  | " << l.get<std::string>() << "\n";
    }
  } else if (f["kind"] == "launcher") {
    out << "chorusrun: job failed: the launcher of node " << f["node"].get<int>() << " (host "
        << f["host"].get<std::string>() << ") was lost at " << f["time"].get<std::string>()
        << ": " << f["how"].get<std::string>() << "\n";
  } else {
    out << "chorusrun: job stopped: the launcher of node " << f["node"].get<int>() << " (host "
        << f["host"].get<std::string>() << ") received " << f["how"].get<std::string>()
        << " at " << f["time"].get<std::string>() << "\n";
  }
  std::cerr << out.str() << std::flush;
}

namespace {

// The console streams that are terminals, where workers' status lines (progress bars)
// are redrawn in place (OutputOptions::terminals); redirected streams are not consoles.
Streams console_terminals(const LaunchOptions& o) {
  int set = 0;
  if (::isatty(STDOUT_FILENO) == 1 && !contains(o.redirects, 0)) set |= static_cast<int>(Streams::kStdout);
  if (::isatty(STDERR_FILENO) == 1 && !contains(o.redirects, 1)) set |= static_cast<int>(Streams::kStderr);
  return static_cast<Streams>(set);
}

// The complete environment of one worker. MASTER_ADDR/MASTER_PORT are left to the
// program's own rendezvous (a PyTorch rank 0 binds its TCPStore on that port, which
// the store of the launchers must therefore not hold); chorus's workers find the
// launchers' store through CHORUS_STORE_ADDR/CHORUS_STORE_PORT.
std::map<std::string, std::string> worker_env(const LaunchOptions& o, const RoundShape& shape,
                                              int local_rank, const Environment& base, int cpus) {
  std::map<std::string, std::string> env(base.begin(), base.end());
  env["RANK"] = std::to_string(shape.rank_base + local_rank);
  env["LOCAL_RANK"] = std::to_string(local_rank);
  env["WORLD_SIZE"] = std::to_string(shape.world_size);
  env["LOCAL_WORLD_SIZE"] = std::to_string(shape.nproc);
  // torchrun's names for the node's place: one role ("default"), so the role's ranks
  // are the global ones.
  env["GROUP_RANK"] = std::to_string(shape.node_rank);
  env["GROUP_WORLD_SIZE"] = std::to_string(shape.nnodes);
  env["ROLE_RANK"] = env["RANK"];
  env["ROLE_WORLD_SIZE"] = env["WORLD_SIZE"];
  env["MASTER_ADDR"] = o.master_addr;
  env["MASTER_PORT"] = std::to_string(shape.worker_port);
  env["CHORUS_STORE_ADDR"] = o.master_addr;
  env["CHORUS_STORE_PORT"] = std::to_string(o.master_port);
  env["CHORUS_STORE_HOSTED"] = "1";
  env["CHORUS_RESTART_COUNT"] = std::to_string(shape.round);
  env["CHORUS_MAX_RESTARTS"] = std::to_string(o.max_restarts);
  env["CHORUS_RUN_ID"] = o.rdzv_id;
  // torchrun's names for the same, read by torch.distributed.elastic's helpers; no
  // agent store listens on MASTER_PORT, so rank 0 must host its own TCPStore there.
  env["TORCHELASTIC_RESTART_COUNT"] = env["CHORUS_RESTART_COUNT"];
  env["TORCHELASTIC_MAX_RESTARTS"] = env["CHORUS_MAX_RESTARTS"];
  env["TORCHELASTIC_RUN_ID"] = o.rdzv_id;
  env["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  // The job id is the job token unless the user set one (empty counts as unset, as in
  // settings::job_token()).
  if (env["CHORUS_JOB_TOKEN"].empty()) env["CHORUS_JOB_TOKEN"] = o.rdzv_id;
  if (env.find("OMP_NUM_THREADS") == env.end()) {
    env["OMP_NUM_THREADS"] = std::to_string(std::max(1, cpus / shape.nproc));
  }
  if (!o.local_addr.empty()) env["CHORUS_IF_IP"] = o.local_addr;
  if (shape.stop_key.empty()) {
    env.erase(kStopAtCheckpointKeyVariable);
  } else {
    env[kStopAtCheckpointKeyVariable] = shape.stop_key;
  }
  // A worker's stdout is a pipe to the launcher; this says whether the launcher's is a
  // terminal, so that a program may draw a progress bar (chorus-mnist does).
  if (contains(console_terminals(o), 0)) {
    env["CHORUS_STDOUT_TERMINAL"] = "1";
  } else {
    env.erase("CHORUS_STDOUT_TERMINAL");
  }
  return env;
}

}  // namespace

std::vector<WorkerSpec> worker_specs(const LaunchOptions& o, const RoundShape& shape,
                                     const Environment& base) {
  const int cpus = std::max(1u, std::thread::hardware_concurrency());
  const std::vector<int> allowed = allowed_cpus();
  std::vector<WorkerSpec> specs;
  for (int l = 0; l < shape.nproc; ++l) {
    WorkerSpec s;
    s.rank = shape.rank_base + l;
    s.local_rank = l;
    s.argv = worker_command(o, l);
    s.env = worker_env(o, shape, l, base, cpus);
    s.cpus = cpus_for(o.cpu_bind, l, shape.nproc, allowed);
    specs.push_back(std::move(s));
  }
  return specs;
}

RoundControl::~RoundControl() = default;

std::string RoundControl::report_failure(int round, const std::string& failure) {
  const std::string key = "round/" + std::to_string(round) + "/failure";
  Bytes stands = store_->compare_set(key, Bytes(), Bytes(failure.begin(), failure.end()));
  return std::string(stands.begin(), stands.end());
}

std::optional<std::string> RoundControl::failure(int round) {
  const std::string key = "round/" + std::to_string(round) + "/failure";
  if (!store_->check({key})) return std::nullopt;
  return store_->get_string(key);
}

Signals::Signals() {
  sigemptyset(&set_);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&set_, s);
  sigprocmask(SIG_BLOCK, &set_, &old_);
  fd_ = signalfd(-1, &set_, SFD_NONBLOCK | SFD_CLOEXEC);
}

Signals::~Signals() {
  if (fd_ >= 0) close(fd_);
  sigprocmask(SIG_SETMASK, &old_, nullptr);
}

int Signals::take() {
  signalfd_siginfo info;
  if (read(fd_, &info, sizeof info) == sizeof info) return static_cast<int>(info.ssi_signo);
  return 0;
}

Attempt::Attempt(const LaunchOptions& o, RoundControl& rdzv, Signals& signals, int round, int node)
    : o_(o), rdzv_(rdzv), signals_(signals), round_(round), node_(node),
      group_(OutputOptions{o.tee, o.redirects, o.log_dir, 20, console_terminals(o)}) {}

Attempt::~Attempt() = default;

std::optional<json> Attempt::stop_for(const std::string& failure_text) {
  group_.terminate(o_.grace_period);
  return json::parse(failure_text);
}

std::optional<json> Attempt::run(const std::vector<WorkerSpec>& specs) {
  group_.start(specs);
  bool done_reported = false;
  std::optional<json> outcome;
  while (true) {
    try {
      if (step(done_reported, outcome)) return outcome;
    } catch (const Error& e) {
      // Node 0's store closed or did not answer (StoreError, TimeoutError): its
      // launcher is lost. On node 0 itself such an error is the launcher's own.
      std::optional<std::string> lost;
      if (dynamic_cast<const StoreError*>(&e) != nullptr ||
          dynamic_cast<const TimeoutError*>(&e) != nullptr) {
        lost = rdzv_.store_failed(e);
      }
      if (!lost) throw;
      return stop_for(*lost);
    }
  }
}

// One turn of the watch. True when the attempt is over: `outcome` is then the failure
// that stands, or null when every node succeeded.
bool Attempt::step(bool& done_reported, std::optional<json>& outcome) {
  std::vector<WorkerExit> exits = group_.poll(o_.monitor_interval, signals_.fd());
  for (const WorkerExit& e : exits) {
    if (!e.failed()) continue;
    // Stopped at a checkpoint, as node 0 asked: the round's planned end (node 0 ends it
    // once every node's workers have), not a failure.
    if (e.signal == 0 && e.exit_code == kStoppedAtCheckpointStatus && rdzv_.stop_requested(round_)) {
      stopped_ = true;
      continue;
    }
    // A worker that failed because another node's launcher died (its peers went with
    // it) is not the cause: the launchers' checks get a turn to say so first.
    if (auto lost = rdzv_.settle_lost()) {
      outcome = stop_for(*lost);
    } else {
      outcome = stop_for(rdzv_.report_failure(round_, worker_failure(e, node_).dump()));
    }
    return true;
  }
  if (int sig = signals_.take()) {
    signal_ = sig;
    std::string mine = launcher_stop(node_, sig).dump();
    std::string stands = rdzv_.lost() ? mine : rdzv_.report_failure(round_, mine);
    // Forward the signal; a second SIGINT (or any signal after it) kills at once.
    group_.signal_all(sig);
    if (++interrupts_ > 1 || sig != SIGINT) {
      group_.terminate(sig == SIGINT ? milliseconds(0) : o_.grace_period);
    } else {
      Deadline deadline(o_.grace_period);
      while (group_.running() > 0 && !deadline.expired()) {
        group_.poll(std::min(o_.monitor_interval, deadline.remaining()), signals_.fd());
        if (signals_.take() != 0) break;  // second signal: no more grace
      }
      group_.terminate(milliseconds(0));
    }
    outcome = json::parse(stands);
    return true;
  }
  std::optional<std::string> failure = rdzv_.lost();
  if (!failure) failure = rdzv_.failure(round_);
  if (failure) {
    outcome = stop_for(*failure);
    return true;
  }
  if (group_.running() == 0) {
    if (!done_reported) {
      if (stopped_) {
        rdzv_.report_stopped(round_);
      } else {
        rdzv_.report_done(round_);
      }
      done_reported = true;
    }
    if (!stopped_ && rdzv_.all_done(round_)) return true;  // outcome stays null: success
  }
  return false;
}

}  // namespace chorus::run
