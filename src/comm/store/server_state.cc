#include "comm/store/server_state.h"

#include <algorithm>

#include "chorus/error.h"
#include "comm/store/rules.h"

namespace chorus::store::server {
namespace {

using store::wire::Op;
using store::wire::Reply;
using store::wire::ReplyKind;
using store::wire::Request;

std::vector<std::string> distinct(std::vector<std::string> keys) {
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  return keys;
}

Reply ok_reply() { return Reply{}; }
Reply value_reply(Bytes value) {
  Reply r;
  r.kind = ReplyKind::kValue;
  r.value = std::move(value);
  return r;
}
Reply integer_reply(int64_t v) {
  Reply r;
  r.kind = ReplyKind::kInteger;
  r.integer = v;
  return r;
}
Reply bool_reply(bool v) {
  Reply r;
  r.kind = ReplyKind::kBool;
  r.flag = v;
  return r;
}

}  // namespace

int ms_until(Clock::time_point deadline, Clock::time_point now) {
  auto left = deadline - now;
  if (left <= Clock::duration::zero()) return 0;
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<int64_t>(ms, 1 << 30));
}

// ---- WaiterTable ----

uint64_t WaiterTable::park(Waiter waiter) {
  uint64_t id = next_id_++;
  for (const std::string& key : waiter.keys) by_key_[key].push_back(id);
  by_deadline_.emplace(waiter.deadline, id);
  waiters_.emplace(id, std::move(waiter));
  return id;
}

std::vector<uint64_t> WaiterTable::key_created(const std::string& key) {
  std::vector<uint64_t> ready;
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return ready;
  for (uint64_t id : it->second) {
    if (--waiters_.at(id).missing == 0) ready.push_back(id);
  }
  return ready;
}

void WaiterTable::key_deleted(const std::string& key) {
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return;
  for (uint64_t id : it->second) ++waiters_.at(id).missing;
}

Waiter WaiterTable::remove(uint64_t id) {
  auto node = waiters_.extract(id);
  Waiter& w = node.mapped();
  for (const std::string& key : w.keys) unindex(key, id);
  by_deadline_.erase({w.deadline, id});
  return std::move(w);
}

std::vector<uint64_t> WaiterTable::expired(Clock::time_point now) const {
  std::vector<uint64_t> out;
  for (auto it = by_deadline_.begin(); it != by_deadline_.end() && it->first <= now; ++it) {
    out.push_back(it->second);
  }
  return out;
}

int WaiterTable::next_timeout_ms(Clock::time_point now) const {
  return by_deadline_.empty() ? -1 : ms_until(by_deadline_.begin()->first, now);
}

void WaiterTable::unindex(const std::string& key, uint64_t id) {
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return;
  std::erase(it->second, id);
  if (it->second.empty()) by_key_.erase(it);
}

// ---- ServerState ----

std::optional<Reply> ServerState::apply(uint64_t client, Request& request, uint64_t* waiter) {
  switch (request.op) {
    case Op::kSet:
      put(client, request.key, std::move(request.value));
      return ok_reply();
    case Op::kGet:
      if (const Bytes* value = find(request.key)) return value_reply(*value);
      *waiter = park(client, request);
      return std::nullopt;
    case Op::kAdd:
      return add(client, request);
    case Op::kCompareSet:
      return compare_set(client, request);
    case Op::kCheck:
      return bool_reply(count_missing(request.keys) == 0);
    case Op::kWait:
      if (count_missing(request.keys) == 0) return ok_reply();
      *waiter = park(client, request);
      return std::nullopt;
    case Op::kDelete:
      return bool_reply(erase(request.key));
    case Op::kNumKeys:
      return integer_reply(static_cast<int64_t>(data_.size()));
  }
  return ok_reply();  // not reached: decode_request() admits only the ops above
}

std::vector<Answer> ServerState::take_answers() {
  std::vector<Answer> out;
  out.swap(answers_);
  return out;
}

void ServerState::expire(Clock::time_point now) {
  for (uint64_t waiter_id : waiters_.expired(now)) finish(waiter_id, true);
}

void ServerState::cancel(uint64_t waiter) { waiters_.remove(waiter); }

