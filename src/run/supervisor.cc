#include "run/supervisor.h"

#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "chorus/error.h"
#include "comm/common/auth.h"
#include "comm/common/deadline.h"
#include "comm/common/hex.h"
#include "comm/common/settings.h"
#include "comm/common/socket.h"
#include "run/program.h"
#include "run/rendezvous.h"
#include "run/workers.h"

namespace chorus::run {
namespace {

using json = nlohmann::json;
using std::chrono::milliseconds;

// SIGINT, SIGTERM and SIGHUP arrive on a signalfd, so the main loop sees them between
// two polls instead of in a handler. Blocked signals are reset in the workers.
class Signals {
 public:
  Signals() {
    sigemptyset(&set_);
    for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&set_, s);
    sigprocmask(SIG_BLOCK, &set_, &old_);
    fd_ = signalfd(-1, &set_, SFD_NONBLOCK | SFD_CLOEXEC);
  }
  ~Signals() {
    if (fd_ >= 0) close(fd_);
    sigprocmask(SIG_SETMASK, &old_, nullptr);
  }
  int fd() const { return fd_; }
  // The next pending signal, 0 when none.
  int take() {
    signalfd_siginfo info;
    if (read(fd_, &info, sizeof info) == sizeof info) return static_cast<int>(info.ssi_signo);
    return 0;
  }

 private:
  sigset_t set_, old_;
  int fd_ = -1;
};

json worker_failure(const WorkerExit& e, int node) {
  return json{{"kind", "worker"},        {"rank", e.rank},
              {"node", node},            {"local_rank", e.local_rank},
              {"pid", e.pid},            {"host", net::hostname()},
              {"how", e.describe()},     {"status", e.status_code()},
              {"time", local_time_text(e.when)}, {"last_lines", e.last_lines}};
}

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
std::map<std::string, std::string> worker_env(const LaunchOptions& o, int local_rank, int round,
                                              uint16_t worker_port, const Environment& base,
                                              int cpus) {
  std::map<std::string, std::string> env(base.begin(), base.end());
  int rank = o.node_rank * o.nproc_per_node + local_rank;
  env["RANK"] = std::to_string(rank);
  env["LOCAL_RANK"] = std::to_string(local_rank);
  env["WORLD_SIZE"] = std::to_string(o.nnodes * o.nproc_per_node);
  env["LOCAL_WORLD_SIZE"] = std::to_string(o.nproc_per_node);
  env["GROUP_RANK"] = std::to_string(o.node_rank);
  env["GROUP_WORLD_SIZE"] = std::to_string(o.nnodes);
  env["MASTER_ADDR"] = o.master_addr;
  env["MASTER_PORT"] = std::to_string(worker_port);
  env["CHORUS_STORE_ADDR"] = o.master_addr;
  env["CHORUS_STORE_PORT"] = std::to_string(o.master_port);
  env["CHORUS_STORE_HOSTED"] = "1";
  env["CHORUS_RESTART_COUNT"] = std::to_string(round);
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
    env["OMP_NUM_THREADS"] = std::to_string(std::max(1, cpus / o.nproc_per_node));
  }
  if (!o.local_addr.empty()) env["CHORUS_IF_IP"] = o.local_addr;
  // A worker's stdout is a pipe to the launcher; this says whether the launcher's is a
  // terminal, so that a program may draw a progress bar (chorus-mnist does).
  if (contains(console_terminals(o), 0)) {
    env["CHORUS_STDOUT_TERMINAL"] = "1";
  } else {
    env.erase("CHORUS_STDOUT_TERMINAL");
  }
  return env;
}

// One attempt of the job on this node.
class Attempt {
 public:
  Attempt(const LaunchOptions& o, LauncherRendezvous& rdzv, Signals& signals, int round)
      : o_(o), rdzv_(rdzv), signals_(signals), round_(round),
        group_(OutputOptions{o.tee, o.redirects, o.log_dir, 20, console_terminals(o)}) {}

  // Runs until the attempt succeeded on every node (returns null) or failed somewhere
  // (returns the failure that stands).
  std::optional<json> run(const std::vector<WorkerSpec>& specs);

 private:
  bool step(bool& done_reported, std::optional<json>& outcome);
  std::optional<json> stop_for(const std::string& failure_text);

  const LaunchOptions& o_;
  LauncherRendezvous& rdzv_;
  Signals& signals_;
  int round_;
  WorkerGroup group_;
  int interrupts_ = 0;
};

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
    // A worker that failed because another node's launcher died (its peers went with
    // it) is not the cause: the launchers' checks get a turn to say so first.
    if (auto lost = rdzv_.settle_lost()) {
      outcome = stop_for(*lost);
    } else {
      outcome = stop_for(rdzv_.report_failure(round_, worker_failure(e, o_.node_rank).dump()));
    }
    return true;
  }
  if (int sig = signals_.take()) {
    std::string mine = launcher_stop(o_.node_rank, sig).dump();
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
      rdzv_.report_done(round_);
      done_reported = true;
    }
    if (rdzv_.all_done(round_)) return true;  // outcome stays null: success
  }
  return false;
}

}  // namespace

