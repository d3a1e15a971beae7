// The TCP store server's data: its keys and values, and the requests parked until
// their keys exist (GET of a missing key, WAIT) or their deadline passes. No sockets
// and no threads: the server's loop (tcp_store_server.cc) owns one ServerState and
// calls it from its one thread.
//
// Every request gets exactly one reply: apply() gives it at once, or parks the request
// and gives it later, as an Answer, once the request's keys all exist (take_answers(),
// right after the request that created the last of them) or once its deadline passed
// (expire()). A TIMEOUT answer counts the keys still missing and lists the first
// kMaxListedKeys of them.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "chorus/store.h"
#include "comm/store/tcp_store_protocol.h"

namespace chorus::store::server {

using Clock = std::chrono::steady_clock;

// Milliseconds from `now` until `deadline` for epoll_wait (rounded up, at least 0).
int ms_until(Clock::time_point deadline, Clock::time_point now);

// A parked GET or WAIT. `missing` counts its keys that do not exist right now.
struct Waiter {
  uint64_t client = 0;
  store::wire::Op op = store::wire::Op::kWait;
  std::vector<std::string> keys;  // distinct
  size_t missing = 0;
  Clock::time_point deadline;
  uint64_t timeout_ms = 0;
};

// Parked requests, indexed by the keys they wait for and by deadline. Key creation
// and deletion adjust each waiter's missing count, so waking costs O(waiters on key).
class WaiterTable {
 public:
  uint64_t park(Waiter waiter);
  // Returns the waiters whose last missing key this was.
  std::vector<uint64_t> key_created(const std::string& key);
  void key_deleted(const std::string& key);
  Waiter remove(uint64_t id);
  std::vector<uint64_t> expired(Clock::time_point now) const;
  // Milliseconds until the earliest deadline (rounded up), -1 when none.
  int next_timeout_ms(Clock::time_point now) const;

 private:
  void unindex(const std::string& key, uint64_t id);

  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, Waiter> waiters_;
  std::unordered_map<std::string, std::vector<uint64_t>> by_key_;
  std::set<std::pair<Clock::time_point, uint64_t>> by_deadline_;
};

// The reply a client is owed for its parked request.
struct Answer {
  uint64_t client = 0;
  store::wire::Reply reply;
};

class ServerState {
 public:
  // Keys starting with `connection_scoped_prefix` (none when empty) belong to the
  // client that last wrote them and are deleted by client_closed() (TcpStoreServerOptions).
  explicit ServerState(std::string connection_scoped_prefix = {})
      : scoped_prefix_(std::move(connection_scoped_prefix)) {}

  // Carries out `request` of `client` (a decoded request, within the wire's limits).
  // Returns its reply; or parks it and returns nullopt, with `*waiter` set to the id
  // that cancel() takes.
  std::optional<store::wire::Reply> apply(uint64_t client, store::wire::Request& request,
                                         uint64_t* waiter);
  // The answers of parked requests finished since the last call, in the order they
  // finished.
  std::vector<Answer> take_answers();
  // Finishes the parked requests whose deadline is `now` or earlier (TIMEOUT answers).
  void expire(Clock::time_point now);
  // Forgets a parked request (its client went away); no answer is given.
  void cancel(uint64_t waiter);
  // `client`'s connection closed: deletes the connection-scoped keys it wrote last.
  void client_closed(uint64_t client);
  // Milliseconds until the earliest deadline of a parked request, -1 when none.
  int next_timeout_ms(Clock::time_point now) const { return waiters_.next_timeout_ms(now); }

 private:
  const Bytes* find(const std::string& key) const;
  size_t count_missing(const std::vector<std::string>& keys) const;
  store::wire::Reply add(uint64_t client, const store::wire::Request& request);
  store::wire::Reply compare_set(uint64_t client, store::wire::Request& request);
  uint64_t park(uint64_t client, store::wire::Request& request);
  void put(uint64_t client, const std::string& key, Bytes value);
  bool erase(const std::string& key);
  void finish(uint64_t waiter_id, bool timed_out);
  store::wire::Reply timeout_reply(const Waiter& waiter) const;

  std::unordered_map<std::string, Bytes> data_;
  std::string scoped_prefix_;
  // Connection-scoped keys: their writer, and each writer's keys.
  std::unordered_map<std::string, uint64_t> scoped_owner_;
  std::unordered_map<uint64_t, std::set<std::string>> scoped_keys_;
  WaiterTable waiters_;
  std::vector<Answer> answers_;
};

}  // namespace chorus::store::server
