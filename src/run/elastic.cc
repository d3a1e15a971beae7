// The rendezvous of an elastic job (elastic.h).
#include "run/elastic.h"

#include <algorithm>
#include <iostream>
#include <sstream>
#include <thread>

#include "chorus/error.h"
#include "comm/common/deadline.h"
#include "comm/common/socket.h"
#include "run/rendezvous.h"

namespace chorus::run {
namespace {

using json = nlohmann::json;
using std::chrono::milliseconds;

// How often waits look at the store and at `interrupted` (signals), as in rendezvous.cc.
constexpr milliseconds kSlice{100};

std::string key(const char* what, int id) { return std::string(what) + std::to_string(id); }
std::string round_key(int round, const std::string& what) {
  return "round/" + std::to_string(round) + "/" + what;
}

std::string seconds_text(milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

json to_json(const ElasticPlan& p) {
  if (p.end) return json{{"end", *p.end}};
  json nodes = json::array();
  for (const ElasticNode& n : p.nodes) nodes.push_back({{"id", n.id}, {"nproc", n.nproc}, {"host", n.host}});
  return json{{"nodes", nodes},
              {"restarts", p.restarts},
              {"worker_port", p.worker_port},
              {"stop_at_checkpoint", p.stop_at_checkpoint}};
}

ElasticPlan from_json(const std::string& text) {
  json j = json::parse(text);
  ElasticPlan p;
  if (j.contains("end")) {
    p.end = j["end"];
    return p;
  }
  for (const auto& n : j["nodes"]) {
    p.nodes.push_back({n["id"].get<int>(), n["nproc"].get<int>(), n["host"].get<std::string>(), ""});
  }
  p.restarts = j["restarts"].get<int>();
  p.worker_port = j["worker_port"].get<uint16_t>();
  p.stop_at_checkpoint = j.value("stop_at_checkpoint", false);
  return p;
}

void nap(const std::shared_ptr<PrefixStore>& store, const std::string& key, milliseconds slice) {
  try {
    store->wait({key}, slice);
  } catch (const TimeoutError&) {
  }
}

}  // namespace

int ElasticPlan::node_of(int id) const {
  for (size_t k = 0; k < nodes.size(); ++k) {
    if (nodes[k].id == id) return static_cast<int>(k);
  }
  return -1;
}

ElasticRendezvous::ElasticRendezvous(const LaunchOptions& o, milliseconds connect_timeout)
    : o_(o), connect_timeout_(connect_timeout) {
  const std::string token = job_token(o);
  const milliseconds heartbeat = heartbeat_timeout();  // a bad value fails first
  if (o.node_rank == 0) {
    TcpStoreServerOptions server_options;
    server_options.job_token = token;
    server_options.connection_scoped_prefix = rdzv_prefix(o) + "/alive/";
    server_ = std::make_unique<TcpStoreServer>(o.master_addr, o.master_port, server_options);
  }
  auto tcp = std::make_shared<TcpStore>(o.master_addr, o.master_port, connect_timeout, token);
  store_ = std::make_shared<PrefixStore>(rdzv_prefix(o), tcp);
  store_->set_timeout(connect_timeout);
  id_ = o.node_rank == 0 ? 0 : static_cast<int>(store_->add("members", 1));
  // The alive key first: node 0 must never see a member without one.
  liveness_ = std::make_unique<Liveness>(o, id_, token, rdzv_prefix(o), connect_timeout, heartbeat);
  store_->set(key("member/", id_), std::to_string(o.nproc_per_node) + " " + net::hostname() +
                                       (o.local_addr.empty() ? "" : " " + o.local_addr));
  // From here on a store that does not answer within the heartbeat timeout is a lost
  // node 0; the long waits are sliced.
  const milliseconds bounded = std::min(connect_timeout, heartbeat);
  store_->base()->set_timeout(bounded);
  store_->set_timeout(bounded);
}

ElasticRendezvous::~ElasticRendezvous() {
  // The store's clients go before the server this node may host.
  liveness_.reset();
  store_.reset();
}

ElasticNode ElasticRendezvous::member(int id) {
  std::istringstream in(store_->get_string(key("member/", id)));
  ElasticNode n;
  n.id = id;
  in >> n.nproc >> n.host >> n.addr;
  n.nproc = std::max(1, n.nproc);
  return n;
}

// The launchers that may take part in the next round, by member id: joined, alive, not
// leaving, not lost before.
std::vector<ElasticNode> ElasticRendezvous::candidates() {
  std::vector<ElasticNode> found;
  const int count = static_cast<int>(store_->add("members", 0));
  for (int id = 0; id <= count; ++id) {
    if (excluded_.count(id) != 0) continue;
    if (!store_->check({key("member/", id), key("alive/", id)}) || store_->check({key("left/", id)}))
      continue;
    found.push_back(member(id));
  }
  return found;
}

ElasticPlan ElasticRendezvous::decide(int round, const std::optional<json>& previous,
                                      const std::function<bool()>& interrupted) {
  ElasticPlan plan;
  if (previous) {
    const std::string kind = previous->value("kind", "");
    if (kind == "launcher") {
      excluded_.insert(previous->value("id", -1));
    } else if (kind == "signal") {
      // That launcher was told to stop and leaves.
      const int node = previous->value("node", -1);
      if (node >= 0 && node < static_cast<int>(plan_.nodes.size())) excluded_.insert(plan_.nodes[node].id);
    }
    if (kind != "join" && ++restarts_ > o_.max_restarts) {
      plan.end = *previous;
      return plan;
    }
  }
  Deadline for_min(o_.join_timeout);
  std::vector<ElasticNode> nodes = candidates();
  while (static_cast<int>(nodes.size()) < o_.min_nnodes) {
    if (interrupted()) return plan;  // no nodes, no end: the caller says why
    if (for_min.expired()) {
      std::string came;
      for (const ElasticNode& n : nodes) {
        came += (came.empty() ? "" : ", ") + std::string("node ") +
                std::to_string(&n - nodes.data()) + " (host " + n.host +
                (n.addr.empty() ? "" : ", address " + n.addr) + ")";
      }
      plan.end = json{{"kind", "rendezvous"},
                      {"how", "only " + std::to_string(nodes.size()) + " of at least " +
                                  std::to_string(o_.min_nnodes) + " nodes (--nnodes " +
                                  std::to_string(o_.min_nnodes) + ":" + std::to_string(o_.nnodes) +
                                  ") joined within the join timeout of " +
                                  seconds_text(o_.join_timeout) + " s (--rdzv-join-timeout): " +
                                  came},
                      {"status", 1}};
      return plan;
    }
    nap(store_, "members-never-set", std::min(kSlice, for_min.remaining()));
    nodes = candidates();
  }
  // Before the first round, more nodes may still be on their way: a short last call.
  // Later ones start at once; a node that arrives during a round ends it (failure()).
  if (round == 0) {
    Deadline last_call(o_.last_call);
    while (static_cast<int>(nodes.size()) < o_.nnodes && !last_call.expired() && !interrupted()) {
      nap(store_, "members-never-set", std::min(kSlice, last_call.remaining()));
      nodes = candidates();
    }
  }
  if (static_cast<int>(nodes.size()) > o_.nnodes) nodes.resize(o_.nnodes);  // join order
  plan.nodes = nodes;
  plan.restarts = restarts_;
  plan.worker_port = pick_worker_port(o_.master_addr);
  plan.stop_at_checkpoint = o_.join_at_checkpoint.count() > 0;
  pending_join_.reset();
  return plan;
}

std::optional<ElasticPlan> ElasticRendezvous::wait_plan(int round,
                                                        const std::function<bool()>& interrupted) {
  const std::string k = key("plan/", round);
  // Node 0 may wait the join timeout for MIN nodes, the last call, and first stop its
  // workers (the grace period).
  const milliseconds limit = o_.join_timeout + o_.last_call + o_.grace_period + connect_timeout_;
  Deadline deadline(limit);
  try {
    while (!store_->check({k})) {
      if (interrupted()) return std::nullopt;
      if (deadline.expired()) {
        std::string why = plan_.node_of(id_) < 0 && !plan_.nodes.empty()
                              ? " (the job ran on its " + std::to_string(plan_.nodes.size()) +
                                    " nodes without this one, --nnodes " +
                                    std::to_string(o_.min_nnodes) + ":" + std::to_string(o_.nnodes) + ")"
                              : "";
        throw TimeoutError("node 0 (store at " + o_.master_addr + ":" +
                           std::to_string(o_.master_port) + ") started no round " +
                           std::to_string(round) + " within " + seconds_text(limit) + " s" + why);
      }
      nap(store_, k, std::min(kSlice, deadline.remaining()));
    }
    return from_json(store_->get_string(k));
  } catch (const Error& e) {
    if (dynamic_cast<const TimeoutError*>(&e) != nullptr && deadline.expired()) throw;
    auto lost = store_failed(e);
    if (!lost) throw;
    ElasticPlan p;
    p.end = json::parse(*lost);
    return p;
  }
}

std::optional<ElasticPlan> ElasticRendezvous::plan(int round, const std::optional<json>& previous,
                                                   const std::function<bool()>& interrupted) {
  std::optional<ElasticPlan> p;
  if (id_ == 0) {
    p = decide(round, previous, interrupted);
    if (!p->end && p->nodes.empty()) return std::nullopt;  // interrupted
    std::string text = to_json(*p).dump();
    store_->set(key("plan/", round), text);
    store_->set("latest", std::to_string(round));
  } else {
    p = wait_plan(round, interrupted);
  }
  if (p && !p->end) plan_ = *p;
  return p;
}

int ElasticRendezvous::first_round() {
  if (id_ == 0 || !store_->check({"latest"})) return 0;
  return std::atoi(store_->get_string("latest").c_str());
}

void ElasticRendezvous::publish_end(int round, const json& end) {
  ElasticPlan p;
  p.end = end;
  const std::string text = to_json(p).dump();
  try {
    store_->compare_set(key("plan/", round), Bytes(), Bytes(text.begin(), text.end()));
  } catch (const Error&) {
    // Best effort: the others' waits have deadlines.
  }
}

std::vector<std::string> ElasticRendezvous::plan_keys(int round, const std::string& what) const {
  std::vector<std::string> keys;
  for (const ElasticNode& n : plan_.nodes) keys.push_back(round_key(round, what + std::to_string(n.id)));
  return keys;
}

bool ElasticRendezvous::ready(int round, const std::function<bool()>& interrupted) {
  std::vector<Peer> peers;
  for (size_t k = 0; k < plan_.nodes.size(); ++k) {
    peers.push_back({plan_.nodes[k].id, static_cast<int>(k), plan_.nodes[k].host});
  }
  liveness_->watch(peers, round_key(round, "lost"));
  Deadline deadline(connect_timeout_);
  const auto keys = plan_keys(round, "ready/");
  try {
    store_->set(round_key(round, "ready/" + std::to_string(id_)), "1");
    while (!store_->check(keys)) {
      // A node that was told to stop before the round started says so in its failure.
      if (interrupted() || lost() || RoundControl::failure(round)) return false;
      if (deadline.expired()) {
        throw TimeoutError("starting round " + std::to_string(round) + ": not every node of it was ready within " +
                           seconds_text(connect_timeout_) + " s (CHORUS_CONNECT_TIMEOUT)");
      }
      try {
        store_->wait(keys, std::min(kSlice, deadline.remaining()));
      } catch (const TimeoutError&) {
      }
    }
  } catch (const StoreError& e) {
    if (!store_failed(e)) throw;
    return false;
  }
  return true;
}

std::optional<std::string> ElasticRendezvous::failure(int round) {
  if (auto f = RoundControl::failure(round)) return f;
  if (id_ != 0 || static_cast<int>(plan_.nodes.size()) >= o_.nnodes) return std::nullopt;
  if (pending_join_) {
    // The workers were asked to stop at their next checkpoint: the round ends once every
    // node's did, or at the deadline (then as without --join-at-checkpoint).
    json join = *pending_join_;
    if (store_->check(plan_keys(round, "stopped/"))) {
      join["stopped"] = "at_checkpoint";
    } else if (std::chrono::steady_clock::now() >= stop_deadline_) {
      join["stopped"] = "timeout";
      join["wait"] = seconds_text(o_.join_at_checkpoint);
    } else {
      return std::nullopt;
    }
    return report_failure(round, join.dump());
  }
  // A launcher that joined after this round was planned, alive: end the round so that
  // the next one admits it (its workers resume from their checkpoint).
  const int count = static_cast<int>(store_->add("members", 0));
  for (int id = 1; id <= count; ++id) {
    if (plan_.node_of(id) >= 0 || excluded_.count(id) != 0) continue;
    if (!store_->check({key("member/", id)})) continue;  // still joining
    if (!store_->check({key("alive/", id)}) || store_->check({key("left/", id)})) {
      excluded_.insert(id);  // gone for good: not looked at again
      continue;
    }
    json join{{"kind", "join"},
              {"id", id},
              {"host", member(id).host},
              {"time", local_time_text(std::chrono::system_clock::now())}};
    if (!plan_.stop_at_checkpoint) return report_failure(round, join.dump());
    store_->set(round_key(round, "stop-at-checkpoint"), "1");
    pending_join_ = join;
    stop_deadline_ = std::chrono::steady_clock::now() + o_.join_at_checkpoint;
    std::cerr << "chorusrun: a node joined (host " << join.value("host", "")
              << "): the workers stop at their next checkpoint (--join-at-checkpoint "
              << seconds_text(o_.join_at_checkpoint) << ")" << std::endl;
    return std::nullopt;
  }
  return std::nullopt;
}

bool ElasticRendezvous::stop_requested(int round) {
  return plan_.stop_at_checkpoint && store_->check({round_key(round, "stop-at-checkpoint")});
}

void ElasticRendezvous::report_stopped(int round) {
  store_->set(round_key(round, "stopped/" + std::to_string(id_)), "1");
}

std::string ElasticRendezvous::stop_key(int round) const {
  if (!plan_.stop_at_checkpoint) return "";
  return rdzv_prefix(o_) + "/" + round_key(round, "stop-at-checkpoint");
}

void ElasticRendezvous::report_done(int round) {
  store_->set(round_key(round, "done/" + std::to_string(id_)), "1");
}

bool ElasticRendezvous::all_done(int round) { return store_->check(plan_keys(round, "done/")); }

void ElasticRendezvous::leave(milliseconds linger) {
  if (liveness_->store_lost()) return liveness_->stop();
  try {
    store_->set(key("left/", id_), "1");
    liveness_->stop();  // only now: our alive key must outlast our left key
    if (id_ != 0) return;
    // Node 0 keeps the store up until every other member alive has left.
    Deadline deadline(linger);
    auto gone = [&] {
      const int count = static_cast<int>(store_->add("members", 0));
      for (int id = 1; id <= count; ++id) {
        if (excluded_.count(id) != 0 || store_->check({key("left/", id)})) continue;
        if (store_->check({key("alive/", id)})) return false;
      }
      return true;
    };
    while (!deadline.expired() && !gone()) nap(store_, "left-never-set", std::min(milliseconds(20), deadline.remaining()));
  } catch (const Error&) {
    // Leaving is best effort: the job's result is already decided.
  }
  liveness_->stop();
}

}  // namespace chorus::run
