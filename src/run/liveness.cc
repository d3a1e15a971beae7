#include "run/liveness.h"

#include <ctime>
#include <nlohmann/json.hpp>

#include "chorus/error.h"
#include "comm/common/logging.h"
#include "comm/common/settings.h"
#include "comm/common/socket.h"

namespace chorus::run {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// How often a launcher looks at the store. A launcher that dies is found lost by every
// other within one tick of its connection closing; 100 ms keeps that well inside the
// 2 s that every launcher has to exit in (10 to 235 ms measured from a SIGKILL to the
// last exit, docs/launcher.md), for three requests a tick on a node other than 0.
constexpr milliseconds kTick{100};
constexpr milliseconds kMinTimeout{500};
// How long settle() waits at most for a round of checks (two ticks, and a slow store).
constexpr milliseconds kSettleLimit{1000};

std::string node_key(const char* what, int node) { return std::string(what) + std::to_string(node); }

std::string seconds_text(milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

}  // namespace

milliseconds heartbeat_timeout() {
  auto value = settings::required_value("CHORUS_HEARTBEAT_TIMEOUT");
  if (!value) return std::chrono::seconds(5);
  milliseconds t = settings::parse_duration("CHORUS_HEARTBEAT_TIMEOUT", *value, std::chrono::seconds(1));
  if (t < kMinTimeout) {
    throw ConfigError("CHORUS_HEARTBEAT_TIMEOUT='" + *value +
                      "' is below 0.5 s; a launcher could be counted lost between two heartbeats");
  }
  return t;
}

std::string local_time_text(std::chrono::system_clock::time_point t) {
  std::time_t tt = std::chrono::system_clock::to_time_t(t);
  std::tm tm;
  localtime_r(&tt, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

std::string launcher_lost_report(int node, const std::string& host, const std::string& how,
                                 int id) {
  return nlohmann::json{{"kind", "launcher"},
                        {"node", node},
                        {"id", id},
                        {"host", host},
                        {"how", how},
                        {"status", 1},
                        {"time", local_time_text(std::chrono::system_clock::now())}}
      .dump();
}

Liveness::Liveness(const LaunchOptions& options, int self, const std::string& job_token,
                   const std::string& prefix, milliseconds connect_timeout, milliseconds timeout)
    : o_(options), self_(self), timeout_(timeout) {
  auto tcp = std::make_shared<TcpStore>(options.master_addr, options.master_port, connect_timeout,
                                        job_token);
  tcp->set_timeout(timeout);  // the calls that do not wait on keys use the base's
  store_ = std::make_shared<PrefixStore>(prefix, tcp);
  store_->set(node_key("alive/", self), net::hostname());
}

Liveness::~Liveness() { stop(); }

void Liveness::watch(const std::vector<std::string>& hosts) {
  std::vector<Peer> peers;
  for (int k = 0; k < static_cast<int>(hosts.size()); ++k) peers.push_back({k, k, hosts[k]});
  watch(peers, "lost");
}

void Liveness::watch(const std::vector<Peer>& peers, const std::string& lost_key) {
  peers_ = peers;
  lost_key_ = lost_key;
  for (const Peer& p : peers) {
    if (p.id == self_) continue;
    others_.push_back(p.id);
    if (self_ == 0 || p.id == 0) watched_.push_back(p.id);
  }
  last_beat_.assign(watched_.size(), -1);
  last_change_.assign(watched_.size(), Clock::now());
  next_beat_ = Clock::now();
  thread_ = std::thread([this] { run(); });
}

void Liveness::reset() {
  stop();
  std::lock_guard<std::mutex> lock(mutex_);
  stopping_ = false;
  // Node 0's loss (its store gone) outlasts the round: nothing may be asked of it.
  if (lost_ && !(lost_node_ == 0 && self_ != 0)) {
    lost_.reset();
    lost_node_ = -1;
  }
  others_.clear();
  watched_.clear();
}

const Peer& Liveness::peer(int id) const {
  for (const Peer& p : peers_) {
    if (p.id == id) return p;
  }
  throw InvalidArgumentError("liveness: no launcher with member id " + std::to_string(id));
}

std::optional<std::string> Liveness::lost() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lost_;
}

bool Liveness::store_lost() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lost_ && lost_node_ == 0 && self_ != 0;
}

int Liveness::lost_node() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lost_ ? lost_node_ : -1;
}

std::optional<std::string> Liveness::settle() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!thread_.joinable()) return lost_;
  const uint64_t target = started_ + 1;
  wake_ = true;
  cv_.notify_all();
  cv_.wait_for(lock, kSettleLimit, [&] { return finished_ >= target || lost_ || stopping_; });
  return lost_;
}

