#include "comm/common/allowlist.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "chorus/error.h"
#include "comm/common/settings.h"

namespace chorus::net {
namespace {

// A local file named by the user, yet bounded all the same.
constexpr std::streamoff kMaxFileBytes = 16 << 20;

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

[[noreturn]] void malformed(const std::string& source, const std::string& where,
                            const std::string& what) {
  throw ConfigError("allow-list " + source + " " + where + ": " + what);
}

// HCCL's JSON form, {"host_ip": ["a.b.c.d", ...]}: the strings of that array (other
// members are ignored).
std::vector<std::string> hccl_json_entries(const std::string& text, const std::string& source) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw ConfigError("allow-list " + source + " is not valid JSON: " + e.what());
  }
  if (!doc.is_object() || !doc.contains("host_ip")) {
    throw ConfigError("allow-list " + source +
                      ": a JSON allow-list must be an object with a \"host_ip\" array, "
                      "{\"host_ip\": [\"a.b.c.d\", ...]}");
  }
  const nlohmann::json& ips = doc["host_ip"];
  if (!ips.is_array()) {
    throw ConfigError("allow-list " + source + ": \"host_ip\" must be an array of addresses");
  }
  std::vector<std::string> entries;
  for (size_t i = 0; i < ips.size(); ++i) {
    if (!ips[i].is_string()) {
      malformed(source, "host_ip entry " + std::to_string(i + 1),
                ips[i].dump() + " is not a string");
    }
    entries.push_back(ips[i].get<std::string>());
  }
  return entries;
}

}  // namespace

void AllowList::add(const std::string& entry, const std::string& source, const std::string& where) {
  std::string text = entry, prefix_text;
  size_t slash = entry.find('/');
  if (slash != std::string::npos) {
    text = entry.substr(0, slash);
    prefix_text = entry.substr(slash + 1);
  }
  Entry e;
  int max_prefix = 0;
  if (inet_pton(AF_INET, text.c_str(), e.bytes.data()) == 1) {
    e.family = AF_INET;
    max_prefix = 32;
  } else if (inet_pton(AF_INET6, text.c_str(), e.bytes.data()) == 1) {
    e.family = AF_INET6;
    max_prefix = 128;
  } else {
    malformed(source, where,
              "'" + entry +
                  "' is not an IPv4 or IPv6 address or network (a.b.c.d, a.b.c.d/n, x::y, "
                  "x::y/n)");
  }
  e.prefix = max_prefix;
  if (slash != std::string::npos) {
    bool digits = !prefix_text.empty() && prefix_text.size() <= 3;
    for (char c : prefix_text) digits = digits && std::isdigit(static_cast<unsigned char>(c));
    int n = digits ? std::stoi(prefix_text) : -1;
    if (n < 0 || n > max_prefix) {
      malformed(source, where,
                "'" + entry + "': the prefix length must be a number from 0 to " +
                    std::to_string(max_prefix));
    }
    e.prefix = n;
  }
  // Keep only the network bits, so that matching compares whole bytes.
  int bytes = max_prefix / 8;
  for (int i = 0; i < bytes; ++i) {
    int bits = std::min(8, std::max(0, e.prefix - 8 * i));
    e.bytes[i] &= static_cast<uint8_t>(bits == 0 ? 0 : (0xff << (8 - bits)) & 0xff);
  }
  entries_.push_back(e);
}

AllowList AllowList::parse(const std::string& text, const std::string& source) {
  AllowList list;
  list.restricts_ = true;
  list.source_ = source;
  size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '{') {
    std::vector<std::string> entries = hccl_json_entries(text, source);
    for (size_t i = 0; i < entries.size(); ++i) {
      list.add(trim(entries[i]), source, "host_ip entry " + std::to_string(i + 1));
    }
  } else {
    std::istringstream in(text);
    std::string line;
    int number = 0;
    while (std::getline(in, line)) {
      ++number;
      size_t hash = line.find('#');
      if (hash != std::string::npos) line.resize(hash);
      line = trim(line);
      if (line.empty()) continue;
      if (line.find_first_of(" \t,") != std::string::npos) {
        malformed(source, "line " + std::to_string(number),
                  "'" + line + "': one address or network per line");
      }
      list.add(line, source, "line " + std::to_string(number));
    }
  }
  if (list.entries_.empty()) {
    throw ConfigError("allow-list " + source +
                      " lists no address: every connection would be refused (remove the "
                      "setting to allow every address)");
  }
  return list;
}

AllowList AllowList::load(const std::string& path, const std::string& variable) {
  std::string source = path + " (" + variable + ")";
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw ConfigError("cannot read the allow-list " + source + ": " + std::strerror(errno));
  }
  in.seekg(0, std::ios::end);
  std::streamoff size = in.tellg();
  if (size > kMaxFileBytes) {
    throw ConfigError("allow-list " + source + " is " + std::to_string(size) +
                      " bytes, more than the limit of " + std::to_string(kMaxFileBytes));
  }
  in.seekg(0, std::ios::beg);
  std::string text(size > 0 ? static_cast<size_t>(size) : 0, '\0');
  if (size > 0 && !in.read(text.data(), size)) {
    throw ConfigError("cannot read the allow-list " + source);
  }
  return parse(text, source);
}

AllowList AllowList::from_env() {
  auto file = settings::allowlist_file();
  if (!file) return AllowList();
  return load(file->path, file->variable);
}

bool AllowList::allows_bytes(int family, const uint8_t* bytes) const {
  if (!restricts_) return true;
  for (const Entry& e : entries_) {
    if (e.family != family) continue;
    int full = e.prefix / 8, rest = e.prefix % 8;
    if (std::memcmp(e.bytes.data(), bytes, full) != 0) continue;
    if (rest != 0) {
      uint8_t mask = static_cast<uint8_t>((0xff << (8 - rest)) & 0xff);
      if ((bytes[full] & mask) != e.bytes[full]) continue;
    }
    return true;
  }
  return false;
}

bool AllowList::allows(const SockAddr& address) const {
  if (!restricts_) return true;
  if (address.family() == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&address.storage);
    return allows_bytes(AF_INET, reinterpret_cast<const uint8_t*>(&in->sin_addr));
  }
  if (address.family() == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&address.storage);
    const uint8_t* b = in6->sin6_addr.s6_addr;
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) return allows_bytes(AF_INET, b + 12);
    return allows_bytes(AF_INET6, b);
  }
  return false;
}

bool AllowList::allows_ip(const std::string& ip) const {
  if (!restricts_) return true;
  uint8_t bytes[16];
  if (inet_pton(AF_INET, ip.c_str(), bytes) == 1) return allows_bytes(AF_INET, bytes);
  if (inet_pton(AF_INET6, ip.c_str(), bytes) == 1) {
    in6_addr a;
    std::memcpy(&a, bytes, 16);
    if (IN6_IS_ADDR_V4MAPPED(&a)) return allows_bytes(AF_INET, bytes + 12);
    return allows_bytes(AF_INET6, bytes);
  }
  return false;
}

std::string AllowList::describe() const {
  if (!restricts_) return "no allow-list (every address allowed)";
  return "the allow-list " + source_;
}

}  // namespace chorus::net
