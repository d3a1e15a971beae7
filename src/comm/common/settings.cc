#include "comm/common/settings.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "chorus/defaults.h"
#include "chorus/error.h"

namespace chorus::settings {
namespace {

using std::chrono::milliseconds;

// First variable of the pair that is set, with its name; set but empty is an error
// (required_value()).
std::optional<std::pair<std::string, std::string>> first_set(const char* a, const char* b) {
  if (auto v = required_value(a)) return std::make_pair(std::string(a), *v);
  if (b != nullptr) {
    if (auto v = required_value(b)) return std::make_pair(std::string(b), *v);
  }
  return std::nullopt;
}

milliseconds duration_setting(const char* name, const char* fallback, milliseconds def) {
  auto v = first_set(name, fallback);
  if (!v) return def;
  return parse_duration(v->first, v->second, std::chrono::seconds(1));
}

}  // namespace

std::optional<std::string> get_env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

std::optional<std::string> required_value(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  if (*v == '\0') {
    throw ConfigError(std::string(name) +
                      " is set but empty; give it a value, or unset it for the default");
  }
  return std::string(v);
}

int64_t parse_int(const std::string& name, const std::string& value, int64_t min, int64_t max) {
  errno = 0;
  char* end = nullptr;
  long long n = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || end == value.c_str() || *end != '\0' || errno == ERANGE) {
    throw ConfigError(name + "='" + value + "' is not an integer");
  }
  if (n < min || n > max) {
    throw ConfigError(name + "=" + value + " is out of range [" + std::to_string(min) + ", " +
                      std::to_string(max) + "]");
  }
  return n;
}

milliseconds parse_duration(const std::string& name, const std::string& value, milliseconds unit) {
  size_t digits = 0;
  while (digits < value.size() && (std::isdigit(static_cast<unsigned char>(value[digits])) ||
                                   value[digits] == '.')) {
    ++digits;
  }
  std::string number = value.substr(0, digits), suffix = value.substr(digits);
  char* end = nullptr;
  double n = number.empty() ? -1 : std::strtod(number.c_str(), &end);
  double scale_ms;
  if (suffix.empty()) scale_ms = static_cast<double>(unit.count());
  else if (suffix == "ms") scale_ms = 1;
  else if (suffix == "s") scale_ms = 1000;
  else if (suffix == "m" || suffix == "min") scale_ms = 60e3;
  else if (suffix == "h") scale_ms = 3600e3;
  else scale_ms = -1;
  if (n <= 0 || end == nullptr || *end != '\0' || scale_ms < 0 || n * scale_ms > 1e12) {
    throw ConfigError(name + "='" + value +
                      "' is not a positive duration (seconds, or a number with ms/s/m/h)");
  }
  return milliseconds(static_cast<int64_t>(n * scale_ms + 0.5));
}

std::optional<int64_t> segment_bytes() {
  constexpr const char* kName = "CHORUS_SEGMENT_BYTES";
  constexpr int64_t kMin = int64_t{4} << 10, kMax = int64_t{1} << 30;
  auto v = required_value(kName);
  if (!v) return std::nullopt;
  std::string digits = *v;
  int shift = 0;
  switch (digits.back()) {
    case 'K': case 'k': shift = 10; break;
    case 'M': case 'm': shift = 20; break;
    case 'G': case 'g': shift = 30; break;
    default: break;
  }
  if (shift > 0) digits.pop_back();
  if (digits.empty() || !std::isdigit(static_cast<unsigned char>(digits[0]))) {
    throw ConfigError(std::string(kName) + "='" + *v +
                      "' is not a size in bytes (a number, optionally with K, M or G)");
  }
  // Bounded before the shift, so that it cannot overflow.
  const int64_t bytes = parse_int(kName, digits, 0, kMax) << shift;
  if (bytes < kMin || bytes > kMax) {
    throw ConfigError(std::string(kName) + "=" + *v + " is out of range [4K, 1G]");
  }
  return bytes;
}

int64_t trace_buffer_size() {
  auto v = required_value("CHORUS_TRACE_BUFFER_SIZE");
  return v ? parse_int("CHORUS_TRACE_BUFFER_SIZE", *v, 0, 1000000) : static_cast<int64_t>(kDefaultTraceBufferSize);
}

std::string trace_dir() { return get_env("CHORUS_TRACE_DIR").value_or(""); }

DebugMode debug_mode() {
  std::string v = get_env("CHORUS_DEBUG").value_or("OFF");
  for (char& c : v) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (v == "OFF") return DebugMode::kOff;
  if (v == "INFO") return DebugMode::kInfo;
  if (v == "DETAIL") return DebugMode::kDetail;
  throw ConfigError("CHORUS_DEBUG='" + v + "' is not one of OFF, INFO, DETAIL");
}

bool debug_detail() { return debug_mode() == DebugMode::kDetail; }

std::string cost_model() { return get_env("CHORUS_COST_MODEL").value_or(""); }

int shm_cma() {
  std::string v = get_env("CHORUS_SHM_CMA").value_or("1");
  if (v != "0" && v != "1" && v != "all") {
    throw ConfigError("CHORUS_SHM_CMA='" + v + "' is not 0, 1 or all");
  }
  return v == "all" ? 2 : v == "1" ? 1 : 0;
}

bool shm_direct() {
  std::string v = get_env("CHORUS_SHM_DIRECT").value_or("1");
  if (v != "0" && v != "1") throw ConfigError("CHORUS_SHM_DIRECT='" + v + "' is not 0 or 1");
  return v == "1";
}

