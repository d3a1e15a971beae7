// Each given text as its value, with the range it must lie in, and the checks across
// options (option_table.h).
#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>
#include <tuple>

#include "run/option_table.h"
#include "run/options.h"

namespace chorus::run {
namespace {

std::optional<int> whole_number(std::string_view text) {
  int value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

int to_int(const Given& given, int min, int max, std::string_view allowed) {
  std::optional<int> value = whole_number(given.text);
  if (!value || *value < min || *value > max) reject(given, allowed);
  return *value;
}

std::chrono::milliseconds to_duration(const Given& given, double min_s, double max_s,
                                      std::string_view allowed) {
  const std::string& text = given.text;
  double seconds = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), seconds);
  bool number = error == std::errc() && end == text.data() + text.size() && std::isfinite(seconds);
  if (!number || seconds < min_s || seconds > max_s) reject(given, allowed);
  return std::chrono::round<std::chrono::milliseconds>(std::chrono::duration<double>(seconds));
}

Streams to_streams(const Given& given) {
  return static_cast<Streams>(
      to_int(given, 0, 3, "must be 0 (none), 1 (stdout), 2 (stderr) or 3 (both)"));
}

std::string to_nonempty(const Given& given, std::string_view allowed) {
  if (given.text.empty()) reject(given, allowed);
  return given.text;
}

CpuBind to_cpu_bind(const Given& given) {
  if (auto bind = parse_cpu_bind(given.text)) return *bind;
  reject(given, "must be auto, none or share");
}

int to_nproc(const Given& given, int cpus) {
  if (given.text == "auto") return std::max(cpus, 1);
  return to_int(given, 1, kIntMax, "must be a whole number >= 1, or auto");
}

// "N", or torchrun's "MIN:MAX" (MIN <= MAX): {MIN, MAX}.
std::pair<int, int> to_nnodes(const Given& given) {
  size_t colon = given.text.find(':');
  if (colon == std::string::npos) {
    int n = to_int(given, 1, kIntMax, "must be a whole number >= 1");
    return {n, n};
  }
  std::string_view text = given.text;
  std::optional<int> low = whole_number(text.substr(0, colon));
  std::optional<int> high = whole_number(text.substr(colon + 1));
  if (!low || !high || *low < 1 || *low > *high) {
    reject(given, "must be N or MIN:MAX with whole numbers 1 <= MIN <= MAX");
  }
  return {*low, *high};
}

// torchrun's --rdzv-conf "KEY=VALUE,...": the keys that mean something here. A bad
// item is named as written ("--rdzv-conf join_timeout=soon").
void apply_rdzv_conf(const Given& given, LaunchOptions& options) {
  std::string_view text = given.text;
  while (!text.empty()) {
    size_t comma = text.find(',');
    std::string_view item = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    if (item.empty()) continue;
    size_t eq = item.find('=');
    std::string key(item.substr(0, eq));
    std::string value = eq == std::string_view::npos ? "" : std::string(item.substr(eq + 1));
    Given named{std::string(item), given.source};
    double seconds = 0;
    auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), seconds);
    bool number = !value.empty() && error == std::errc() && end == value.data() + value.size() &&
                  std::isfinite(seconds);
    auto duration = [&](double min_s) {
      if (!number || seconds < min_s || seconds > 86400) {
        reject(named, "must be a number of seconds from " + std::string(min_s > 0 ? "0.1" : "0") +
                          " to 86400");
      }
      return std::chrono::round<std::chrono::milliseconds>(std::chrono::duration<double>(seconds));
    };
    if (key == "join_timeout") {
      options.join_timeout = duration(0.1);
    } else if (key == "last_call_timeout") {
      options.last_call = duration(0);
    } else {
      reject(named, "unknown rendezvous setting; the settings are join_timeout=SECONDS and "
                    "last_call_timeout=SECONDS");
    }
  }
}

std::string to_host(const Given& given) {
  std::string_view allowed = "must be a host name or address";
  if (given.text.empty()) reject(given, allowed);
  for (unsigned char c : given.text) {
    if (!std::isalnum(c) && c != '.' && c != '-' && c != '_' && c != ':' && c != '%')
      reject(given, allowed);
  }
  return given.text;
}

std::string to_backend(const Given& given) {
  if (given.text == "static" || given.text == "c10d") return given.text;
  if (given.text == "etcd" || given.text == "etcd-v2") {
    reject(given, "etcd rendezvous is not supported: the launchers meet in the store that node "
                  "0's launcher hosts; use static or c10d");
  }
  reject(given, "must be static or c10d (both: node 0's launcher hosts the store)");
}

uint16_t to_port(const Given& given, bool standalone) {
  return static_cast<uint16_t>(
      to_int(given, standalone ? 0 : 1, 65535,
             "must be a whole number from 1 to 65535 (0 only with --standalone)"));
}

}  // namespace

bool to_bool(const Given& given) {
  const std::string& text = given.text;
  if (text == "1" || text == "true" || text == "yes" || text == "on") return true;
  if (text == "0" || text == "false" || text == "no" || text == "off") return false;
  reject(given, "must be 1, true, yes, on or 0, false, no, off");
}