void ServerState::client_closed(uint64_t client) {
  auto it = scoped_keys_.find(client);
  if (it == scoped_keys_.end()) return;
  std::set<std::string> keys = std::move(it->second);
  scoped_keys_.erase(it);
  for (const std::string& key : keys) erase(key);
}

const Bytes* ServerState::find(const std::string& key) const {
  auto it = data_.find(key);
  return it == data_.end() ? nullptr : &it->second;
}

size_t ServerState::count_missing(const std::vector<std::string>& keys) const {
  return static_cast<size_t>(
      std::count_if(keys.begin(), keys.end(), [&](const std::string& k) { return !find(k); }));
}

Reply ServerState::add(uint64_t client, const Request& request) {
  int64_t sum = 0;
  try {
    sum = store::rules::add_to_counter(request.key, find(request.key), request.delta);
  } catch (const InvalidArgumentError& e) {
    Reply reply;
    reply.kind = ReplyKind::kInvalidArgument;
    reply.message = e.what();
    return reply;
  }
  put(client, request.key, store::rules::counter_text(sum));
  return integer_reply(sum);
}

Reply ServerState::compare_set(uint64_t client, Request& request) {
  const Bytes* current = find(request.key);
  if (!store::rules::compare_matches(current, request.expected)) {
    return value_reply(current ? *current : Bytes());
  }
  Reply reply = value_reply(request.value);
  put(client, request.key, std::move(request.value));
  return reply;
}

uint64_t ServerState::park(uint64_t client, Request& request) {
  Waiter waiter;
  waiter.client = client;
  waiter.op = request.op;
  waiter.keys = request.op == Op::kGet ? std::vector<std::string>{std::move(request.key)}
                                       : distinct(std::move(request.keys));
  waiter.missing = count_missing(waiter.keys);
  waiter.timeout_ms = request.timeout_ms;
  auto timeout = std::min<uint64_t>(request.timeout_ms, store::rules::kLongestWait.count());
  waiter.deadline = Clock::now() + std::chrono::milliseconds(timeout);
  // A zero timeout is answered by the server's next expire(), at the end of its loop turn.
  return waiters_.park(std::move(waiter));
}

void ServerState::put(uint64_t client, const std::string& key, Bytes value) {
  if (!scoped_prefix_.empty() && key.starts_with(scoped_prefix_)) {
    auto [owner, fresh] = scoped_owner_.try_emplace(key, client);
    if (!fresh && owner->second != client) {
      scoped_keys_[owner->second].erase(key);
      owner->second = client;
    }
    scoped_keys_[client].insert(key);
  }
  bool created = data_.insert_or_assign(key, std::move(value)).second;
  if (!created) return;
  for (uint64_t waiter_id : waiters_.key_created(key)) finish(waiter_id, false);
}

bool ServerState::erase(const std::string& key) {
  if (data_.erase(key) == 0) return false;
  if (auto owner = scoped_owner_.find(key); owner != scoped_owner_.end()) {
    auto keys = scoped_keys_.find(owner->second);
    if (keys != scoped_keys_.end()) keys->second.erase(key);
    scoped_owner_.erase(owner);
  }
  waiters_.key_deleted(key);
  return true;
}

// Answers a parked request: with its result when `timed_out` is false, else with the
// keys still missing.
void ServerState::finish(uint64_t waiter_id, bool timed_out) {
  Waiter waiter = waiters_.remove(waiter_id);
  Answer answer;
  answer.client = waiter.client;
  if (timed_out) {
    answer.reply = timeout_reply(waiter);
  } else if (waiter.op == Op::kGet) {
    answer.reply = value_reply(data_.at(waiter.keys.front()));
  } else {
    answer.reply = ok_reply();
  }
  answers_.push_back(std::move(answer));
}

Reply ServerState::timeout_reply(const Waiter& waiter) const {
  Reply reply;
  reply.kind = ReplyKind::kTimeout;
  reply.missing_count = static_cast<uint32_t>(waiter.missing);
  for (const std::string& key : waiter.keys) {
    if (reply.keys.size() == store::rules::kMaxListedKeys) break;
    if (!find(key)) reply.keys.push_back(key);
  }
  return reply;
}

}  // namespace chorus::store::server
