#include "run/rendezvous.h"

#include <cstdlib>
#include <thread>

#include "chorus/error.h"
#include "comm/common/deadline.h"
#include "comm/common/settings.h"
#include "comm/common/socket.h"

namespace chorus::run {

namespace {
constexpr std::chrono::milliseconds kSlice{100};
}  // namespace

// The job token the store is guarded with: CHORUS_JOB_TOKEN when set, else the rdzv id,
// the rule by which the workers get theirs (worker_env in attempt.cc).
std::string job_token(const LaunchOptions& options) {
  std::string token = settings::job_token();
  return token.empty() ? options.rdzv_id : token;
}

// A port free on `host` and on the wildcard address. A port taken on another local
// address would still stop a TCPStore that binds the wildcard, so such a pick is tried
// again (a few times: each try is a fresh port from the kernel).
uint16_t pick_worker_port(const std::string& host) {
  constexpr int kTries = 8;
  uint16_t port = 0;
  for (int attempt = 0; attempt < kTries; ++attempt) {
    port = net::local_address(net::listen_on(host, 0).get()).port();
    try {
      net::listen_on("0.0.0.0", port);
      return port;
    } catch (const SystemError&) {
    }
  }
  return port;  // free on `host` at least; a clash shows in the program's own error
}

std::string rdzv_prefix(const LaunchOptions& options) { return "chorusrun/" + options.rdzv_id; }

namespace {
std::string worker_port_key(int round) { return "round/" + std::to_string(round) + "/worker_port"; }
}  // namespace

LauncherRendezvous::LauncherRendezvous(const LaunchOptions& options,
                                       std::chrono::milliseconds connect_timeout)
    : options_(options), connect_timeout_(connect_timeout) {
  std::string token = job_token(options);
  const std::chrono::milliseconds heartbeat = heartbeat_timeout();  // a bad value fails first
  if (options.node_rank == 0) {
    TcpStoreServerOptions server_options;
    server_options.job_token = token;
    server_options.connection_scoped_prefix = rdzv_prefix(options) + "/alive/";
    server_ = std::make_unique<TcpStoreServer>(options.master_addr, options.master_port,
                                               server_options);
  }
  auto tcp = std::make_shared<TcpStore>(options.master_addr, options.master_port, connect_timeout,
                                        token);
  store_ = std::make_shared<PrefixStore>(rdzv_prefix(options), tcp);
  store_->set_timeout(connect_timeout);
  liveness_ = std::make_unique<Liveness>(options, options.node_rank, token, rdzv_prefix(options),
                                         connect_timeout, heartbeat);
}

LauncherRendezvous::~LauncherRendezvous() {
  // The store's clients go before the server this node may host.
  liveness_.reset();
  store_.reset();
}

std::vector<std::string> LauncherRendezvous::node_keys(const std::string& prefix) const {
  std::vector<std::string> keys;
  for (int k = 0; k < options_.nnodes; ++k) keys.push_back(prefix + std::to_string(k));
  return keys;
}

bool LauncherRendezvous::wait_all(const std::string& what, const std::vector<std::string>& keys,
                                  const std::function<bool()>& interrupted) {
  Deadline deadline(connect_timeout_);
  try {
    return wait_all_keys(what, keys, interrupted, deadline);
  } catch (const StoreError& e) {
    // Node 0's store is gone: the launcher that hosted it is lost.
    if (!store_failed(e)) throw;
    return false;
  }
}

bool LauncherRendezvous::wait_all_keys(const std::string& what,
                                       const std::vector<std::string>& keys,
                                       const std::function<bool()>& interrupted,
                                       const Deadline& deadline) {
  while (!store_->check(keys)) {
    if ((interrupted && interrupted()) || lost()) return false;
    if (deadline.expired()) {
      std::string missing;
      for (size_t k = 0; k < keys.size(); ++k) {
        if (!store_->check({keys[k]})) missing += (missing.empty() ? "" : ", ") + std::to_string(k);
      }
      throw TimeoutError(what + ": node(s) " + missing + " of " + std::to_string(keys.size()) +
                         " never arrived within " +
                         std::to_string(connect_timeout_.count() / 1000.0) +
                         " s (CHORUS_CONNECT_TIMEOUT); store at " + options_.master_addr + ":" +
                         std::to_string(options_.master_port));
    }
    try {
      store_->wait(keys, std::min(kSlice, deadline.remaining()));
    } catch (const TimeoutError&) {
    }
  }
  return true;
}

bool LauncherRendezvous::join(const std::function<bool()>& interrupted) {
  // "NPROC HOST": nodes may start different numbers of workers; ranks are laid out in
  // node order.
  store_->set("node/" + std::to_string(options_.node_rank),
              std::to_string(options_.nproc_per_node) + " " + net::hostname());
  auto keys = node_keys("node/");
  if (!wait_all("waiting for the launchers of all nodes", keys, interrupted)) return false;
  // Past the joining, a store that does not answer within the heartbeat timeout is a
  // lost node 0; the long waits are sliced and do not depend on this.
  const auto bounded = std::min(connect_timeout_, liveness_->timeout());
  store_->base()->set_timeout(bounded);  // the calls that do not wait on keys use this one
  store_->set_timeout(bounded);
  std::vector<std::string> hosts;
  nprocs_.clear();
  for (size_t k = 0; k < keys.size(); ++k) {
    std::string value = store_->get_string(keys[k]);
    size_t space = value.find(' ');
    nprocs_.push_back(std::max(1, std::atoi(value.substr(0, space).c_str())));
    hosts.push_back(space == std::string::npos ? "" : value.substr(space + 1));
  }
  liveness_->watch(hosts);
  return true;
}

bool LauncherRendezvous::ready(int round, const std::function<bool()>& interrupted) {
  if (lost()) return false;
  std::string prefix = "round/" + std::to_string(round) + "/ready/";
  try {
    if (options_.node_rank == 0) {
      store_->set(worker_port_key(round), std::to_string(pick_worker_port(options_.master_addr)));
    }
    store_->set(prefix + std::to_string(options_.node_rank), "1");
  } catch (const StoreError& e) {
    if (!store_failed(e)) throw;
    return false;
  }
  return wait_all("starting attempt " + std::to_string(round), node_keys(prefix), interrupted);
}

uint16_t LauncherRendezvous::worker_port(int round) {
  std::string text = store_->get_string(worker_port_key(round));
  int port = std::atoi(text.c_str());
  if (port < 1 || port > 65535) {
    throw InvalidArgumentError("the store holds no valid worker port for attempt " +
                               std::to_string(round) + " ('" + text + "')");
  }
  return static_cast<uint16_t>(port);
}

void LauncherRendezvous::report_done(int round) {
  store_->set("round/" + std::to_string(round) + "/done/" + std::to_string(options_.node_rank),
              "1");
}

bool LauncherRendezvous::all_done(int round) {
  return store_->check(node_keys("round/" + std::to_string(round) + "/done/"));
}

void LauncherRendezvous::leave(std::chrono::milliseconds linger) {
  if (liveness_->store_lost()) return liveness_->stop();  // nothing left to tell
  try {
    store_->set("left/" + std::to_string(options_.node_rank), "1");
    // Only now: our alive key must outlast our left key, or node 0 would count us lost.
    liveness_->stop();
    if (options_.node_rank != 0) return;
    // A node that left, whose connection closed (it died), or that was found lost (a
    // stopped launcher keeps its connection) reads nothing any more.
    constexpr std::chrono::milliseconds kLeaveSlice{20};
    Deadline deadline(linger);
    auto keys = node_keys("left/");
    const int lost_node = liveness_->lost_node();
    auto gone = [&] {
      if (store_->check(keys)) return true;
      for (int k = 1; k < options_.nnodes; ++k) {
        if (k != lost_node && !store_->check({"left/" + std::to_string(k)}) &&
            store_->check({"alive/" + std::to_string(k)}))
          return false;
      }
      return true;
    };
    while (!deadline.expired() && !gone()) {
      try {
        store_->wait(keys, std::min(kLeaveSlice, deadline.remaining()));
      } catch (const TimeoutError&) {
      }
    }
  } catch (const Error&) {
    // Leaving is best effort: the job's result is already decided.
  }
  liveness_->stop();
}

}  // namespace chorus::run
