// The launchers of one job meet in a store that the launcher of node 0 hosts (chorus's
// own workers use the same store, through CHORUS_STORE_ADDR/CHORUS_STORE_PORT). Keys
// live under "chorusrun/<rdzv id>/".
//
//   node/<k>                    host of node k's launcher (join)
//   round/<r>/worker_port       the workers' MASTER_PORT in attempt r (set by node 0
//                               before its ready key, as torchrun's c10d rendezvous
//                               publishes it)
//   round/<r>/ready/<k>         node k is ready to start attempt r
//   round/<r>/failure           the first failure of attempt r (first writer wins), JSON
//   round/<r>/done/<k>          every worker of node k exited 0 in attempt r
//   left/<k>                    node k's launcher is about to exit (node 0 waits for
//                               these, or their connections' end, before taking the
//                               store down)
//   alive/<k>, beat/<k>, lost   the launchers keep each other alive (liveness.h)
//
// Every wait is sliced so that the caller's `interrupted` callback is asked at least
// every 100 ms (signals), and each has a deadline; a lost launcher (lost()) ends it too.
// Errors: TimeoutError naming the nodes that never came; StoreError when node 0's store
// is gone before every node joined.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "chorus/store.h"
#include "comm/common/deadline.h"
#include "run/attempt.h"
#include "run/liveness.h"
#include "run/options.h"

namespace chorus::run {

// The job token the store is guarded with: CHORUS_JOB_TOKEN, else the rdzv id.
std::string job_token(const LaunchOptions& options);
// "chorusrun/<rdzv id>", the prefix of the launchers' keys.
std::string rdzv_prefix(const LaunchOptions& options);
// A port free on `host` and on the wildcard address at this moment (the workers'
// MASTER_PORT of an attempt).
uint16_t pick_worker_port(const std::string& host);

class LauncherRendezvous : public RoundControl {
 public:
  // Node 0 starts the store server on master_addr:master_port (throws SystemError
  // naming address:port when that fails); every node connects to it.
  LauncherRendezvous(const LaunchOptions& options, std::chrono::milliseconds connect_timeout);
  ~LauncherRendezvous() override;

  // Registers this node and waits until all nodes have. `interrupted` returning true
  // stops the wait (returns false). Then the launchers watch each other (liveness.h).
  // From here on, store calls are bounded by the heartbeat timeout.
  bool join(const std::function<bool()>& interrupted);
  // Each node's --nproc-per-node, by node rank (after join()).
  const std::vector<int>& node_nprocs() const { return nprocs_; }

  // Barrier before attempt `round`; false when interrupted or a launcher was lost.
  // Node 0 first picks the attempt's worker port — a port free on master_addr, and on
  // the wildcard address where a PyTorch TCPStore binds, at that moment (bound as port
  // 0, then closed) — and publishes it.
  bool ready(int round, const std::function<bool()>& interrupted);
  // The MASTER_PORT of attempt `round`'s workers; call after ready(round) returned true.
  uint16_t worker_port(int round);

  void report_done(int round) override;
  bool all_done(int round) override;

  // Says this node is leaving; on node 0 also waits (up to `linger`) until every other
  // node has left or its connection has closed, so that they can still read the store.
  // Touches no store that is lost.
  void leave(std::chrono::milliseconds linger);

 private:
  bool wait_all(const std::string& what, const std::vector<std::string>& keys,
                const std::function<bool()>& interrupted);
  bool wait_all_keys(const std::string& what, const std::vector<std::string>& keys,
                     const std::function<bool()>& interrupted, const Deadline& deadline);
  std::vector<std::string> node_keys(const std::string& prefix) const;

  const LaunchOptions& options_;
  std::chrono::milliseconds connect_timeout_;
  std::unique_ptr<TcpStoreServer> server_;
  std::vector<int> nprocs_;
};

}  // namespace chorus::run
