// An elastic job (--nnodes MIN:MAX with MIN < MAX): rounds of MIN to MAX nodes. Node 0's
// launcher hosts the store, as in a fixed job, and decides every round; its loss ends
// the job. Keys, under the rendezvous prefix (rendezvous.h):
//
//   members              a counter: each other launcher takes the next member id from
//                        it as it joins (1, 2, ...; node 0 is id 0), so ids are in join
//                        order
//   member/<id>          "NPROC HOST [ADDR]" of that launcher (ADDR: its --local-addr)
//   alive/<id>, beat/<id>, left/<id>   liveness.h, by member id
//   latest               the number of the latest plan/<r>
//   plan/<r>             round r, as node 0 decided it (JSON): the nodes in node-rank
//                        order (node 0, then the others by member id: join order), the
//                        workers' MASTER_PORT, the restarts used, whether node 0 has
//                        --join-at-checkpoint (every node then tells its workers the
//                        key below); or the job's end
//                        ("end": the failure every launcher reports, or kind "finished")
//   round/<r>/ready/<id>, round/<r>/done/<id>, round/<r>/failure   as in a fixed job
//   round/<r>/lost       the round's lost launcher (liveness.h)
//   round/<r>/stop-at-checkpoint   set by node 0 when a node joins, with
//                        --join-at-checkpoint: the workers stop at their next checkpoint
//                        (chorus/elastic.h); round/<r>/stopped/<id>: that node's did
//
// Round r: node 0 takes the launchers that joined, are alive and were not lost (at least
// MIN, waiting up to the join timeout for them; before round 0 also up to the last call
// for more, up to MAX), publishes plan/<r>, and the nodes in it start their workers.
// The round ends on its first failure: a worker's, a lost launcher's, a signal, or — on
// node 0, while the round has fewer than MAX nodes — a launcher waiting to be admitted
// ("join"). Then node 0 decides round r + 1 without the lost or stopped launchers. A
// failure or loss uses up one of --max-restarts; a join does not (as in torchrun).
// With --join-at-checkpoint S, node 0 first asks the round's workers to stop at their
// next checkpoint, and ends the round with the join once every node's workers did, or
// after S seconds (then they are stopped as without the option).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "chorus/store.h"
#include "run/attempt.h"
#include "run/liveness.h"
#include "run/options.h"

namespace chorus::run {

struct ElasticNode {
  int id = 0;
  int nproc = 1;
  std::string host;
  std::string addr;  // --local-addr, if given
};

struct ElasticPlan {
  std::optional<nlohmann::json> end;  // the job ends instead (see above)
  std::vector<ElasticNode> nodes;     // by node rank
  int restarts = 0;
  uint16_t worker_port = 0;
  bool stop_at_checkpoint = false;  // node 0's --join-at-checkpoint is on
  // The node rank of member `id` in this round, -1 when it is not in it.
  int node_of(int id) const;
};

class ElasticRendezvous : public RoundControl {
 public:
  // Node 0 starts the store; every launcher connects, takes its member id and says it
  // is alive. Throws as LauncherRendezvous does.
  ElasticRendezvous(const LaunchOptions& options, std::chrono::milliseconds connect_timeout);
  ~ElasticRendezvous() override;
  int id() const { return id_; }

  // Round `round`. Node 0 decides it from `previous`, the failure that ended the round
  // before (null for round 0), and publishes it; the others wait for it (up to the join
  // timeout, the last call, the grace period and the connect timeout together; then
  // TimeoutError). Null when `interrupted` returned true.
  std::optional<ElasticPlan> plan(int round, const std::optional<nlohmann::json>& previous,
                                  const std::function<bool()>& interrupted);
  // The round to ask plan() for first: 0 on node 0; elsewhere the latest one node 0
  // published (a launcher that arrives late skips the rounds before).
  int first_round();
  // Node 0: publishes the job's end as plan/<round>, for the launchers still waiting.
  void publish_end(int round, const nlohmann::json& end);
  // Barrier of the plan's nodes before the round; watches them from here on. False
  // when interrupted or one was lost (lost() says which).
  bool ready(int round, const std::function<bool()>& interrupted);
  // After the round: stops watching.
  void end_round() { liveness_->reset(); }

  // On node 0 also: a launcher waiting to be admitted, while the round has room.
  std::optional<std::string> failure(int round) override;
  void report_done(int round) override;
  bool all_done(int round) override;
  bool stop_requested(int round) override;
  void report_stopped(int round) override;
  // The key of round `round` that asks its workers to stop at their next checkpoint, as
  // the workers name it (with the rendezvous prefix); empty when the plan does not
  // ask for that mode.
  std::string stop_key(int round) const;

  // As LauncherRendezvous::leave; node 0 waits for the members still alive.
  void leave(std::chrono::milliseconds linger);

 private:
  ElasticPlan decide(int round, const std::optional<nlohmann::json>& previous,
                     const std::function<bool()>& interrupted);
  std::vector<ElasticNode> candidates();
  ElasticNode member(int id);
  std::optional<ElasticPlan> wait_plan(int round, const std::function<bool()>& interrupted);
  std::vector<std::string> plan_keys(int round, const std::string& what) const;

  const LaunchOptions& o_;
  std::chrono::milliseconds connect_timeout_;
  std::unique_ptr<TcpStoreServer> server_;
  int id_ = 0;
  ElasticPlan plan_;        // the current round's
  // Node 0: the launchers lost, stopped or gone (never admitted again), and the
  // restarts used.
  std::set<int> excluded_;
  int restarts_ = 0;
  // Node 0, with --join-at-checkpoint: the join that waits for this round's workers to
  // stop at their checkpoint, and until when.
  std::optional<nlohmann::json> pending_join_;
  std::chrono::steady_clock::time_point stop_deadline_;
};

// The elastic job's main loop (run_job for o.elastic()).
int run_elastic_job(const LaunchOptions& o, Signals& signals);

}  // namespace chorus::run
