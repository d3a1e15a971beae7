#include "c10d/store_adapter.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "chorus/error.h"

namespace chorus::c10d_backend {
namespace {

std::string joined(const std::vector<std::string>& keys) {
  std::string s;
  for (const std::string& k : keys) s += (s.empty() ? "'" : ", '") + k + "'";
  return s;
}

// Runs one call on the c10d store, turning its exceptions into chorus's.
template <typename Fn>
auto guarded(const char* call, const std::string& what, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw StoreError("torch store " + std::string(call) + "(" + what + ") failed: " + e.what());
  }
}

}  // namespace

C10dStore::C10dStore(c10::intrusive_ptr<::c10d::Store> store) : store_(std::move(store)) {
  if (!store_) throw InvalidArgumentError("C10dStore: the torch store is null");
  set_timeout(store_->getTimeout());
}

void C10dStore::set(const std::string& key, const Bytes& value) {
  guarded("set", key, [&] { store_->set(key, value); });
}

Bytes C10dStore::get(const std::string& key) {
  // c10d's get() waits for the key with the c10d store's timeout; this store's is the
  // contract.
  wait({key}, timeout());
  return guarded("get", key, [&] { return store_->get(key); });
}

int64_t C10dStore::add(const std::string& key, int64_t delta) {
  return guarded("add", key, [&] { return store_->add(key, delta); });
}

Bytes C10dStore::compare_set(const std::string& key, const Bytes& expected,
                             const Bytes& desired) {
  return guarded("compare_set", key, [&] { return store_->compareSet(key, expected, desired); });
}

bool C10dStore::check(const std::vector<std::string>& keys) {
  return guarded("check", joined(keys), [&] { return store_->check(keys); });
}

void C10dStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  try {
    store_->wait(keys, timeout);
  } catch (const std::exception& e) {
    // c10d says only "Wait timeout"; name what is missing, as chorus's stores do.
    std::vector<std::string> missing;
    try {
      for (const std::string& k : keys) {
        if (!store_->check({k})) missing.push_back(k);
      }
    } catch (const std::exception&) {
      throw StoreError("torch store wait(" + joined(keys) + ") failed: " + e.what());
    }
    if (missing.empty()) {
      throw StoreError("torch store wait(" + joined(keys) + ") failed: " + e.what());
    }
    throw TimeoutError("torch store: keys " + joined(missing) + " still missing after " +
                       std::to_string(timeout.count()) + " ms (" + e.what() + ")");
  }
}

bool C10dStore::delete_key(const std::string& key) {
  return guarded("delete_key", key, [&] { return store_->deleteKey(key); });
}

int64_t C10dStore::num_keys() {
  return guarded("num_keys", "", [&] { return store_->getNumKeys(); });
}

std::string C10dStore::server_host() const {
  ::c10d::Store* store = store_.get();
  c10::intrusive_ptr<::c10d::Store> below;
  while (auto* prefixed = dynamic_cast<::c10d::PrefixStore*>(store)) {
    below = prefixed->getUnderlyingStore();
    store = below.get();
  }
  if (auto* tcp = dynamic_cast<::c10d::TCPStore*>(store)) return tcp->getHost();
  return "";
}

}  // namespace chorus::c10d_backend
