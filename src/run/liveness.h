// The launchers of a job keep each other alive, through node 0's store. Keys, under
// the rendezvous prefix (rendezvous.h):
//
//   alive/<k>   written by node k's liveness connection, which stays open as long as
//               the launcher lives. The store holds it connection-scoped
//               (TcpStoreServerOptions::connection_scoped_prefix): it deletes the key as
//               soon as that connection closes, which the kernel does the moment the
//               launcher dies, SIGKILL included.
//   beat/<k>    a counter node k adds 1 to every heartbeat interval (a fifth of the
//               heartbeat timeout), for the deaths no connection shows: a host that
//               froze, lost its network, or a launcher that was stopped.
//   lost        the first launcher found lost, as JSON (first writer wins).
//
// Each launcher runs one thread that, every 100 ms, reads `lost` and checks the other
// nodes' alive keys: a node whose key is gone is lost. Every heartbeat interval it also
// beats; node 0, which hosts the store, then reads every other node's counter (one
// unchanged for the heartbeat timeout: that node is lost), and the others read node 0's.
// The others also count node 0 lost when its store closes their connection or does not
// answer within the heartbeat timeout. A node that has said it leaves (left/<k>) is
// never counted lost. The loss is every launcher's failure of the round
// (supervisor.cc), and the job's end: a lost node cannot come back.
//
// In an elastic job (elastic.h) <k> is a launcher's member id, not its node rank, the
// launchers watched are those of one round, and the lost key is that round's
// (round/<r>/lost): a loss ends the round, after which reset() gets ready for the next.
//
// The heartbeat timeout is CHORUS_HEARTBEAT_TIMEOUT (default 5 s, at least 0.5 s).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "chorus/store.h"
#include "run/options.h"

namespace chorus::run {

// CHORUS_HEARTBEAT_TIMEOUT: a plain number of seconds or a duration with a suffix
// (500ms, 5s); default 5 s. Throws ConfigError naming the variable for a bad value or
// one below 0.5 s.
std::chrono::milliseconds heartbeat_timeout();

// "YYYY-MM-DD HH:MM:SS" in local time, for failure reports.
std::string local_time_text(std::chrono::system_clock::time_point t);

// The report of a lost launcher, as the JSON text of a failure (supervisor.cc reads
// it): kind "launcher", its node and host, how it was found lost, and exit status 1;
// "id" is its member id (its node rank but in an elastic job).
std::string launcher_lost_report(int node, const std::string& host, const std::string& how,
                                 int id);

// A launcher watched: its member id, node rank (in this round) and host.
struct Peer {
  int id;
  int node;
  std::string host;
};

class Liveness {
 public:
  // Connects to the store (its own connection, whose calls are bounded by `timeout`)
  // and writes this node's alive key (alive/<self>). Call before this node joins, so
  // that the others never see it joined without one.
  Liveness(const LaunchOptions& options, int self, const std::string& job_token,
           const std::string& prefix, std::chrono::milliseconds connect_timeout,
           std::chrono::milliseconds timeout);
  ~Liveness();  // stops the thread
  Liveness(const Liveness&) = delete;
  Liveness& operator=(const Liveness&) = delete;

  // Starts watching, once every node has joined; `hosts` by node rank.
  void watch(const std::vector<std::string>& hosts);
  // Starts watching `peers` (this launcher among them), a loss going to `lost_key`.
  void watch(const std::vector<Peer>& peers, const std::string& lost_key);
  // Stops watching and forgets the loss found, for the next round's watch(); but node
  // 0's, whose store is gone for good (store_lost()).
  void reset();
  // The loss found so far (launcher_lost_report's text), if any. Never waits.
  std::optional<std::string> lost() const;
  // Waits (up to about a second) for a full round of checks that starts after this
  // call, and returns lost(): so that a worker's failure caused by a launcher's death
  // is put down to the launcher.
  std::optional<std::string> settle();
  // A call of this node on the store failed with `e` (StoreError: the connection
  // closed; TimeoutError: no answer in time). On node 0 nothing is lost (its own store);
  // elsewhere node 0 is, and its report is returned.
  std::optional<std::string> store_failed(const std::exception& e);
  // True when the lost launcher is node 0's: its store is gone, nothing may be asked
  // of it any more (a call would wait for a reconnection).
  bool store_lost() const;
  // The member id of the launcher found lost, -1 when none.
  int lost_node() const;
  // Stops the thread (this node leaves); the connection, and the alive key, stay.
  void stop();
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  void run();
  void sweep();
  void check_alive();
  void check_beats(std::chrono::steady_clock::time_point now);
  void publish(int node, const std::string& how);
  void record(const std::string& report, int node);
  const Peer& peer(int id) const;

  const LaunchOptions& o_;
  const int self_;  // this launcher's member id
  const std::chrono::milliseconds timeout_;
  std::shared_ptr<Store> store_;
  std::vector<Peer> peers_;
  std::string lost_key_ = "lost";
  std::vector<int> others_;  // every id but this one: their alive keys are checked
  // The nodes whose heartbeats this one watches (node 0: all others; the others: node
  // 0), their last counter value and when it last changed.
  std::vector<int> watched_;
  std::vector<int64_t> last_beat_;
  std::vector<std::chrono::steady_clock::time_point> last_change_;
  std::chrono::steady_clock::time_point next_beat_;

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool wake_ = false;
  uint64_t started_ = 0, finished_ = 0;  // sweeps
  std::optional<std::string> lost_;
  int lost_node_ = -1;
  std::thread thread_;
};

}  // namespace chorus::run
