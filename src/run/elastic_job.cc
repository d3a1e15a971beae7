// The main loop of an elastic job (elastic.h): rounds until one succeeds on every node,
// the job runs out of restarts or nodes, or this launcher is told to stop.
#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>

#include "chorus/error.h"
#include "comm/common/settings.h"
#include "run/attempt.h"
#include "run/elastic.h"

namespace chorus::run {
namespace {

using json = nlohmann::json;
using std::chrono::milliseconds;

// "4 nodes (hosts a, b, c, d), world size 8".
std::string describe_round(const ElasticPlan& p) {
  std::string hosts;
  int world = 0;
  for (const ElasticNode& n : p.nodes) {
    hosts += (hosts.empty() ? "" : ", ") + n.host + (n.nproc > 1 ? " x" + std::to_string(n.nproc) : "");
    world += n.nproc;
  }
  return std::to_string(p.nodes.size()) + " node(s) (" + hosts + "), world size " +
         std::to_string(world);
}

// Why a round ended, for the line that announces the next.
std::string describe_end(const json& f) {
  const std::string kind = f.value("kind", "");
  if (kind == "join") {
    const std::string stopped = f.value("stopped", "");
    return "a node joined (host " + f.value("host", "") + ")" +
           (stopped == "at_checkpoint" ? "; the workers stopped at their checkpoint"
            : stopped == "timeout"
                ? "; the workers reached no checkpoint within " + f.value("wait", "") +
                      " s (--join-at-checkpoint) and were stopped"
                : "");
  }
  if (kind == "launcher") {
    return "the launcher of node " + std::to_string(f.value("node", -1)) + " (host " +
           f.value("host", "") + ") was lost: " + f.value("how", "");
  }
  if (kind == "worker") {
    return "rank " + std::to_string(f.value("rank", -1)) + " (node " +
           std::to_string(f.value("node", -1)) + ") ended with " + f.value("how", "");
  }
  if (kind == "signal") {
    return "the launcher of node " + std::to_string(f.value("node", -1)) + " received " +
           f.value("how", "");
  }
  return f.dump();
}

RoundShape shape_of(const ElasticPlan& p, int round, int node) {
  RoundShape s;
  s.round = round;
  s.node_rank = node;
  s.nnodes = static_cast<int>(p.nodes.size());
  s.nproc = p.nodes[node].nproc;
  s.world_size = 0;
  for (int k = 0; k < s.nnodes; ++k) {
    if (k < node) s.rank_base += p.nodes[k].nproc;
    s.world_size += p.nodes[k].nproc;
  }
  s.worker_port = p.worker_port;
  return s;
}

}  // namespace

int run_elastic_job(const LaunchOptions& o, Signals& signals) {
  int stop_signal = 0;
  auto interrupted = [&] {
    if (int s = signals.take()) stop_signal = s;
    return stop_signal != 0;
  };
  ElasticRendezvous rdzv(o, settings::connect_timeout());
  const milliseconds linger = std::max<milliseconds>(std::chrono::seconds(10),
                                                     o.grace_period + std::chrono::seconds(5));
  const Environment base = current_environment();
  std::optional<json> previous;
  for (int round = rdzv.first_round();; ++round) {
    std::optional<ElasticPlan> plan = rdzv.plan(round, previous, interrupted);
    if (!plan) {  // told to stop while waiting
      if (rdzv.id() == 0) rdzv.publish_end(round, launcher_stop(0, stop_signal));
      rdzv.leave(linger);
      return 128 + stop_signal;
    }
    if (plan->end) {
      const json& end = *plan->end;
      rdzv.leave(linger);
      if (end.value("kind", "") == "finished") {
        std::cerr << "chorusrun: the job finished before this node was admitted" << std::endl;
        return 0;
      }
      if (end.value("kind", "") == "rendezvous") {
        std::cerr << "chorusrun: job failed: " << end.value("how", "") << std::endl;
      } else {
        print_summary(end);
      }
      return end.value("status", 1);
    }
    const int node = plan->node_of(rdzv.id());
    if (node < 0) {
      // Joined after the round was planned, or the job runs on MAX nodes: the next one.
      std::cerr << "chorusrun: round " << round << " runs without this node ("
                << describe_round(*plan) << "); waiting for the next" << std::endl;
      continue;
    }
    std::cerr << "chorusrun: " << local_time_text(std::chrono::system_clock::now()) << " round "
              << round << ": " << describe_round(*plan) << "; this is node " << node << "; "
              << plan->restarts << " of " << o.max_restarts << " restarts after failures used"
              << (previous ? "; the round before ended: " + describe_end(*previous) : "")
              << std::endl;
    std::optional<json> failure;
    if (!rdzv.ready(round, interrupted)) {
      if (stop_signal != 0) {
        failure = launcher_stop(node, stop_signal);
        rdzv.report_failure(round, failure->dump());
      } else if (rdzv.lost()) {
        failure = json::parse(*rdzv.lost());
      } else {
        failure = json::parse(*rdzv.RoundControl::failure(round));
      }
    } else {
      Attempt attempt(o, rdzv, signals, round, node);
      RoundShape shape = shape_of(*plan, round, node);
      shape.stop_key = rdzv.stop_key(round);
      failure = attempt.run(worker_specs(o, shape, base));
      if (attempt.signalled() != 0) stop_signal = attempt.signalled();
    }
    // A launcher lost meanwhile is the cause of the workers' failures, wherever read.
    if (failure && (*failure)["kind"] == "worker" && rdzv.lost()) failure = json::parse(*rdzv.lost());
    const bool node0_lost = rdzv.lost() && json::parse(*rdzv.lost()).value("id", -1) == 0;
    rdzv.end_round();
    if (!failure) {
      if (rdzv.id() == 0) {
        rdzv.publish_end(round + 1, json{{"kind", "finished"}});
        rdzv.leave(linger);
      } else {
        rdzv.leave(settings::connect_timeout());
      }
      return 0;
    }
    // This launcher was told to stop, or node 0 (the store) is gone: the job ends here.
    if (stop_signal != 0 || node0_lost) {
      if (rdzv.id() == 0) rdzv.publish_end(round + 1, *failure);
      print_summary(*failure);
      rdzv.leave(linger);
      return stop_signal != 0 ? 128 + stop_signal : (*failure)["status"].get<int>();
    }
    previous = failure;
  }
}

}  // namespace chorus::run
