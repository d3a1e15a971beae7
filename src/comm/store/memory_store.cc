#include <condition_variable>
#include <mutex>
#include <unordered_map>

#include "chorus/error.h"
#include "chorus/store.h"
#include "comm/store/rules.h"

namespace chorus {

using store::rules::check_key;

struct InMemoryStore::State {
  std::mutex mutex;
  // Signalled whenever a key comes into existence; waiters re-check their keys.
  std::condition_variable key_created;
  std::unordered_map<std::string, Bytes> data;  // guarded by mutex

  const Bytes* find(const std::string& key) const {
    auto it = data.find(key);
    return it == data.end() ? nullptr : &it->second;
  }
  std::vector<std::string> missing(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    for (const std::string& key : keys) {
      if (data.count(key) == 0) out.push_back(key);
    }
    return out;
  }
  // Waits until every key exists; false when the deadline passed first.
  bool wait_for(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                std::chrono::milliseconds timeout) {
    auto all_present = [&] { return missing(keys).empty(); };
    return key_created.wait_for(lock, store::rules::bounded_timeout(timeout), all_present);
  }
};

InMemoryStore::InMemoryStore() : state_(std::make_unique<State>()) {}
InMemoryStore::~InMemoryStore() = default;

void InMemoryStore::set(const std::string& key, const Bytes& value) {
  check_key(key);
  store::rules::check_value(key, value);
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->data[key] = value;
  }
  state_->key_created.notify_all();
}

Bytes InMemoryStore::get(const std::string& key) {
  check_key(key);
  std::unique_lock<std::mutex> lock(state_->mutex);
  if (!state_->wait_for(lock, {key}, timeout())) {
    throw TimeoutError(store::rules::timeout_message(
        "store get of key " + store::rules::quote_keys({key}, 1), timeout(), {key}, 1));
  }
  return *state_->find(key);
}

int64_t InMemoryStore::add(const std::string& key, int64_t delta) {
  check_key(key);
  int64_t sum = 0;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    sum = store::rules::add_to_counter(key, state_->find(key), delta);
    state_->data[key] = store::rules::counter_text(sum);
  }
  state_->key_created.notify_all();
  return sum;
}

Bytes InMemoryStore::compare_set(const std::string& key, const Bytes& expected,
                                 const Bytes& desired) {
  check_key(key);
  store::rules::check_value(key, desired);
  Bytes result;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    const Bytes* current = state_->find(key);
    if (!store::rules::compare_matches(current, expected)) return current ? *current : Bytes();
    result = state_->data[key] = desired;
  }
  state_->key_created.notify_all();
  return result;
}

bool InMemoryStore::check(const std::vector<std::string>& keys) {
  store::rules::check_keys(keys);
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->missing(keys).empty();
}

void InMemoryStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  store::rules::check_keys(keys);
  std::unique_lock<std::mutex> lock(state_->mutex);
  if (state_->wait_for(lock, keys, timeout)) return;
  std::vector<std::string> missing = state_->missing(keys);
  throw TimeoutError(store::rules::timeout_message(
      "store wait for " + std::to_string(keys.size()) + " keys", timeout, missing, missing.size()));
}

bool InMemoryStore::delete_key(const std::string& key) {
  check_key(key);
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->data.erase(key) > 0;
}

int64_t InMemoryStore::num_keys() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return static_cast<int64_t>(state_->data.size());
}

}  // namespace chorus
