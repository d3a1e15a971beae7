// The accepting side of a tcp mesh's start-up: every other rank's connection to this
// one (its `in` stream), accepted and authenticated on a thread of its own from right
// after listen() until each rank has one, while this rank's own connections go out.
//
// One poll() loop runs every handshake at once (ServerHandshake, handshake.h), each
// with its own deadline, as the store server does: a connection that says nothing, or
// a byte now and then, holds up no other. Connections that have not authenticated are
// held at most kMaxUnauthenticated at a time; a new one beyond that closes the oldest
// of those that sent no HELLO yet (else the oldest), so that a flood of connections
// cannot use up this process's file descriptors. The old acceptor handshook one
// connection at a time, each with 10 s: 8 silent connections to each data port of a
// 3-rank job made its start-up fail at the 120 s connect timeout (issue 21); with 300
// silent, 4 slow and 16 impostor connections to each port, a 3-rank group now forms
// 13-17 ms after its last rank arrives (startup_test).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/common/deadline.h"
#include "comm/common/socket.h"
#include "comm/transport/tcp/handshake.h"

namespace chorus::net {
class AllowList;
}

namespace chorus::transport::tcp {

// The most connections a rank holds that have not authenticated yet.
inline constexpr int kMaxUnauthenticated = 256;
// How long one connection has to complete its handshake.
inline constexpr std::chrono::seconds kHandshakeTimeout{10};

class Acceptor {
 public:
  // Starts accepting on `listener` for rank expected.rank of expected.size, until
  // `deadline`. Connections from addresses `allowlist` does not name are refused.
  Acceptor(net::Fd listener, Expected expected, std::shared_ptr<const net::AllowList> allowlist,
           const Deadline& deadline);
  // Stops the thread if it still runs.
  ~Acceptor();
  Acceptor(const Acceptor&) = delete;
  Acceptor& operator=(const Acceptor&) = delete;

  // Waits until every other rank's connection has authenticated and returns them,
  // indexed by rank (this rank's own entry invalid). Throws TimeoutError at the
  // deadline naming the ranks that never connected, the address they were to reach
  // (a wrong interface is the usual cause) and the last refusal.
  std::vector<net::Fd> wait();

  // This rank gives up (its own connections failed): the thread stops, telling the
  // connections it still holds `why` (within a second at most). Afterwards,
  // unconnected() says which ranks had not connected yet.
  void stop(const std::string& why);
  // "rank R got no valid connection from rank(s) A B; last refused: ..." (empty when
  // every rank connected). Only once the thread ended (wait() or stop()).
  std::string unconnected() const;

 private:
  struct Pending;
  void run();
  void loop();
  void accept_new();
  void serve(Pending& pending);
  void dismiss(Pending& pending, const std::string& why);
  void evict_one();
  void drain(const std::string& why);
  void refused(const net::SockAddr& from, const std::string& why);
  std::string missing_ranks() const;
  std::string timeout_message() const;

  net::Fd listener_;
  std::string listening_;  // "ip:port", the address this rank published for its peers
  net::Fd wakeup_;  // eventfd: stop() makes poll() return
  Expected expected_;
  std::shared_ptr<const net::AllowList> allowlist_;
  Deadline deadline_;
  std::thread thread_;

  std::mutex mutex_;
  std::string stop_reason_;         // guarded by mutex_
  std::atomic<bool> stopping_{false};

  // The thread's own until it ends.
  std::vector<net::Fd> in_;
  std::vector<bool> claimed_;  // authenticated: their ACCEPTED is being sent or was
  int missing_ = 0;
  std::vector<std::unique_ptr<Pending>> pending_;  // in the order they were accepted
  std::string last_refusal_;
  bool warned_full_ = false;    // that the bound was reached
  bool warned_accept_ = false;  // that accept() failed
  std::exception_ptr error_;
};

}  // namespace chorus::transport::tcp
