// The rules every Store implementation shares (include/chorus/store.h): size limits,
// counter text, compare-and-set matching, timeout bounds and the texts of their
// errors, so that the in-memory store and the TCP store (client and server) behave and
// fail alike. Nothing here knows of a wire format; tcp_store_protocol.h builds on it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "chorus/store.h"

namespace chorus::store::rules {

// Limits of the Store contract.
inline constexpr size_t kMaxKeyBytes = 4 << 10;
inline constexpr size_t kMaxValueBytes = 64 << 20;
inline constexpr size_t kMaxKeysPerRequest = 65536;
// Error texts (and the TCP store's TIMEOUT reply) list at most this many keys, and
// count the rest.
inline constexpr size_t kMaxListedKeys = 16;

// Throw InvalidArgumentError naming the limit when a key, a value or a key list is
// too large for the Store contract.
void check_key(const std::string& key);
void check_value(const std::string& key, const Bytes& value);
void check_keys(const std::vector<std::string>& keys);

// add(): `current` is the key's value (nullptr when absent). Returns the new value;
// throws InvalidArgumentError when `current` is not decimal int64 text or the sum
// overflows.
int64_t add_to_counter(const std::string& key, const Bytes* current, int64_t delta);
Bytes counter_text(int64_t value);

// compare_set(): whether `current` (nullptr when absent) matches `expected`.
bool compare_matches(const Bytes* current, const Bytes& expected);

// "'a', 'b' and 3 more": the first keys of a list of `total`, quoted, non-printable
// bytes escaped.
std::string quote_keys(const std::vector<std::string>& keys, size_t total);

// Timeouts beyond kLongestWait count as kLongestWait, so that "forever"-sized values
// cannot overflow deadline arithmetic; negative ones count as 0.
inline constexpr std::chrono::milliseconds kLongestWait = std::chrono::hours(24 * 365 * 10);
std::chrono::milliseconds bounded_timeout(std::chrono::milliseconds timeout);

// The TimeoutError text of a get() or wait() whose deadline passed.
std::string timeout_message(const std::string& what, std::chrono::milliseconds timeout,
                            const std::vector<std::string>& missing, size_t missing_count);

}  // namespace chorus::store::rules
