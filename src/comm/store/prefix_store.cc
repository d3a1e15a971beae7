#include "chorus/error.h"
#include "chorus/store.h"

namespace chorus {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base)
    : prefix_(std::move(prefix)), base_(std::move(base)) {
  if (!base_) throw InvalidArgumentError("PrefixStore '" + prefix_ + "' needs a base store");
  // get() and wait() without a timeout use this store's own; start from the base's.
  set_timeout(base_->timeout());
}

std::vector<std::string> PrefixStore::full(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const std::string& key : keys) out.push_back(full(key));
  return out;
}

void PrefixStore::set(const std::string& key, const Bytes& value) { base_->set(full(key), value); }

Bytes PrefixStore::get(const std::string& key) {
  // The base's get() would use the base's timeout; this store's timeout is the contract.
  std::string full_key = full(key);
  base_->wait({full_key}, timeout());
  return base_->get(full_key);
}

int64_t PrefixStore::add(const std::string& key, int64_t delta) {
  return base_->add(full(key), delta);
}

Bytes PrefixStore::compare_set(const std::string& key, const Bytes& expected,
                               const Bytes& desired) {
  return base_->compare_set(full(key), expected, desired);
}

bool PrefixStore::check(const std::vector<std::string>& keys) { return base_->check(full(keys)); }

void PrefixStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  base_->wait(full(keys), timeout);
}

bool PrefixStore::delete_key(const std::string& key) { return base_->delete_key(full(key)); }

int64_t PrefixStore::num_keys() { return base_->num_keys(); }

}  // namespace chorus
