#include "run/options.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <sstream>
#include <string_view>

#include "chorus/version.h"
#include "run/cluster_env.h"

namespace chorus::run {
namespace {

constexpr std::string_view kDefault = "default";
constexpr std::string_view kChorusPrefix = "CHORUS_RUN_";
constexpr std::string_view kPetPrefix = "PET_";
constexpr int kIntMax = std::numeric_limits<int>::max();

// One chorusrun option. The LaunchOptions member, the underscore spelling, the
// CHORUS_RUN_ variable and the PET_ variable are all derived from the dashed name.
struct OptionSpec {
  constexpr OptionSpec(std::string_view name, std::string_view value_name,
                       std::string_view default_value, std::string_view help,
                       bool torchrun = false, std::string_view short_flag = {})
      : name(name), value_name(value_name), default_value(default_value), help(help),
        torchrun(torchrun), short_flag(short_flag) {}
  std::string_view name;           // "nproc-per-node"
  std::string_view value_name;     // "N|auto"; empty for a flag
  std::string_view default_value;  // parsed like any given value
  std::string_view help;
  bool torchrun;                   // torchrun has it too: also read from PET_<OPTION>
  std::string_view short_flag;     // torchrun's one-letter spelling ("-m"), if any
};

constexpr OptionSpec kOptions[] = {
    {"nproc-per-node", "N|auto", "1", "workers on this node; auto: one per CPU", true},
    {"nnodes", "N|N:N", "1",
     "number of nodes, each running one chorusrun; MIN:MAX only with MIN == MAX\n"
     "      (elastic ranges are not supported yet)",
     true},
    {"node-rank", "K", "0", "rank of this node, 0 .. nnodes-1", true},
    {"master-addr", "HOST", "127.0.0.1",
     "address of node 0, whose launcher hosts the rendezvous store;\n"
     "      an exported MASTER_ADDR is the default below the variables",
     true},
    {"master-port", "PORT", "29500",
     "port of that store: 1..65535 (0 only with --standalone); an exported\n"
     "      MASTER_PORT is the default below the variables; the workers get\n"
     "      another port as MASTER_PORT (see below)",
     true},
    {"standalone", "", "0", "one node on 127.0.0.1, the store on a free port", true},
    {"rdzv-backend", "static|c10d", "static",
     "how the launchers meet; both mean the same here: node 0's launcher\n"
     "      hosts the store (etcd and etcd-v2 are not supported)",
     true},
    {"rdzv-endpoint", "HOST[:PORT]", "",
     "another spelling of --master-addr HOST [--master-port PORT]", true},
    {"rdzv-conf", "CONF", "", "must be empty: rendezvous settings are not supported", true},
    {"max-restarts", "N", "0", "times the whole job is restarted after a worker fails", true},
    {"monitor-interval", "SECONDS", "0.1", "how often workers are checked: 0.001..3600", true},
    {"rdzv-id", "ID", "none", "job id, also the job token", true},
    {"log-dir", "DIR", "", "per-rank log files below DIR; empty: none", true},
    {"tee", "0-3", "0",
     "streams whose console lines get a rank prefix:\n"
     "      0 none, 1 stdout, 2 stderr, 3 both",
     true, "-t"},
    {"redirects", "0-3", "0",
     "streams that go only to the log files (needs --log-dir):\n"
     "      0 none, 1 stdout, 2 stderr, 3 both",
     true, "-r"},
    {"local-addr", "ADDR", "", "address this node listens on; empty: chosen by route", true},
    {"grace-period", "SECONDS", "5",
     "time from SIGTERM to SIGKILL when workers are stopped: 0..86400"},
    {"cpu-bind", "auto|none|share", "auto",
     "bind workers to CPUs: share: each its share of this launcher's CPUs\n"
     "      (one each, in turn, when workers outnumber CPUs); none: no binding;\n"
     "      auto: share only when workers outnumber CPUs"},
    {"module", "", "0", "PROGRAM is a Python module: run PYTHON -u -m PROGRAM ARGS...", true,
     "-m"},
    {"no-python", "", "0", "run PROGRAM itself, even when its name ends in .py", true},
    {"python", "PATH", "",
     "interpreter for --module and for a PROGRAM ending in .py; empty:\n"
     "      /usr/bin/python3 if it exists, else python3 from PATH"},
    {"use-env", "", "0",
     "torch.distributed.launch's flag: workers read LOCAL_RANK from the\n"
     "      environment; that is always so here (it only refuses --local-rank-arg)"},
    {"local-rank-arg", "", "0",
     "also pass --local_rank=N as the last argument of each worker, as\n"
     "      python -m torch.distributed.launch does without --use-env"},
};

std::string member_name(const OptionSpec& spec) {
  std::string name(spec.name);
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

std::string dashed_flag(const OptionSpec& spec) { return "--" + std::string(spec.name); }

// "CHORUS_RUN_NPROC_PER_NODE" for prefix "CHORUS_RUN_", "PET_NPROC_PER_NODE" for "PET_".
std::string environment_name(const OptionSpec& spec, std::string_view prefix) {
  std::string name = std::string(prefix) + member_name(spec);
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return std::toupper(c); });
  return name;
}

// "--nproc-per-node", "--nproc_per_node" or a short flag ("-m") -> its spec.
const OptionSpec* find_spec(std::string_view flag) {
  for (const OptionSpec& spec : kOptions) {
    if (flag == dashed_flag(spec) || flag == "--" + member_name(spec)) return &spec;
    if (!spec.short_flag.empty() && flag == spec.short_flag) return &spec;
  }
  return nullptr;
}

// A value as it was given, and by whom: "--nnodes", "CHORUS_RUN_NNODES", "SLURM_NNODES",
// "default". Keyed by LaunchOptions member name.
struct Given {
  std::string text;
  std::string source;
};
using GivenValues = std::map<std::string, Given>;

// `source text` for the command line, `source=text` for a variable: what the user wrote.
std::string describe(const Given& given) {
  bool quote = given.text.empty() || given.text.find(' ') != std::string::npos;
  std::string text = quote ? "\"" + given.text + "\"" : given.text;
  bool from_command_line = given.source.rfind("--", 0) == 0;
  if (from_command_line && given.text == "true") return given.source;  // a bare flag
  return given.source + (from_command_line ? " " : "=") + text;
}

// How a message names a value another is checked against: "--nnodes (2)".
std::string reference(const Given& given, std::string_view option) {
  if (given.source == kDefault) return std::string(option) + " (" + given.text + ", the default)";
  return given.source + " (" + given.text + ")";
}

[[noreturn]] void reject(const Given& given, std::string_view allowed) {
  throw UsageError(describe(given) + ": " + std::string(allowed));
}

// --- The command line --------------------------------------------------------------

// In "--opt VALUE", a VALUE like "--nnodes", "-h" or "-m" is far more likely a forgotten
// value than a real one (argparse refuses it too); "--opt=--odd" still gives such a value.
bool looks_like_option(const std::string& arg) {
  return arg.rfind("--", 0) == 0 || arg == "-h" || (arg.size() == 2 && find_spec(arg) != nullptr);
}

void check_value_follows(const std::vector<std::string>& args, size_t i, const OptionSpec& spec) {
  std::string needs = args[i] + ": needs a value (" + std::string(spec.value_name) + ")";
  if (i + 1 == args.size()) throw UsageError(needs);
  if (looks_like_option(args[i + 1])) {
    throw UsageError(needs + " before " + args[i + 1] + "; to give that as the value, write " +
                     args[i] + "=VALUE");
  }
}

// CLI11 reads "--opt=" (nothing after '=') as "value not here" and takes the next
// argument, which would swallow the program; so that form becomes "--opt ''". A missing
// value gets a message that names the option, instead of CLI11's.
std::vector<std::string> with_explicit_values(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--" || arg.rfind("-", 0) != 0) break;  // the program
    size_t equals = arg.rfind("--", 0) == 0 ? arg.find('=') : std::string::npos;
    const OptionSpec* spec = find_spec(std::string_view(arg).substr(0, equals));
    if (spec == nullptr || spec->value_name.empty()) {
      out.push_back(arg);  // a flag, or unknown: CLI11 handles both
    } else if (equals == std::string::npos) {
      check_value_follows(args, i, *spec);
      out.insert(out.end(), {arg, args[++i]});
    } else if (equals + 1 == arg.size()) {
      out.insert(out.end(), {arg.substr(0, equals), ""});
    } else {
      out.push_back(arg);
    }
  }
  out.insert(out.end(), args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  return out;
}

void run_parser(CLI::App& app, std::vector<std::string> args) {
  std::reverse(args.begin(), args.end());  // CLI11 takes them last first
  try {
    app.parse(args);
  } catch (const CLI::CallForHelp&) {
    throw HelpRequested();
  } catch (const CLI::CallForVersion&) {
    throw VersionRequested();
  } catch (const CLI::ExtrasError&) {
    throw UsageError("unknown option " + app.remaining().front() +
                     " (chorusrun --help lists the options)");
  } catch (const CLI::ParseError& e) {
    throw UsageError(e.what());
  }
}

struct CommandLine {
  GivenValues given;
  std::string program;
  std::vector<std::string> program_args;
};

CommandLine parse_command_line(const std::vector<std::string>& args) {
  CLI::App app{"chorusrun"};
  // The first positional is the program: everything after it is the program's own,
  // even when it looks like one of our options.
  app.positionals_at_end();
  std::map<std::string, CLI::Option*> options;
  for (const OptionSpec& spec : kOptions) {
    std::string names = dashed_flag(spec) + ",--" + member_name(spec);
    if (!spec.short_flag.empty()) names = std::string(spec.short_flag) + "," + names;
    options[member_name(spec)] =
        spec.value_name.empty()
            ? app.add_flag(names)
            : app.add_option(names)->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  }
  app.set_version_flag("--version", CHORUS_VERSION);
  CommandLine line;
  app.add_option("program", line.program);
  app.add_option("args", line.program_args);
  run_parser(app, with_explicit_values(args));
  for (const OptionSpec& spec : kOptions) {
    const CLI::Option* option = options.at(member_name(spec));
    // The last one wins, as in torchrun; a bare flag's result is "true".
    if (option->count() > 0)
      line.given[member_name(spec)] = {option->results().back(), dashed_flag(spec)};
  }
  return line;
}

// --- Other sources ---------------------------------------------------------------

// The values of one level of variables (prefix "CHORUS_RUN_" or "PET_"); PET_ only for
// the options torchrun has.
GivenValues from_environment(const Environment& env, std::string_view prefix) {
  GivenValues given;
  for (const OptionSpec& spec : kOptions) {
    if (prefix == kPetPrefix && !spec.torchrun) continue;
    auto it = env.find(environment_name(spec, prefix));
    // An empty variable counts as unset, so that `VAR= chorusrun ...` clears it.
    if (it == env.end() || it->second.empty()) continue;
    given[member_name(spec)] = {it->second, it->first};
  }
  return given;
}

// Values of a lower level fill only what the higher ones left open.
void add_below(const GivenValues& lower, GivenValues& given) {
  for (const auto& [key, value] : lower) given.try_emplace(key, value);
}

// "HOST", "HOST:PORT", "[V6]" or "[V6]:PORT" -> host and port (empty when not given).
std::pair<std::string, std::string> split_endpoint(const Given& endpoint) {
  const std::string& text = endpoint.text;
  if (!text.empty() && text.front() == '[') {
    size_t close = text.find(']');
    if (close == std::string::npos) reject(endpoint, "an IPv6 address needs its closing ]");
    std::string rest = text.substr(close + 1);
    if (!rest.empty() && rest.front() != ':') reject(endpoint, "must be HOST or HOST:PORT");
    return {text.substr(1, close - 1), rest.empty() ? "" : rest.substr(1)};
  }
  size_t colon = text.rfind(':');
  // More than one colon and no brackets: an IPv6 address without a port.
  if (colon == std::string::npos || text.find(':') != colon) return {text, ""};
  return {text.substr(0, colon), text.substr(colon + 1)};
}

// --rdzv-endpoint HOST[:PORT] is --master-addr HOST [--master-port PORT] given at the
// same level (command line, CHORUS_RUN_ or PET_): the same value twice is fine, two
// different ones at one level are refused.
void map_endpoint(GivenValues& level) {
  auto endpoint = level.find("rdzv_endpoint");
  if (endpoint == level.end() || endpoint->second.text.empty()) return;
  auto [host, port] = split_endpoint(endpoint->second);
  if (host.empty()) reject(endpoint->second, "needs a host: HOST or HOST:PORT");
  for (auto [key, text] : {std::pair{"master_addr", host}, std::pair{"master_port", port}}) {
    if (text.empty()) continue;
    auto it = level.find(key);
    if (it != level.end() && it->second.text != text) {
      throw UsageError(describe(endpoint->second) + ": contradicts " + describe(it->second) +
                       " (--rdzv-endpoint gives the master address and port; give one of them)");
    }
    level[key] = {text, endpoint->second.source};
  }
}

// torch's own start-up variables, exported by whoever runs chorusrun (or by a job
// controller): defaults of --master-addr/--master-port below every option source.
// --standalone runs on 127.0.0.1 and so takes MASTER_PORT only (warn_unused_master_addr).
void add_exported_master(const Environment& env, bool standalone, GivenValues& given) {
  for (auto [variable, key] : {std::pair{"MASTER_ADDR", "master_addr"},
                               std::pair{"MASTER_PORT", "master_port"}}) {
    if (standalone && std::string_view(key) == "master_addr") continue;
    auto it = env.find(variable);
    if (it != env.end() && !it->second.empty()) given.try_emplace(key, Given{it->second, variable});
  }
}

void offer(const ClusterInfo& cluster, const std::string& key,
           const std::optional<std::string>& text, GivenValues& given) {
  if (text && given.count(key) == 0) given[key] = {*text, cluster.source.at(key)};
}

std::optional<std::string> as_text(std::optional<int> number) {
  if (!number) return std::nullopt;
  return std::to_string(*number);
}

bool cluster_can_help(const GivenValues& given) {
  for (const char* key : {"nnodes", "node_rank", "master_addr", "rdzv_id"}) {
    if (given.count(key) == 0) return true;
  }
  return false;
}

// Only when some option it could supply is missing: a cluster variable that chorus
// cannot read must not block a user who gave every value himself.
void add_cluster(const Environment& env, GivenValues& given) {
  if (!cluster_can_help(given)) return;
  std::optional<ClusterInfo> cluster = detect_cluster(env);
  if (!cluster) return;
  offer(*cluster, "nnodes", as_text(cluster->nnodes), given);
  offer(*cluster, "node_rank", as_text(cluster->node_rank), given);
  offer(*cluster, "master_addr", cluster->master_addr, given);
  offer(*cluster, "rdzv_id", cluster->job_id, given);
}

void add_defaults(GivenValues& given) {
  for (const OptionSpec& spec : kOptions) {
    given.try_emplace(member_name(spec),
                      Given{std::string(spec.default_value), std::string(kDefault)});
  }
}

// --- Values ------------------------------------------------------------------------

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

bool to_bool(const Given& given) {
  const std::string& text = given.text;
  if (text == "1" || text == "true" || text == "yes" || text == "on") return true;
  if (text == "0" || text == "false" || text == "no" || text == "off") return false;
  reject(given, "must be 1, true, yes, on or 0, false, no, off");
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

// "N", or torchrun's "MIN:MAX" with MIN == MAX.
int to_nnodes(const Given& given) {
  size_t colon = given.text.find(':');
  if (colon == std::string::npos) return to_int(given, 1, kIntMax, "must be a whole number >= 1");
  std::string_view text = given.text;
  std::optional<int> low = whole_number(text.substr(0, colon));
  std::optional<int> high = whole_number(text.substr(colon + 1));
  if (!low || !high || *low < 1 || *low > *high) {
    reject(given, "must be N or MIN:MAX with whole numbers 1 <= MIN <= MAX");
  }
  if (*low != *high) {
    reject(given, "elastic ranges (MIN:MAX with MIN < MAX) are not supported yet; give one number");
  }
  return *low;
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

void convert_values(const GivenValues& given, int cpus, LaunchOptions& options) {
  options.standalone = to_bool(given.at("standalone"));
  options.nproc_per_node = to_nproc(given.at("nproc_per_node"), cpus);
  options.nnodes = to_nnodes(given.at("nnodes"));
  options.node_rank = to_int(given.at("node_rank"), 0, kIntMax, "must be a whole number >= 0");
  options.master_addr = to_host(given.at("master_addr"));
  options.master_port = to_port(given.at("master_port"), options.standalone);
  options.rdzv_backend = to_backend(given.at("rdzv_backend"));
  options.rdzv_endpoint = given.at("rdzv_endpoint").text;
  if (!given.at("rdzv_conf").text.empty()) {
    reject(given.at("rdzv_conf"), "rendezvous settings are not supported (the launchers' "
                                  "deadline is CHORUS_CONNECT_TIMEOUT); leave it empty");
  }
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
  if (options.node_rank >= options.nnodes) {
    reject(given.at("node_rank"), "must be less than " + reference(given.at("nnodes"), "--nnodes"));
  }
  if (static_cast<int64_t>(options.nnodes) * options.nproc_per_node > kIntMax) {
    reject(given.at("nproc_per_node"), "with " + reference(given.at("nnodes"), "--nnodes") +
                                           " the world size must be at most " +
                                           std::to_string(kIntMax));
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

void append_option_help(const OptionSpec& spec, std::ostringstream& out) {
  out << "  " << (spec.short_flag.empty() ? "" : std::string(spec.short_flag) + ", ")
      << dashed_flag(spec);
  if (!spec.value_name.empty()) out << " " << spec.value_name;
  std::string shown_default =
      spec.default_value.empty() ? "empty" : std::string(spec.default_value);
  if (spec.value_name.empty()) shown_default = "off";
  out << "\n      " << spec.help << "\n      default: " << shown_default
      << "; environment: " << environment_name(spec, kChorusPrefix);
  if (spec.torchrun) out << ", " << environment_name(spec, kPetPrefix);
  out << "\n";
}

}  // namespace

LaunchOptions parse_options(const std::vector<std::string>& args, const Environment& env,
                            int cpus) {
  CommandLine line = parse_command_line(args);
  if (line.program.empty()) {
    throw UsageError("no program given: usage: chorusrun [options] PROGRAM [ARGS...]");
  }
  GivenValues given = std::move(line.given);
  GivenValues chorus_variables = from_environment(env, kChorusPrefix);
  GivenValues pet_variables = from_environment(env, kPetPrefix);
  for (GivenValues* level : {&given, &chorus_variables, &pet_variables}) map_endpoint(*level);
  add_below(chorus_variables, given);
  add_below(pet_variables, given);
  // --standalone is one node on this machine, whatever the cluster says.
  bool standalone = given.count("standalone") > 0 && to_bool(given.at("standalone"));
  add_exported_master(env, standalone, given);
  if (!standalone) add_cluster(env, given);
  add_defaults(given);
  LaunchOptions options;
  convert_values(given, cpus, options);
  apply_standalone(given, options);
  check_combinations(given, options);
  warn_unused_master_addr(env, options);
  options.program = std::move(line.program);
  options.program_args = std::move(line.program_args);
  return options;
}

std::string usage_text() {
  std::ostringstream out;
  out << "usage: chorusrun [options] PROGRAM [ARGS...]\n"
         "       chorusrun [options] -m MODULE [ARGS...]\n\n"
         "Starts PROGRAM as --nproc-per-node workers on each of --nnodes nodes and supervises\n"
         "them. Options end at PROGRAM or at \"--\"; everything after PROGRAM is passed to it\n"
         "unchanged. Options are spelled with dashes or underscores (--nproc-per-node,\n"
         "--nproc_per_node), with the value as --opt VALUE or --opt=VALUE.\n\n"
         "How each worker is started (as torchrun does):\n"
         "  -m MODULE ARGS      PYTHON -u -m MODULE ARGS\n"
         "  SCRIPT.py ARGS      PYTHON -u SCRIPT.py ARGS (unless --no-python)\n"
         "  PROGRAM ARGS        PROGRAM ARGS (anything else; e.g. /usr/bin/python3 train.py)\n"
         "  PYTHON is --python; --local-rank-arg adds --local_rank=N after the last argument.\n\n"
         "options:\n";
  for (const OptionSpec& spec : kOptions) append_option_help(spec, out);
  out << "  -h, --help\n      print this text and exit\n"
         "  --version\n      print chorusrun's version and exit\n\n"
         "Each value comes from the first of: the command line; its CHORUS_RUN_ variable;\n"
         "its PET_ variable (torchrun's, for the options torchrun has); for --master-addr and\n"
         "--master-port an exported MASTER_ADDR / MASTER_PORT; the cluster's environment;\n"
         "the default. Empty variables count as unset; flags take 1/0. --rdzv-endpoint\n"
         "HOST[:PORT] counts as --master-addr/--master-port at its own level (two different\n"
         "values at one level are refused). With --standalone an exported MASTER_PORT is\n"
         "still the store's port, and an exported MASTER_ADDR naming another host is not\n"
         "used (with a warning).\n\n"
         "Ports: node 0's launcher hosts chorus's store on --master-port (workers of chorus\n"
         "programs find it through CHORUS_STORE_ADDR / CHORUS_STORE_PORT). For every attempt\n"
         "it picks another port free on the master address and gives it to all workers as\n"
         "MASTER_PORT, so that a PyTorch program's rank 0 can bind its own TCPStore there\n"
         "(init_process_group with env://), as under torchrun's c10d rendezvous.\n\n"
         "clusters (not read with --standalone):\n"
         "  mpirun, one chorusrun per node (OMPI_COMM_WORLD_SIZE set):\n"
         "      --nnodes OMPI_COMM_WORLD_SIZE, --node-rank OMPI_COMM_WORLD_RANK\n"
         "  Slurm (SLURM_JOB_ID set, and OMPI_COMM_WORLD_SIZE not):\n"
         "      --nnodes SLURM_NNODES (or SLURM_JOB_NUM_NODES), --node-rank SLURM_NODEID,\n"
         "      --master-addr the first host of SLURM_JOB_NODELIST (or SLURM_NODELIST),\n"
         "      --rdzv-id SLURM_JOB_ID\n";
  return out.str();
}

}  // namespace chorus::run
