// chorus's Store over the c10d::Store that torch.distributed hands a backend (a
// PrefixStore over a TCPStore for env:// and tcp://, over a FileStore for file://).
//
// The ranks of a process group meet through it exactly as C++ programs meet through
// chorus's own store; only the rendezvous goes through it, the data moves over chorus's
// connections. Safe to call from many threads when the c10d store is (TCPStore,
// FileStore, HashStore and PrefixStore are). Errors from the c10d store come back as
// chorus errors: a passed deadline as TimeoutError naming the missing keys, anything
// else as StoreError naming the call.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "chorus/store.h"

namespace chorus::c10d_backend {

class C10dStore : public Store {
 public:
  // Shares ownership of `store`. The timeout of get() and wait() starts as the c10d
  // store's own.
  explicit C10dStore(c10::intrusive_ptr<::c10d::Store> store);

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  using Store::set;
  using Store::wait;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  // The TCPStore's host below any PrefixStores; "" for other stores.
  std::string server_host() const override;

 private:
  c10::intrusive_ptr<::c10d::Store> store_;
};

}  // namespace chorus::c10d_backend
