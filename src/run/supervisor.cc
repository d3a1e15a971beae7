#include "run/supervisor.h"

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>

#include "chorus/error.h"
#include "comm/common/auth.h"
#include "comm/common/deadline.h"
#include "comm/common/hex.h"
#include "comm/common/settings.h"
#include "comm/common/socket.h"
#include "run/attempt.h"
#include "run/elastic.h"
#include "run/rendezvous.h"

namespace chorus::run {

using json = nlohmann::json;
using std::chrono::milliseconds;

// The job token guards the store and every data connection (comm/common/auth.h). A
// standalone job, whose processes all descend from this one, gets a fresh random token
// unless the user chose one, so no other process on the machine can join it. A job of
// several nodes needs a secret the nodes share: its token is the rdzv id unless
// CHORUS_JOB_TOKEN is set, and the default id is no secret, which is said once.
void choose_job_token(const LaunchOptions& o) {
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
    if (o.elastic()) return run_elastic_job(o, signals);
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
      RoundShape shape;
      shape.round = round;
      shape.node_rank = o.node_rank;
      shape.nnodes = o.nnodes;
      shape.nproc = o.nproc_per_node;
      shape.world_size = 0;
      for (int k = 0; k < o.nnodes; ++k) {
        if (k < o.node_rank) shape.rank_base += rdzv.node_nprocs()[k];
        shape.world_size += rdzv.node_nprocs()[k];
      }
      shape.worker_port = rdzv.worker_port(round);
      Attempt attempt(o, rdzv, signals, round, o.node_rank);
      std::optional<json> failure = attempt.run(worker_specs(o, shape, base));
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
