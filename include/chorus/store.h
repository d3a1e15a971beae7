// The rendezvous store: a small key-value service through which the ranks of a job
// find each other (addresses, topology, split colors).
//
// Threading: every Store implementation is safe to call from many threads at once.
// Errors: every call throws chorus::Error. A deadline that passes throws TimeoutError
// whose message names the keys still missing; a lost server throws StoreError.
// Keys are byte strings of at most 4 KiB, values at most 64 MiB.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "chorus/defaults.h"

namespace chorus {

using Bytes = std::vector<uint8_t>;

class Store {
 public:
  virtual ~Store() = default;

  // Sets `key` to `value`, waking every waiter on `key`.
  virtual void set(const std::string& key, const Bytes& value) = 0;

  // Waits up to timeout() for `key` to exist, then returns its value.
  virtual Bytes get(const std::string& key) = 0;

  // Adds `delta` to the integer stored at `key` (absent counts as 0) and returns the
  // new value. The value is kept as decimal text, so get() reads it as such.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;

  // Atomically: if `key`'s value equals `expected` (or `key` is absent and `expected`
  // is empty) it becomes `desired`. Returns the value the key holds afterwards.
  virtual Bytes compare_set(const std::string& key, const Bytes& expected,
                            const Bytes& desired) = 0;

  // True when every key in `keys` exists right now. Never waits.
  virtual bool check(const std::vector<std::string>& keys) = 0;

  // Waits until every key in `keys` exists, or throws TimeoutError naming the missing
  // ones after `timeout`.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout()); }

  // Removes `key`. Returns whether it existed.
  virtual bool delete_key(const std::string& key) = 0;

  // Number of keys in the store (all prefixes together).
  virtual int64_t num_keys() = 0;

  // The host of the server this store talks to, as its clients reach it; "" when there
  // is none (a store in this process, a file). A communicator created on this store
  // listens on the local address that routes to it (CommOptions::listen_address).
  virtual std::string server_host() const { return ""; }

  // Default deadline for get() and wait(). Safe to change while other threads call the
  // store: a call reads it once, when it starts.
  std::chrono::milliseconds timeout() const {
    return std::chrono::milliseconds(timeout_ms_.load(std::memory_order_relaxed));
  }
  void set_timeout(std::chrono::milliseconds timeout) {
    timeout_ms_.store(timeout.count(), std::memory_order_relaxed);
  }

  // Convenience for text values.
  void set(const std::string& key, const std::string& value) {
    set(key, Bytes(value.begin(), value.end()));
  }
  std::string get_string(const std::string& key) {
    Bytes b = get(key);
    return std::string(b.begin(), b.end());
  }

 private:
  std::atomic<int64_t> timeout_ms_{300000};
};

// A store held in this process's memory. For ranks that are threads of one process
// (tests) and for single-process jobs.
class InMemoryStore : public Store {
 public:
  InMemoryStore();
  ~InMemoryStore() override;
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  using Store::wait;
  using Store::set;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Puts `prefix` + "/" in front of every key and forwards to `base`. num_keys() counts
// the whole base store. Shares ownership of `base`.
class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base);
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  using Store::wait;
  using Store::set;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;

  std::string server_host() const override { return base_->server_host(); }
  const std::string& prefix() const { return prefix_; }
  const std::shared_ptr<Store>& base() const { return base_; }

 private:
  std::string full(const std::string& key) const { return prefix_ + "/" + key; }
  std::vector<std::string> full(const std::vector<std::string>& keys) const;
  std::string prefix_;
  std::shared_ptr<Store> base_;
};

// Security of a TcpStoreServer (docs/security.md).
struct TcpStoreServerOptions {
  // The job token every client must prove it holds (challenge and response; the token
  // is never sent). nullopt: CHORUS_JOB_TOKEN (empty when unset, which clients must
  // then match).
  std::optional<std::string> job_token;
  // The allow-list of client addresses. nullopt: the one the environment names
  // (CHORUS_WHITELIST_FILE, else HCCL_WHITELIST_FILE unless HCCL_WHITELIST_DISABLE=1;
  // none: every address). "": every address. Else the path of an allow-list file.
  std::optional<std::string> allowlist_file;
  // How long a new connection has to prove the token before it is closed and logged.
  std::chrono::milliseconds auth_timeout{std::chrono::seconds(10)};
  // Keys that start with this prefix (none when empty) last only as long as the
  // connection that last wrote them (SET, ADD, or a COMPARE_SET that stored): when it
  // closes, for any reason, the server deletes them. A client marks its presence so;
  // chorusrun's launchers do (run/liveness.h), so that node 0 learns at once that
  // another node's launcher died.
  std::string connection_scoped_prefix;
};

// The TCP store server. Listens on `host:port` (port 0 picks a free one) and serves
// any number of clients from one background thread. Every connection must first prove
// the job token (and come from an allowed address); until it has, it can neither read
// nor write a key, and one that fails or stays silent past options.auth_timeout is
// closed, logged as "refused connection from ADDRESS: why". A malformed or oversized
// frame drops only the client that sent it (the reason is logged); other clients carry
// on. The destructor stops the thread and closes every connection.
class TcpStoreServer {
 public:
  // Throws SystemError when the address cannot be bound; "address already in use"
  // names the address and port. Throws ConfigError for a bad allow-list, naming the
  // file and line.
  TcpStoreServer(const std::string& host, uint16_t port,
                 const TcpStoreServerOptions& options = TcpStoreServerOptions());
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  uint16_t port() const;
  const std::string& host() const;

  // Number of clients connected right now (for tests and diagnostics).
  int num_clients() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A client of TcpStoreServer. Connects at construction, retrying until
// `connect_timeout` passes (the server may start later than its clients), and proves
// `job_token` (nullopt: CHORUS_JOB_TOKEN) by challenge and response, checking that the
// server holds it too. A refusal throws StoreError "store at HOST:PORT refused this
// process: <why>" (the job token differs, or the address is not allowed). Every call
// has a deadline; a call waiting on keys uses the store's timeout(). Calls from
// several threads are serialized on the one connection.
class TcpStore : public Store {
 public:
  TcpStore(const std::string& host, uint16_t port,
           std::chrono::milliseconds connect_timeout = kDefaultConnectTimeout,
           std::optional<std::string> job_token = std::nullopt);
  ~TcpStore() override;
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  using Store::wait;
  using Store::set;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;

  std::string server_host() const override { return host(); }
  const std::string& host() const;
  uint16_t port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The store of an `env://` job: connects to CHORUS_STORE_ADDR:CHORUS_STORE_PORT when
// set (a launcher that hosts the store sets them), else MASTER_ADDR:MASTER_PORT (default
// 127.0.0.1:29500); each of the two falls back on its own. Throws ConfigError naming
// the variable for a bad port. When `rank` is 0 and no launcher hosts the store
// (CHORUS_STORE_HOSTED unset), a TcpStoreServer is started there first and kept
// alive as long as the returned store. The store's timeout, and the deadline of
// connecting to it, is `connect_timeout` (CHORUS_CONNECT_TIMEOUT, default 120 s, when
// not given; Communicator::from_env passes its CommOptions::connect_timeout).
std::shared_ptr<Store> store_from_env(int rank);
std::shared_ptr<Store> store_from_env(int rank, std::chrono::milliseconds connect_timeout);

}  // namespace chorus
