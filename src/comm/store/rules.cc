#include "comm/store/rules.h"

#include <algorithm>
#include <charconv>

#include "chorus/error.h"
#include "comm/common/hex.h"

namespace chorus::store::rules {

void check_key(const std::string& key) {
  if (key.size() > kMaxKeyBytes) {
    throw InvalidArgumentError("store key '" + key.substr(0, 64) + "...' is " +
                               std::to_string(key.size()) + " bytes; keys are at most " +
                               std::to_string(kMaxKeyBytes) + " bytes");
  }
}

void check_value(const std::string& key, const Bytes& value) {
  if (value.size() > kMaxValueBytes) {
    throw InvalidArgumentError("store value for key " + quote_keys({key}, 1) + " is " +
                               std::to_string(value.size()) + " bytes; values are at most " +
                               std::to_string(kMaxValueBytes) + " bytes");
  }
}

void check_keys(const std::vector<std::string>& keys) {
  if (keys.size() > kMaxKeysPerRequest) {
    throw InvalidArgumentError("store request names " + std::to_string(keys.size()) +
                               " keys; at most " + std::to_string(kMaxKeysPerRequest) +
                               " are allowed at once");
  }
  for (const std::string& key : keys) check_key(key);
}

int64_t add_to_counter(const std::string& key, const Bytes* current, int64_t delta) {
  int64_t value = 0;
  if (current != nullptr) {
    const char* begin = reinterpret_cast<const char*>(current->data());
    const char* end = begin + current->size();
    auto [ptr, ec] = std::from_chars(begin, end, value);
    if (current->empty() || ec != std::errc() || ptr != end) {
      throw InvalidArgumentError("store add to key " + quote_keys({key}, 1) +
                                 ": its value is not a decimal int64 (" +
                                 std::to_string(current->size()) + " bytes)");
    }
  }
  int64_t sum = 0;
  if (__builtin_add_overflow(value, delta, &sum)) {
    throw InvalidArgumentError("store add of " + std::to_string(delta) + " to key " +
                               quote_keys({key}, 1) + " (value " + std::to_string(value) +
                               ") overflows int64");
  }
  return sum;
}

Bytes counter_text(int64_t value) {
  std::string text = std::to_string(value);
  return Bytes(text.begin(), text.end());
}

bool compare_matches(const Bytes* current, const Bytes& expected) {
  return current == nullptr ? expected.empty() : *current == expected;
}

namespace {
std::string quote_key(const std::string& key) {
  std::string out = "'";
  for (unsigned char c : key.substr(0, 256)) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      hex::append_byte(out, c);
    }
  }
  if (key.size() > 256) out += "...";
  return out + "'";
}
}  // namespace

std::string quote_keys(const std::vector<std::string>& keys, size_t total) {
  std::string out;
  size_t shown = std::min(keys.size(), kMaxListedKeys);
  for (size_t i = 0; i < shown; ++i) {
    if (i > 0) out += ", ";
    out += quote_key(keys[i]);
  }
  if (total > shown) out += " and " + std::to_string(total - shown) + " more";
  return out;
}

std::chrono::milliseconds bounded_timeout(std::chrono::milliseconds timeout) {
  return std::clamp(timeout, std::chrono::milliseconds(0), kLongestWait);
}

std::string timeout_message(const std::string& what, std::chrono::milliseconds timeout,
                            const std::vector<std::string>& missing, size_t missing_count) {
  return what + " timed out after " + std::to_string(timeout.count()) + " ms; missing " +
         (missing_count == 1 ? "key " : "keys ") + quote_keys(missing, missing_count);
}

}  // namespace chorus::store::rules
