// The accepting side of a tcp transport: every other rank's connection to this one
// (its `in` stream), accepted and authenticated on a thread of its own from right after
// listen() until the transport closes. Ranks connect when they first send to this one
// (connections by use, mesh.cc), so connections arrive at any time in the life of the
// communicator, and the thread hands each to the transport through a mailbox and an
// eventfd the transport polls.
//
// One poll() loop runs every handshake at once (ServerHandshake, handshake.h), each
// with its own deadline, as the store server does: a connection that says nothing, or
// a byte now and then, holds up no other. Connections that have not authenticated are
// held at most kMaxUnauthenticated at a time; a new one beyond that closes the oldest
// of those that sent no HELLO yet (else the oldest), so that a flood of connections
// cannot use up this process's file descriptors. The old acceptor handshook one
// connection at a time, each with 10 s: 8 silent connections to each data port of a
// 3-rank job made its start-up fail at the 120 s connect timeout (issue 21); with 300
// silent, 4 slow and 16 impostor connections to each port, a 3-rank group forms
// within milliseconds of its last rank's arrival (startup_test).
#pragma once

#include <atomic>
#include <condition_variable>
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

// How a transport that aborted or closed refuses the connections that come after
// (Acceptor::refuse_all), so that the connecting rank can name what happened: the
// first followed by the abort's reason; the second alone.
inline constexpr char kAbortedRefusal[] = "aborted: ";
inline constexpr char kClosedRefusal[] = "left the communicator (closed it)";

// The most connections a rank holds that have not authenticated yet.
inline constexpr int kMaxUnauthenticated = 256;
// How long one connection has to complete its handshake.
inline constexpr std::chrono::seconds kHandshakeTimeout{10};

class Acceptor {
 public:
  // Starts accepting on `listener` for rank expected.rank of expected.size.
  // Connections from addresses `allowlist` does not name are refused.
  Acceptor(net::Fd listener, Expected expected, std::shared_ptr<const net::AllowList> allowlist);
  // Stops the thread if it still runs.
  ~Acceptor();
  Acceptor(const Acceptor&) = delete;
  Acceptor& operator=(const Acceptor&) = delete;

  // Readable (POLLIN) while connections wait in the mailbox.
  int ready_fd() const { return ready_.get(); }
  // How many connections the thread has handed over so far: a transport that has taken
  // as many has nothing to take.
  uint64_t delivered() const { return delivered_.load(std::memory_order_acquire); }
  // Moves the connections authenticated since the last call into `arrived`, each with
  // its rank. Rethrows what ended the thread, if anything did.
  void take(std::vector<std::pair<int, net::Fd>>& arrived);

  // From now on every connection is refused with `why`, once it has sent its HELLO (a
  // transport that aborted or closed: a peer that connects to it learns why from the
  // refusal). The words are the peer's to interpret (kAbortedRefusal, kClosedRefusal).
  // Returns once the thread has taken it in: every connection accepted before is in the
  // mailbox then (take() finds it), and every later one is refused.
  void refuse_all(const std::string& why);

  // Stops accepting: the thread ends, telling the connections it still holds `why`
  // (within a second at most), and closes the port.
  void stop(const std::string& why);
  // "ip:port", the address this rank published.
  const std::string& listening() const { return listening_; }
  // The last connection refused, "address: why" (empty when none was).
  std::string last_refusal() const;

 private:
  struct Pending;
  void run();
  void loop();
  void accept_new();
  void serve(Pending& pending);
  void evict_one();
  void drain(const std::string& why);
  void refused(const net::SockAddr& from, const std::string& why);

  net::Fd listener_;
  std::string listening_;  // "ip:port", the address this rank published for its peers
  net::Fd wakeup_;  // eventfd: stop() makes poll() return
  net::Fd ready_;   // eventfd: readable while the mailbox holds connections
  Expected expected_;
  std::shared_ptr<const net::AllowList> allowlist_;
  std::thread thread_;

  mutable std::mutex mutex_;
  std::string stop_reason_;                          // guarded by mutex_
  std::vector<std::pair<int, net::Fd>> mailbox_;    // guarded by mutex_
  std::string last_refusal_;                         // guarded by mutex_
  std::exception_ptr error_;                         // guarded by mutex_
  std::atomic<uint64_t> delivered_{0};
  std::atomic<bool> stopping_{false};
  std::atomic<bool> refusing_{false};
  std::string refusing_why_;  // guarded by mutex_; set before refusing_
  bool refusal_seen_ = false;  // guarded by mutex_: the thread took refuse_all() in
  bool running_ = false;       // guarded by mutex_: the thread has not ended
  std::condition_variable seen_;

  // The thread's own.
  std::vector<bool> claimed_;  // authenticated: their ACCEPTED is being sent or was
  std::vector<std::unique_ptr<Pending>> pending_;  // in the order they were accepted
  bool warned_full_ = false;    // that the bound was reached
  bool warned_accept_ = false;  // that accept() failed
};

}  // namespace chorus::transport::tcp