void convert_values(const GivenValues& given, int cpus, LaunchOptions& options) {
  options.standalone = to_bool(given.at("standalone"));
  options.nproc_per_node = to_nproc(given.at("nproc_per_node"), cpus);
  std::tie(options.min_nnodes, options.nnodes) = to_nnodes(given.at("nnodes"));
  options.node_rank = to_int(given.at("node_rank"), 0, kIntMax, "must be a whole number >= 0");
  options.master_addr = to_host(given.at("master_addr"));
  options.master_port = to_port(given.at("master_port"), options.standalone);
  options.rdzv_backend = to_backend(given.at("rdzv_backend"));
  options.rdzv_endpoint = given.at("rdzv_endpoint").text;
  options.join_timeout = to_duration(given.at("rdzv_join_timeout"), 0.1, 86400,
                                     "must be a number of seconds from 0.1 to 86400");
  // The command line's --rdzv-join-timeout wins over a join_timeout in --rdzv-conf.
  const std::string join_source = given.at("rdzv_join_timeout").source;
  const auto join_given = options.join_timeout;
  apply_rdzv_conf(given.at("rdzv_conf"), options);
  if (join_source != kDefault) options.join_timeout = join_given;
  options.join_at_checkpoint = to_duration(given.at("join_at_checkpoint"), 0, 86400,
                                           "must be a number of seconds from 0 to 86400");
  options.max_restarts =
      to_int(given.at("max_restarts"), 0, kIntMax, "must be a whole number >= 0");
  options.monitor_interval = to_duration(given.at("monitor_interval"), 0.001, 3600,
                                         "must be a number of seconds from 0.001 to 3600");
  options.rdzv_id = to_nonempty(given.at("rdzv_id"), "must not be empty");
  options.log_dir = given.at("log_dir").text;
  options.tee = to_streams(given.at("tee"));
  options.redirects = to_streams(given.at("redirects"));
  options.local_addr = given.at("local_addr").text;
  options.grace_period = to_duration(given.at("grace_period"), 0, 86400,
                                     "must be a number of seconds from 0 to 86400");
  options.cpu_bind = to_cpu_bind(given.at("cpu_bind"));
  options.module = to_bool(given.at("module"));
  options.no_python = to_bool(given.at("no_python"));
  options.python = given.at("python").text;
  options.use_env = to_bool(given.at("use_env"));
  options.local_rank_arg = to_bool(given.at("local_rank_arg"));
  for (const auto& [key, value] : given) options.source[key] = value.source;
}

// --- Checks across options ---------------------------------------------------------

// --standalone means one node here; a value saying otherwise is a contradiction to
// report, not to override.
void apply_standalone(const GivenValues& given, LaunchOptions& options) {
  if (!options.standalone) return;
  const std::string& standalone = given.at("standalone").source;
  auto conflict = [&](const char* key, const char* why) {
    throw UsageError(standalone + ": cannot be combined with " + describe(given.at(key)) + " (" +
                     why + ")");
  };
  if (options.nnodes > 1) conflict("nnodes", "standalone runs one node");
  if (options.node_rank > 0) conflict("node_rank", "standalone runs node 0 only");
  if (options.master_addr != "127.0.0.1" && options.master_addr != "localhost")
    conflict("master_addr", "standalone uses 127.0.0.1");
  options.master_addr = "127.0.0.1";
  for (const char* key : {"nnodes", "node_rank", "master_addr"}) {
    if (given.at(key).source == kDefault) options.source[key] = standalone;
  }
}

void check_combinations(const GivenValues& given, const LaunchOptions& options) {
  // In an elastic job only node rank 0 means something (that node hosts the store).
  if (options.node_rank >= options.nnodes && !options.elastic()) {
    reject(given.at("node_rank"), "must be less than " + reference(given.at("nnodes"), "--nnodes"));
  }
  if (static_cast<int64_t>(options.nnodes) * options.nproc_per_node > kIntMax) {
    reject(given.at("nproc_per_node"), "with " + reference(given.at("nnodes"), "--nnodes") +
                                           " the world size must be at most " +
                                           std::to_string(kIntMax));
  }
  if (options.join_at_checkpoint.count() > 0 && !options.elastic()) {
    reject(given.at("join_at_checkpoint"),
           "only an elastic job (--nnodes MIN:MAX with MIN < MAX) admits joining nodes");
  }
  if (options.redirects != Streams::kNone && options.log_dir.empty()) {
    reject(given.at("redirects"), "needs --log-dir (redirected streams go only to log files)");
  }
  auto both = [&](const char* a, const char* b, const std::string& why) {
    throw UsageError(describe(given.at(a)) + ": cannot be combined with " + describe(given.at(b)) +
                     " (" + why + ")");
  };
  if (options.module && options.no_python) both("module", "no_python", "a module needs Python");
  if (options.use_env && options.local_rank_arg) {
    both("local_rank_arg", "use_env", "--use-env means: no --local_rank argument");
  }
}

// With --standalone the job runs on 127.0.0.1: an exported MASTER_ADDR naming another
// host is left aside, which is said rather than done silently.
void warn_unused_master_addr(const Environment& env, LaunchOptions& options) {
  auto it = env.find("MASTER_ADDR");
  if (!options.standalone || it == env.end() || it->second.empty()) return;
  if (it->second == "127.0.0.1" || it->second == "localhost") return;
  options.warnings.push_back("MASTER_ADDR=" + it->second + " is not used: " +
                             options.source.at("standalone") + " runs on 127.0.0.1");
}

}  // namespace chorus::run
