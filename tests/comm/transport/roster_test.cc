// The roster (src/comm/transport/roster.h): its encoding round-trips, stays compact,
// refuses malformed bytes with a StoreError saying what was wrong, and its exchange
// asks the store a constant number of requests of every rank but rank 0, whose grow
// linearly with the ranks.
#include "comm/transport/roster.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "chorus/chorus.h"
#include "util/checks.h"
#include "util/ranks.h"

namespace chorus::transport {
namespace {

using namespace std::chrono_literals;

std::vector<Member> nodes_of(int ranks, int per_node, bool interleaved = false) {
  std::vector<Member> out;
  for (int r = 0; r < ranks; ++r) {
    const int node = interleaved ? r % (ranks / per_node) : r / per_node;
    out.push_back(Member{"10.0.0." + std::to_string(node + 1), static_cast<uint16_t>(20000 + r),
                         "host-" + std::to_string(node), "node-id-" + std::to_string(node)});
  }
  return out;
}

TEST(Roster, RoundTrips) {
  std::vector<std::vector<Member>> cases = {
      nodes_of(1, 1), nodes_of(8, 8), nodes_of(12, 4), nodes_of(12, 4, true), nodes_of(7, 1)};
  // Ranks of one node that listen on different addresses, and one odd host name.
  std::vector<Member> mixed = nodes_of(6, 3);
  mixed[1].ip = "10.1.0.9";
  mixed[4].host = "h\xc3\xa9te with spaces";
  cases.push_back(mixed);
  for (const auto& members : cases) {
    const int size = static_cast<int>(members.size());
    EXPECT_EQ(decode_roster(encode_roster(members), size), members);
    for (int r = 0; r < size; ++r) {
      int decoded_size = 0;
      EXPECT_EQ(decode_member(encode_member(members[r], size), r, &decoded_size), members[r]);
      EXPECT_EQ(decoded_size, size);
    }
  }
}

// Runs of ranks that share a node cost one entry each: 1,024 ranks in nodes of 8 take
// a few bytes a rank, and the same ranks interleaved across the nodes (a run a rank)
// still grow linearly.
TEST(Roster, IsCompact) {
  // Each node has three strings of its own here (address, host, node id; 9-14 bytes).
  const size_t consecutive = encode_roster(nodes_of(1024, 8)).size();
  EXPECT_LT(consecutive, 1024 * 10u) << consecutive;
  const size_t interleaved = encode_roster(nodes_of(1024, 8, true)).size();
  EXPECT_LT(interleaved, 1024 * 24u) << interleaved;
  // Four times the ranks, four times the bytes (the strings grow a digit).
  EXPECT_LT(encode_roster(nodes_of(4096, 8)).size(), 4 * consecutive + 1024);
}

TEST(Roster, MalformedBytesAreRefusedSayingWhat) {
  const std::vector<Member> members = nodes_of(12, 4, true);
  const Bytes good = encode_roster(members);
  // Every truncation, and a byte too many.
  for (size_t n = 0; n < good.size(); ++n) {
    Bytes cut(good.begin(), good.begin() + static_cast<ptrdiff_t>(n));
    std::string m = test::error_of<StoreError>([&] { decode_roster(cut, 12); });
    EXPECT_NE(m.find("the roster rank 0 published is malformed"), std::string::npos) << m;
  }
  Bytes longer = good;
  longer.push_back(0);
  EXPECT_NE(test::error_of<StoreError>([&] { decode_roster(longer, 12); }).find("unexpected bytes"),
            std::string::npos);
  EXPECT_NE(test::error_of<StoreError>([&] { decode_roster(good, 13); }).find("lists 12 ranks, not 13"),
            std::string::npos);
  // A run naming a string beyond the table: the first run's address index (after the
  // magic, the size, the string count, the strings and the run count).
  Bytes bad_index = encode_roster(nodes_of(2, 2));
  const size_t strings_end = bad_index.size() - 2 * 2 - 4 * 4 - 4;  // ports, one run, run count
  bad_index[strings_end + 4 + 4] = 0x7f;
  std::string m = test::error_of<StoreError>([&] { decode_roster(bad_index, 2); });
  EXPECT_NE(m.find("names string"), std::string::npos) << m;
  // A port of 0.
  Bytes zero_port = encode_roster(nodes_of(2, 2));
  zero_port[zero_port.size() - 1] = 0;
  zero_port[zero_port.size() - 2] = 0;
  m = test::error_of<StoreError>([&] { decode_roster(zero_port, 2); });
  EXPECT_NE(m.find("rank 1 has an empty address or port 0"), std::string::npos) << m;
  // A member record of another kind.
  m = test::error_of<StoreError>([&] {
    int size = 0;
    decode_member(good, 3, &size);
  });
  EXPECT_NE(m.find("the record rank 3 published is malformed: bad magic number"), std::string::npos)
      << m;
}

// An in-memory store that counts the requests of the rank that uses it: those that
// read or write (set, get, compare_set), and apart from them the waits and checks,
// whose number depends on how long the rank waited (slices of 50-500 ms), not on the
// ranks.
class CountedStore : public InMemoryStore {
 public:
  explicit CountedStore(std::shared_ptr<InMemoryStore> shared) : shared_(std::move(shared)) {}
  void set(const std::string& key, const Bytes& value) override {
    ++requests;
    shared_->set(key, value);
  }
  Bytes get(const std::string& key) override {
    ++requests;
    return shared_->get(key);
  }
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override {
    ++requests;
    return shared_->compare_set(key, expected, desired);
  }
  bool check(const std::vector<std::string>& keys) override {
    ++polls;
    return shared_->check(keys);
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    ++polls;
    shared_->wait(keys, timeout);
  }
  using Store::set;
  using Store::wait;
  std::atomic<int> requests{0}, polls{0};

 private:
  std::shared_ptr<InMemoryStore> shared_;
};

// The store's work grows linearly with the ranks: every rank but rank 0 reads and
// writes the same few times at 16 ranks as at 256, and rank 0 once per rank (it reads
// each rank's record). The old exchange made every rank read every other's address and
// node: 2N requests each, 2N^2 in all.
TEST(Roster, ExchangeAsksTheStoreLinearly) {
  for (int n : {16, 64, 256}) {
    SCOPED_TRACE(std::to_string(n) + " ranks");
    auto shared = std::make_shared<InMemoryStore>();
    std::vector<std::unique_ptr<CountedStore>> stores;
    for (int r = 0; r < n; ++r) stores.push_back(std::make_unique<CountedStore>(shared));
    std::vector<std::vector<Member>> got(n);
    const std::vector<Member> members = nodes_of(n, 8);
    auto errors = test::run_threads(n, [&](int r) {
      got[r] = exchange_roster(*stores[r], r, n, members[r], Deadline(60s), "roster-test");
    }, 120s);
    test::rethrow_rank_failures(errors);
    int most_other = 0, most_polls = 0;
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(got[r], members) << "rank " << r;
      if (r > 0) most_other = std::max(most_other, stores[r]->requests.load());
      most_polls = std::max(most_polls, stores[r]->polls.load());
    }
    // Its record, the size's compare_set, the roster.
    EXPECT_EQ(most_other, 3) << "a rank other than 0";
    // Its record, the size's, every rank's record (its own too), the roster.
    EXPECT_EQ(stores[0]->requests.load(), n + 3) << "rank 0";
    std::printf("[ roster   ] %d ranks: rank 0 read or wrote %d times, each other rank %d; "
                "at most %d waits and checks\n",
                n, stores[0]->requests.load(), most_other, most_polls);
  }
}

}  // namespace
}  // namespace chorus::transport
