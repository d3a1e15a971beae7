// store-traffic: what creating a communicator asks of the rendezvous store, and how
// long it takes, at N ranks.
//
// Forms one communicator of N ranks over tcp on loopback, the ranks being threads of
// this process, through one in-memory store. Each rank reaches the store through its
// own counting wrapper, so the requests and bytes of each rank are known. Prints one
// JSON line: the ranks, the formation time (from the start of the threads until the
// last rank's create() returned), requests and bytes per rank (mean and largest, and
// which rank made the most), and the totals.
//
// Public API only (chorus/chorus.h), so that bench/compare_scale.sh can build it
// against an older chorus too.
//
// Usage: store-traffic N [connect_timeout_s]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "chorus/chorus.h"

namespace {

using chorus::Bytes;

// Forwards to `base`, counting requests and the bytes of keys and values both ways.
class CountingStore final : public chorus::Store {
 public:
  explicit CountingStore(std::shared_ptr<chorus::Store> base) : base_(std::move(base)) {
    set_timeout(base_->timeout());
  }
  void set(const std::string& key, const Bytes& value) override {
    count(key.size() + value.size());
    base_->set(key, value);
  }
  Bytes get(const std::string& key) override {
    Bytes v = base_->get(key);
    count(key.size() + v.size());
    return v;
  }
  int64_t add(const std::string& key, int64_t delta) override {
    count(key.size() + 8);
    return base_->add(key, delta);
  }
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override {
    Bytes v = base_->compare_set(key, expected, desired);
    count(key.size() + expected.size() + desired.size() + v.size());
    return v;
  }
  bool check(const std::vector<std::string>& keys) override {
    count(key_bytes(keys));
    return base_->check(keys);
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    count(key_bytes(keys));
    base_->wait(keys, timeout);
  }
  using Store::set;
  using Store::wait;
  bool delete_key(const std::string& key) override {
    count(key.size());
    return base_->delete_key(key);
  }
  int64_t num_keys() override {
    count(0);
    return base_->num_keys();
  }

  uint64_t requests() const { return requests_.load(); }
  uint64_t bytes() const { return bytes_.load(); }

 private:
  static size_t key_bytes(const std::vector<std::string>& keys) {
    size_t n = 0;
    for (const std::string& k : keys) n += k.size();
    return n;
  }
  void count(size_t bytes) {
    requests_.fetch_add(1, std::memory_order_relaxed);
    bytes_.fetch_add(bytes, std::memory_order_relaxed);
  }
  std::shared_ptr<chorus::Store> base_;
  std::atomic<uint64_t> requests_{0}, bytes_{0};
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: store-traffic N [connect_timeout_s]\n");
    return 2;
  }
  const int n = std::atoi(argv[1]);
  const int timeout_s = argc > 2 ? std::atoi(argv[2]) : 300;
  if (n < 1 || timeout_s < 1) {
    std::fprintf(stderr, "store-traffic: N and the timeout must be positive\n");
    return 2;
  }
  auto base = std::make_shared<chorus::InMemoryStore>();
  base->set_timeout(std::chrono::seconds(timeout_s));
  std::vector<std::shared_ptr<CountingStore>> stores;
  for (int r = 0; r < n; ++r) stores.push_back(std::make_shared<CountingStore>(base));
  std::vector<std::shared_ptr<chorus::Communicator>> comms(n);
  std::vector<std::string> errors(n);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::chrono::steady_clock::time_point> done(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        chorus::CommOptions options;
        options.transport = chorus::TransportKind::kTcp;
        options.listen_address = "127.0.0.1";
        options.connect_timeout = std::chrono::seconds(timeout_s);
        options.timeout = std::chrono::seconds(timeout_s);
        comms[r] = chorus::Communicator::create(stores[r], r, n, options);
        done[r] = std::chrono::steady_clock::now();
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    if (!errors[r].empty()) {
      std::fprintf(stderr, "store-traffic: rank %d: %s\n", r, errors[r].c_str());
      return 1;
    }
  }
  const double formed_ms =
      std::chrono::duration<double, std::milli>(*std::max_element(done.begin(), done.end()) - start)
          .count();
  uint64_t total_requests = 0, total_bytes = 0, max_requests = 0, max_bytes = 0;
  int busiest = 0;
  for (int r = 0; r < n; ++r) {
    total_requests += stores[r]->requests();
    total_bytes += stores[r]->bytes();
    if (stores[r]->requests() > max_requests) {
      max_requests = stores[r]->requests();
      busiest = r;
    }
    max_bytes = std::max<uint64_t>(max_bytes, stores[r]->bytes());
  }
  std::printf(
      "{\"ranks\": %d, \"formed_ms\": %.1f, \"requests_per_rank\": %.1f, \"max_requests\": %llu, "
      "\"busiest_rank\": %d, \"bytes_per_rank\": %.0f, \"max_bytes\": %llu, \"total_requests\": "
      "%llu, \"total_bytes\": %llu}\n",
      n, formed_ms, static_cast<double>(total_requests) / n,
      static_cast<unsigned long long>(max_requests), busiest,
      static_cast<double>(total_bytes) / n, static_cast<unsigned long long>(max_bytes),
      static_cast<unsigned long long>(total_requests), static_cast<unsigned long long>(total_bytes));
  // The communicators close together: each waits for nothing.
  threads.clear();
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { comms[r].reset(); });
  for (auto& t : threads) t.join();
  return 0;
}