// The job token guards the store and every data connection (comm/common/auth.h). A
// standalone job, whose processes all descend from this one, gets a fresh random token
// unless the user chose one, so no other process on the machine can join it. A job of
// several nodes needs a secret the nodes share: its token is the rdzv id unless
// CHORUS_JOB_TOKEN is set, and the default id is no secret, which is said once.
static void choose_job_token(const LaunchOptions& o) {
  if (!settings::job_token().empty()) return;
  auto source = o.source.find("rdzv_id");
  const bool default_id = source == o.source.end() || source->second == "default";
  if (o.standalone && default_id) {
    auth::Nonce random = auth::make_nonce();
    std::string token = hex::encode(random.data(), random.size());
    ::setenv("CHORUS_JOB_TOKEN", token.c_str(), 1);
  } else if (o.nnodes > 1 && default_id) {
    std::cerr << "chorusrun: warning: the job token is the default --rdzv-id '" << o.rdzv_id
              << "', which any process that reaches the store can present; set "
                 "CHORUS_JOB_TOKEN (or --rdzv-id) to a secret shared by the nodes\n";
  }
}

int run_job(const LaunchOptions& options_in) {
  LaunchOptions o = options_in;
  const int cpus = std::max(1u, std::thread::hardware_concurrency());
  Signals signals;
  bool stop_requested = false;
  int stop_signal = 0;
  auto interrupted = [&] {
    if (int s = signals.take()) {
      stop_requested = true;
      stop_signal = s;
    }
    return stop_requested;
  };
  try {
    if (o.standalone) {
      o.master_addr = "127.0.0.1";
      // --standalone picks the store's port unless one was chosen (--master-port, its
      // variables, or an exported MASTER_PORT), as 0 asks it to.
      if (o.master_port == 0 || o.source["master_port"] == "default") {
        net::Fd probe = net::listen_on("127.0.0.1", 0);
        o.master_port = net::local_address(probe.get()).port();
      }
    }
    choose_job_token(o);
    LauncherRendezvous rdzv(o, settings::connect_timeout());
    // After a failure, how long node 0 keeps the store up for nodes still stopping
    // their workers (they read the failure, then take up to a grace period).
    const milliseconds linger = std::max<milliseconds>(std::chrono::seconds(10),
                                                       o.grace_period + std::chrono::seconds(5));
    auto lost_launcher = [&] {
      print_summary(json::parse(*rdzv.lost()));
      rdzv.leave(linger);
      return 1;
    };
    if (!rdzv.join(interrupted)) return rdzv.lost() ? lost_launcher() : 128 + stop_signal;
    const Environment base = current_environment();
    for (int round = 0;; ++round) {
      if (!rdzv.ready(round, interrupted)) return rdzv.lost() ? lost_launcher() : 128 + stop_signal;
      const uint16_t worker_port = rdzv.worker_port(round);
      std::vector<WorkerSpec> specs;
      const std::vector<int> allowed = allowed_cpus();
      for (int l = 0; l < o.nproc_per_node; ++l) {
        WorkerSpec s;
        s.rank = o.node_rank * o.nproc_per_node + l;
        s.local_rank = l;
        s.argv = worker_command(o, l);
        s.env = worker_env(o, l, round, worker_port, base, cpus);
        s.cpus = cpus_for(o.cpu_bind, l, o.nproc_per_node, allowed);
        specs.push_back(std::move(s));
      }
      Attempt attempt(o, rdzv, signals, round);
      std::optional<json> failure = attempt.run(specs);
      // A launcher lost meanwhile is the cause of the workers' failures, wherever read.
      if (failure && (*failure)["kind"] == "worker" && rdzv.lost()) failure = json::parse(*rdzv.lost());
      if (!failure) {
        rdzv.leave(settings::connect_timeout());
        return 0;
      }
      bool worker_failed = (*failure)["kind"] == "worker";
      if (worker_failed && round < o.max_restarts) {
        std::cerr << "chorusrun: attempt " << round << " failed (rank "
                  << (*failure)["rank"].get<int>() << ": " << (*failure)["how"].get<std::string>()
                  << "); restarting all nodes (" << round + 1 << " of " << o.max_restarts
                  << " restarts)" << std::endl;
        continue;
      }
      print_summary(*failure);
      rdzv.leave(linger);
      return (*failure)["status"].get<int>();
    }
  } catch (const std::exception& e) {
    std::cerr << "chorusrun (node " << o.node_rank << "): " << e.what() << std::endl;
    return 1;
  }
}

}  // namespace chorus::run
