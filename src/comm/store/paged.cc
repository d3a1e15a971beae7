#include "comm/store/paged.h"

#include <algorithm>

#include "chorus/error.h"
#include "comm/store/rules.h"

namespace chorus::store::pages {
namespace {

using std::chrono::milliseconds;

constexpr milliseconds kFirstSlice{50};
constexpr milliseconds kLongestSlice{500};

// The keys of `page` that do not exist now (at most kMaxListedKeys of them listed),
// and how many there are.
std::vector<std::string> missing_keys(Store& store, const std::vector<std::string>& page,
                                      size_t* count) {
  std::vector<std::string> listed;
  *count = 0;
  for (const std::string& key : page) {
    if (store.check({key})) continue;
    if (listed.size() < store::rules::kMaxListedKeys) listed.push_back(key);
    ++*count;
  }
  return listed;
}

}  // namespace

std::vector<Bytes> wait_and_get(Store& store, const std::vector<std::string>& keys,
                                const Deadline& deadline,
                                const std::function<void()>& between_slices) {
  static_assert(kPageKeys <= store::rules::kMaxKeysPerRequest);
  const auto start = Deadline::Clock::now();
  std::vector<Bytes> values;
  values.reserve(keys.size());
  milliseconds slice = kFirstSlice;
  for (size_t begin = 0; begin < keys.size(); begin += kPageKeys) {
    std::vector<std::string> page(keys.begin() + static_cast<ptrdiff_t>(begin),
                                  keys.begin() + static_cast<ptrdiff_t>(
                                                     std::min(begin + kPageKeys, keys.size())));
    while (true) {
      try {
        store.wait(page, std::min(slice, deadline.remaining()));
        break;
      } catch (const TimeoutError&) {
        if (deadline.expired()) {
          size_t count = 0;
          std::vector<std::string> missing = missing_keys(store, page, &count);
          if (count == 0) break;  // the last of them came just now
          auto waited = std::chrono::duration_cast<milliseconds>(Deadline::Clock::now() - start);
          throw TimeoutError(store::rules::timeout_message(
              "store wait for " + std::to_string(keys.size()) + " keys", waited, missing, count));
        }
      }
      if (between_slices) between_slices();
      slice = std::min(slice * 2, kLongestSlice);
    }
    for (const std::string& key : page) values.push_back(store.get(key));
  }
  return values;
}

}  // namespace chorus::store::pages
