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

#include "run/cluster_env.h"

namespace chorus::run {
namespace {

constexpr std::string_view kDefault = "default";
constexpr int kIntMax = std::numeric_limits<int>::max();

// One chorusrun option. The LaunchOptions member, the underscore spelling and the
// CHORUS_RUN_ variable are all derived from the dashed name.
struct OptionSpec {
  std::string_view name;           // "nproc-per-node"
  std::string_view value_name;     // "N|auto"; empty for a flag
  std::string_view default_value;  // parsed like any given value
  std::string_view help;
};

constexpr OptionSpec kOptions[] = {
    {"nproc-per-node", "N|auto", "1", "workers on this node; auto: one per CPU"},
    {"nnodes", "N", "1", "number of nodes, each running one chorusrun"},
    {"node-rank", "K", "0", "rank of this node, 0 .. nnodes-1"},
    {"master-addr", "HOST", "127.0.0.1", "address of node 0, which hosts the rendezvous store"},
    {"master-port", "PORT", "29500",
     "port of the store on node 0: 1..65535 (0 only with --standalone)"},
    {"standalone", "", "0", "one node on 127.0.0.1, the store on a free port"},
    {"max-restarts", "N", "0", "times the whole job is restarted after a worker fails"},
    {"monitor-interval", "SECONDS", "0.1", "how often workers are checked: 0.001..3600"},
    {"rdzv-id", "ID", "none", "job id, also the job token"},
    {"log-dir", "DIR", "", "per-rank log files below DIR; empty: none"},
    {"tee", "0-3", "0",
     "streams whose console lines get a rank prefix:\n"
     "      0 none, 1 stdout, 2 stderr, 3 both"},
    {"redirects", "0-3", "0",
     "streams that go only to the log files (needs --log-dir):\n"
     "      0 none, 1 stdout, 2 stderr, 3 both"},
    {"local-addr", "ADDR", "", "address this node listens on; empty: chosen by route"},
    {"grace-period", "SECONDS", "5",
     "time from SIGTERM to SIGKILL when workers are stopped: 0..86400"},
    {"cpu-bind", "auto|none|share", "auto",
     "bind workers to CPUs: share: each its share of this launcher's CPUs\n"
     "      (one each, in turn, when workers outnumber CPUs); none: no binding;\n"
     "      auto: share only when workers outnumber CPUs"},
};

std::string member_name(const OptionSpec& spec) {
  std::string name(spec.name);
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

std::string dashed_flag(const OptionSpec& spec) { return "--" + std::string(spec.name); }

std::string environment_name(const OptionSpec& spec) {
  std::string name = "CHORUS_RUN_" + member_name(spec);
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return std::toupper(c); });
  return name;
}

// "--nproc-per-node" or "--nproc_per_node" -> its spec.
const OptionSpec* find_spec(std::string_view flag) {
  for (const OptionSpec& spec : kOptions) {
    if (flag == dashed_flag(spec) || flag == "--" + member_name(spec)) return &spec;
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

// In "--opt VALUE", a VALUE like "--nnodes" or "-h" is far more likely a forgotten value
// than a real one (argparse refuses it too); "--opt=--odd" still gives such a value.
bool looks_like_option(const std::string& arg) { return arg.rfind("--", 0) == 0 || arg == "-h"; }

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
    if (arg == "--" || arg.rfind("--", 0) != 0) break;  // the program, or not ours
    size_t equals = arg.find('=');
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
    options[member_name(spec)] =
        spec.value_name.empty()
            ? app.add_flag(names)
            : app.add_option(names)->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  }
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

void add_environment(const Environment& env, GivenValues& given) {
  for (const OptionSpec& spec : kOptions) {
    auto it = env.find(environment_name(spec));
    // An empty variable counts as unset, so that `VAR= chorusrun ...` clears it.
    if (it == env.end() || it->second.empty() || given.count(member_name(spec)) > 0) continue;
    given[member_name(spec)] = {it->second, it->first};
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

int to_int(const Given& given, int min, int max, std::string_view allowed) {
  const std::string& text = given.text;
  int value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  bool whole = error == std::errc() && end == text.data() + text.size();
  if (!whole || value < min || value > max) reject(given, allowed);
  return value;
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

uint16_t to_port(const Given& given, bool standalone) {
  return static_cast<uint16_t>(
      to_int(given, standalone ? 0 : 1, 65535,
             "must be a whole number from 1 to 65535 (0 only with --standalone)"));
}

void convert_values(const GivenValues& given, int cpus, LaunchOptions& options) {
  options.standalone = to_bool(given.at("standalone"));
  options.nproc_per_node = to_nproc(given.at("nproc_per_node"), cpus);
  options.nnodes = to_int(given.at("nnodes"), 1, kIntMax, "must be a whole number >= 1");
  options.node_rank = to_int(given.at("node_rank"), 0, kIntMax, "must be a whole number >= 0");
  options.master_addr = to_nonempty(given.at("master_addr"), "must be a host name or address");
  options.master_port = to_port(given.at("master_port"), options.standalone);
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
  if (options.master_addr != "127.0.0.1") conflict("master_addr", "standalone uses 127.0.0.1");
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
}

void append_option_help(const OptionSpec& spec, std::ostringstream& out) {
  out << "  " << dashed_flag(spec);
  if (!spec.value_name.empty()) out << " " << spec.value_name;
  std::string shown_default =
      spec.default_value.empty() ? "empty" : std::string(spec.default_value);
  if (spec.value_name.empty()) shown_default = "off";
  out << "\n      " << spec.help << "\n      default: " << shown_default
      << "; environment: " << environment_name(spec) << "\n";
}

}  // namespace

Environment current_environment() {
  Environment env;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    std::string_view text(*entry);
    size_t equals = text.find('=');
    // emplace keeps the first of duplicate names, as getenv() does.
    if (equals != text.npos) env.emplace(text.substr(0, equals), text.substr(equals + 1));
  }
  return env;
}

LaunchOptions parse_options(const std::vector<std::string>& args, const Environment& env,
                            int cpus) {
  CommandLine line = parse_command_line(args);
  if (line.program.empty()) {
    throw UsageError("no program given: usage: chorusrun [options] PROGRAM [ARGS...]");
  }
  GivenValues given = std::move(line.given);
  add_environment(env, given);
  // --standalone is one node on this machine, whatever the cluster says.
  bool standalone = given.count("standalone") > 0 && to_bool(given.at("standalone"));
  if (!standalone) add_cluster(env, given);
  add_defaults(given);
  LaunchOptions options;
  convert_values(given, cpus, options);
  apply_standalone(given, options);
  check_combinations(given, options);
  options.program = std::move(line.program);
  options.program_args = std::move(line.program_args);
  return options;
}

std::string usage_text() {
  std::ostringstream out;
  out << "usage: chorusrun [options] PROGRAM [ARGS...]\n\n"
         "Starts PROGRAM as --nproc-per-node workers on each of --nnodes nodes and supervises\n"
         "them. Options end at PROGRAM or at \"--\"; everything after PROGRAM is passed to it\n"
         "unchanged. Options are spelled with dashes or underscores (--nproc-per-node,\n"
         "--nproc_per_node), with the value as --opt VALUE or --opt=VALUE.\n\n"
         "options:\n";
  for (const OptionSpec& spec : kOptions) append_option_help(spec, out);
  out << "  -h, --help\n      print this text and exit\n\n"
         "Each value comes from the first of: the command line; its CHORUS_RUN_ variable\n"
         "(empty counts as unset; flags take 1/0); the cluster's environment; the default.\n\n"
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
