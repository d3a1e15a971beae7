#include "c10d/store_adapter.h"

#include <algorithm>
#include <chrono>
#include <thread>

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
  // Polls check() instead of calling c10d's wait() with a timeout: chorus waits in
  // short slices (store::pages::wait_and_get), and on a loaded machine torch 1.13's
  // TCPStore wait() then failed with "Socket Timeout" although every key was there
  // (seed001 on two nodes of two), or a rank waited out its whole connect timeout for
  // keys the others had read (InitMethods.test_tcp, 3 ranks). check() is one request
  // and one reply, and never blocks on the server.
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  std::chrono::milliseconds pause{1};
  const std::string all = joined(keys);
  while (!guarded("check", all, [&] { return store_->check(keys); })) {
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
    if (waited >= timeout) {
      // Name what is missing, as chorus's stores do.
      std::vector<std::string> missing;
      for (const std::string& k : keys) {
        if (!guarded("check", k, [&] { return store_->check({k}); })) missing.push_back(k);
      }
      if (missing.empty()) return;  // the last of them came just now
      throw TimeoutError("torch store: keys " + joined(missing) + " still missing after " +
                         std::to_string(waited.count()) + " ms");
    }
    std::this_thread::sleep_for(std::min(pause, timeout - waited));
    pause = std::min(pause * 2, std::chrono::milliseconds(20));
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