bool shm_inline() {
  std::string v = get_env("CHORUS_SHM_INLINE").value_or("1");
  if (v != "0" && v != "1") throw ConfigError("CHORUS_SHM_INLINE='" + v + "' is not 0 or 1");
  return v == "1";
}

std::string node_id() { return get_env("CHORUS_NODE_ID").value_or(""); }

std::string transport() {
  std::string t = get_env("CHORUS_TRANSPORT").value_or("auto");
  if (t != "auto" && t != "tcp" && t != "shm") {
    throw ConfigError("CHORUS_TRANSPORT='" + t + "' is not one of auto, tcp, shm");
  }
  return t;
}

std::optional<TimeoutOverride> op_timeout_override() {
  auto v = first_set("CHORUS_TIMEOUT", "HCCL_EXEC_TIMEOUT");
  if (!v) return std::nullopt;
  return TimeoutOverride{v->first, v->second, parse_duration(v->first, v->second, std::chrono::seconds(1))};
}

milliseconds op_timeout() {
  auto set = op_timeout_override();
  return set ? set->timeout : kDefaultTimeout;
}

milliseconds connect_timeout() {
  return duration_setting("CHORUS_CONNECT_TIMEOUT", "HCCL_CONNECT_TIMEOUT",
                          kDefaultConnectTimeout);
}

std::string job_token() { return get_env("CHORUS_JOB_TOKEN").value_or(""); }

std::optional<AllowListFile> allowlist_file() {
  if (auto v = get_env("CHORUS_WHITELIST_FILE")) {
    return AllowListFile{*v, "CHORUS_WHITELIST_FILE"};
  }
  auto disable = get_env("HCCL_WHITELIST_DISABLE");
  if (disable && *disable != "0" && *disable != "1") {
    throw ConfigError("HCCL_WHITELIST_DISABLE='" + *disable + "' is not 0 or 1");
  }
  if (disable && *disable == "1") return std::nullopt;
  if (auto v = get_env("HCCL_WHITELIST_FILE")) return AllowListFile{*v, "HCCL_WHITELIST_FILE"};
  if (disable) {
    throw ConfigError(
        "HCCL_WHITELIST_DISABLE=0 turns the allow-list on, but neither CHORUS_WHITELIST_FILE "
        "nor HCCL_WHITELIST_FILE names its file");
  }
  return std::nullopt;
}

std::string algorithm() { return get_env("CHORUS_ALGO").value_or("auto"); }

std::string if_ip() {
  auto v = first_set("CHORUS_IF_IP", "HCCL_IF_IP");
  return v ? v->second : "";
}

std::string socket_ifname() {
  auto v = first_set("CHORUS_SOCKET_IFNAME", "HCCL_SOCKET_IFNAME");
  return v ? v->second : "";
}

std::string master_addr() { return required_value("MASTER_ADDR").value_or("127.0.0.1"); }

uint16_t master_port() {
  auto v = required_value("MASTER_PORT");
  return v ? static_cast<uint16_t>(parse_int("MASTER_PORT", *v, 1, 65535)) : 29500;
}

std::string store_addr() {
  auto v = required_value("CHORUS_STORE_ADDR");
  return v ? *v : master_addr();
}

uint16_t store_port() {
  auto v = required_value("CHORUS_STORE_PORT");
  return v ? static_cast<uint16_t>(parse_int("CHORUS_STORE_PORT", *v, 1, 65535)) : master_port();
}

namespace {
void check_rank_pair() {
  bool has_rank = required_value("RANK").has_value();
  bool has_size = required_value("WORLD_SIZE").has_value();
  if (has_rank != has_size) {
    throw ConfigError(std::string(has_rank ? "RANK is set but WORLD_SIZE is not"
                                           : "WORLD_SIZE is set but RANK is not") +
                      "; set both (env:// start-up) or neither (a 1-rank job)");
  }
}
}  // namespace

int world_size() {
  check_rank_pair();
  auto v = required_value("WORLD_SIZE");
  return v ? static_cast<int>(parse_int("WORLD_SIZE", *v, 1, 1 << 20)) : 1;
}

int rank() {
  check_rank_pair();
  auto v = required_value("RANK");
  if (!v) return 0;
  int size = world_size();
  return static_cast<int>(parse_int("RANK (with WORLD_SIZE=" + std::to_string(size) + ")", *v,
                                    0, size - 1));
}

bool store_hosted() {
  auto v = get_env("CHORUS_STORE_HOSTED");
  return v && *v != "0";
}

int restart_count() {
  auto v = required_value("CHORUS_RESTART_COUNT");
  return v ? static_cast<int>(parse_int("CHORUS_RESTART_COUNT", *v, 0, 1 << 30)) : 0;
}

int log_level() {
  auto v = get_env("CHORUS_LOG_LEVEL");
  if (!v) return debug_mode() == DebugMode::kOff ? 1 : 2;
  if (*v == "error") return 0;
  if (*v == "warn") return 1;
  if (*v == "info") return 2;
  if (*v == "debug") return 3;
  throw ConfigError("CHORUS_LOG_LEVEL='" + *v + "' is not one of error, warn, info, debug");
}

std::string reduce_isa() { return get_env("CHORUS_REDUCE_ISA").value_or("auto"); }

}  // namespace chorus::settings
