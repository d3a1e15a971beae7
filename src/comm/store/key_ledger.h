// A store that remembers the keys this process wrote through it, so that they can be
// deleted once nobody reads them any more.
//
// A communicator's creation writes about four keys per rank (its address, its node,
// shared-memory names); they are read only while the group connects. Left in the
// store, a job that splits a communicator every step grew it without bound (issue 21:
// 1,000 splits of 3 ranks left 13,013 keys). The communicator writes through a ledger,
// and once every rank has read everything (a barrier ends the creation) each rank
// deletes what it wrote: the store returns to the keys it held before.
#pragma once

#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "chorus/store.h"

namespace chorus::store {

class KeyLedger final : public Store {
 public:
  explicit KeyLedger(std::shared_ptr<Store> base);

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
  std::string server_host() const override { return base_->server_host(); }

  // Deletes every key written through this ledger and forgets them. Best effort: a
  // store that cannot delete (torch's FileStore) keeps them, and that is logged once
  // at debug level; never throws. Returns how many were deleted.
  size_t erase_written() noexcept;

 private:
  void note(const std::string& key);

  std::shared_ptr<Store> base_;
  std::mutex mutex_;
  std::set<std::string> written_;
};

}  // namespace chorus::store