std::optional<std::string> Liveness::store_failed(const std::exception& e) {
  if (self_ == 0) return std::nullopt;
  std::string store = "its store at " + o_.master_addr + ":" + std::to_string(o_.master_port);
  std::string how;
  if (dynamic_cast<const StoreError*>(&e) != nullptr) {
    how = store + " closed the connection (the launcher died, or its host went down)";
  } else if (dynamic_cast<const TimeoutError*>(&e) != nullptr) {
    how = store + " did not answer within " + seconds_text(timeout_) +
          " s (CHORUS_HEARTBEAT_TIMEOUT)";
  } else {
    how = store + " failed: " + e.what();
  }
  record(launcher_lost_report(0, peers_.empty() ? o_.master_addr : peer(0).host, how, 0), 0);
  return lost();
}

void Liveness::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Liveness::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_ && !lost_) {
    ++started_;
    wake_ = false;
    lock.unlock();
    sweep();
    lock.lock();
    ++finished_;
    cv_.notify_all();
    cv_.wait_for(lock, kTick, [&] { return stopping_ || wake_; });
  }
}

// One round of checks. The store failing is node 0's loss as seen from the others; on
// node 0 (its own store, in this process) it is logged and the next tick tries again.
void Liveness::sweep() {
  try {
    if (store_->check({lost_key_})) {
      std::string report = store_->get_string(lost_key_);
      record(report, nlohmann::json::parse(report).value("id", -1));
      return;
    }
    check_alive();
    // Counters are read as often as they move: with many nodes, node 0 reads one each.
    const auto now = Clock::now();
    if (now >= next_beat_) {
      store_->add(node_key("beat/", self_), 1);
      next_beat_ = now + timeout_ / 5;
      check_beats(now);
    }
  } catch (const Error& e) {
    if (self_ != 0) {
      store_failed(e);
    } else {
      CHORUS_LOG(kWarn, "chorusrun: liveness check on node 0's own store failed: " << e.what());
    }
  }
}

// A node whose alive key is gone lost its connection to the store, unless it said it
// leaves first (its left key is written before its connection closes). Every node
// looks, not only node 0: a node whose worker failed because its peers on a dead node
// went with their launcher must find the cause itself, before node 0's next tick.
void Liveness::check_alive() {
  std::vector<std::string> keys;
  for (int k : others_) keys.push_back(node_key("alive/", k));
  if (keys.empty() || store_->check(keys)) return;
  for (int k : others_) {
    if (store_->check({node_key("alive/", k)}) || store_->check({node_key("left/", k)})) continue;
    publish(k, "its connection to the store closed (the launcher died, or its host went down)");
    return;
  }
}

void Liveness::check_beats(Clock::time_point now) {
  for (size_t i = 0; i < watched_.size(); ++i) {
    const int k = watched_[i];
    int64_t beat = store_->add(node_key("beat/", k), 0);  // reads the counter
    if (beat != last_beat_[i]) {
      last_beat_[i] = beat;
      last_change_[i] = now;
      continue;
    }
    const auto silent = std::chrono::duration_cast<milliseconds>(now - last_change_[i]);
    if (silent < timeout_ || store_->check({node_key("left/", k)})) continue;
    if (self_ == 0) {
      publish(k, "it sent no heartbeat for " + seconds_text(silent) +
                     " s (CHORUS_HEARTBEAT_TIMEOUT " + seconds_text(timeout_) + " s)");
    } else {
      record(launcher_lost_report(0, peer(0).host,
                                  "it sent no heartbeat for " + seconds_text(silent) +
                                      " s (CHORUS_HEARTBEAT_TIMEOUT " + seconds_text(timeout_) +
                                      " s)",
                                  0),
             0);
    }
    return;
  }
}

// Publishes the launcher with member id `id` as lost; the first report in the store
// stands.
void Liveness::publish(int id, const std::string& how) {
  const Peer& p = peer(id);
  std::string mine = launcher_lost_report(p.node, p.host, how, id);
  Bytes stands = store_->compare_set(lost_key_, Bytes(), Bytes(mine.begin(), mine.end()));
  std::string report(stands.begin(), stands.end());
  record(report, nlohmann::json::parse(report).value("id", id));
}

void Liveness::record(const std::string& report, int node) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (lost_) return;
    lost_ = report;
    lost_node_ = node;
  }
  cv_.notify_all();
}

}  // namespace chorus::run
