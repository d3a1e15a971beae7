#include "comm/store/key_ledger.h"

#include <exception>

#include "chorus/error.h"
#include "comm/common/logging.h"

namespace chorus::store {

KeyLedger::KeyLedger(std::shared_ptr<Store> base) : base_(std::move(base)) {
  if (!base_) throw InvalidArgumentError("KeyLedger needs a base store");
  set_timeout(base_->timeout());
}

void KeyLedger::note(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  written_.insert(key);
}

void KeyLedger::set(const std::string& key, const Bytes& value) {
  note(key);
  base_->set(key, value);
}

Bytes KeyLedger::get(const std::string& key) {
  // The base's get() would use the base's timeout; this store's is the contract.
  base_->wait({key}, timeout());
  return base_->get(key);
}

int64_t KeyLedger::add(const std::string& key, int64_t delta) {
  note(key);
  return base_->add(key, delta);
}

Bytes KeyLedger::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  note(key);
  return base_->compare_set(key, expected, desired);
}

bool KeyLedger::check(const std::vector<std::string>& keys) { return base_->check(keys); }

void KeyLedger::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  base_->wait(keys, timeout);
}

bool KeyLedger::delete_key(const std::string& key) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    written_.erase(key);
  }
  return base_->delete_key(key);
}

int64_t KeyLedger::num_keys() { return base_->num_keys(); }

size_t KeyLedger::erase_written() noexcept {
  std::set<std::string> keys;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    keys.swap(written_);
  }
  size_t deleted = 0;
  for (const std::string& key : keys) {
    try {
      if (base_->delete_key(key)) ++deleted;
    } catch (const std::exception& e) {
      CHORUS_LOG(kDebug, "the store kept the rendezvous keys of a communicator (deleting '"
                             << key << "' failed: " << e.what() << ")");
      break;
    }
  }
  return deleted;
}

}  // namespace chorus::store
