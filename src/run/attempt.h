// One attempt (round) of the job on this node: its workers started, watched together
// with the other nodes through the launchers' rendezvous, and stopped on the first
// failure anywhere. Shared by the fixed job (supervisor.cc) and the elastic one
// (elastic_job.cc).
#pragma once

#include <signal.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "chorus/store.h"
#include "run/environment.h"
#include "run/liveness.h"
#include "run/options.h"
#include "run/workers.h"

namespace chorus::run {

// What an attempt asks of the launchers' rendezvous (rendezvous.h, elastic.h), which
// sets store_ (node 0's store, under the rendezvous prefix) and liveness_. Every failure
// is JSON text: kind "worker", "launcher" (lost), "signal" or, in an elastic job, "join"
// (a node waits to be admitted).
class RoundControl {
 public:
  virtual ~RoundControl();
  // A launcher found lost in this round, if any. Never waits.
  std::optional<std::string> lost() const { return liveness_->lost(); }
  // lost(), after a full round of liveness checks that started after this call.
  std::optional<std::string> settle_lost() { return liveness_->settle(); }
  // Converts a store call's failure on this node into node 0's loss (not on node 0).
  std::optional<std::string> store_failed(const std::exception& e) {
    return liveness_->store_failed(e);
  }
  // Publishes `failure` as the first of `round` (round/<r>/failure) unless another
  // node was first; returns the one that stands.
  std::string report_failure(int round, const std::string& failure);
  // The failure of `round`, if any. Never waits.
  virtual std::optional<std::string> failure(int round);
  virtual void report_done(int round) = 0;
  virtual bool all_done(int round) = 0;
  // An elastic round whose workers were asked to stop at their next checkpoint
  // (chorus/elastic.h): whether they were, and this node's report that its workers did.
  virtual bool stop_requested(int /*round*/) { return false; }
  virtual void report_stopped(int /*round*/) {}

 protected:
  std::shared_ptr<PrefixStore> store_;
  std::unique_ptr<Liveness> liveness_;
};

// SIGINT, SIGTERM and SIGHUP arrive on a signalfd, so the main loop sees them between
// two polls instead of in a handler. Blocked signals are reset in the workers.
class Signals {
 public:
  Signals();
  ~Signals();
  int fd() const { return fd_; }
  // The next pending signal, 0 when none.
  int take();

 private:
  sigset_t set_, old_;
  int fd_ = -1;
};

// Where this node's workers stand in one round.
struct RoundShape {
  // CHORUS_RESTART_COUNT (and TORCHELASTIC_RESTART_COUNT): 0, 1, ..., one more every
  // time the workers are started again, whatever the reason (a failure, a lost node, a
  // node that joined); chorus's communicators key their rendezvous on it.
  int round = 0;
  int node_rank = 0;    // GROUP_RANK
  int nnodes = 1;       // GROUP_WORLD_SIZE
  int nproc = 1;        // LOCAL_WORLD_SIZE
  int rank_base = 0;    // the global rank of this node's local rank 0
  int world_size = 1;   // WORLD_SIZE
  uint16_t worker_port = 0;  // MASTER_PORT
  // The store key that asks the workers to stop at their next checkpoint (the
  // kStopAtCheckpointKeyVariable of chorus/elastic.h); empty: not asked for.
  std::string stop_key;
};

// This node's workers for one round, each with its complete environment.
std::vector<WorkerSpec> worker_specs(const LaunchOptions& o, const RoundShape& shape,
                                     const Environment& base);

// The report of this launcher told to stop by `signal`, as a failure's JSON.
nlohmann::json launcher_stop(int node, int signal);
// Prints a failure that ends the job ("chorusrun: job failed: ...") on stderr.
void print_summary(const nlohmann::json& failure);

class Attempt {
 public:
  Attempt(const LaunchOptions& o, RoundControl& rdzv, Signals& signals, int round, int node);
  ~Attempt();

  // Runs until the attempt succeeded on every node (returns null) or failed somewhere
  // (returns the failure that stands).
  std::optional<nlohmann::json> run(const std::vector<WorkerSpec>& specs);
  // The signal this launcher received during the attempt, 0 when none.
  int signalled() const { return signal_; }

 private:
  bool step(bool& done_reported, std::optional<nlohmann::json>& outcome);
  std::optional<nlohmann::json> stop_for(const std::string& failure_text);

  const LaunchOptions& o_;
  RoundControl& rdzv_;
  Signals& signals_;
  int round_;
  int node_;
  WorkerGroup group_;
  int interrupts_ = 0;
  int signal_ = 0;
  bool stopped_ = false;  // a worker stopped at a checkpoint, as asked
};

}  // namespace chorus::run
