// The option table behind parse_options (options.h), the values given for it, and the
// steps of parse_options. Internal to src/run/: only the files that define those steps
// include it:
// - option_table.cc: the names derived from each option (flags, variables) and the
//   messages that name a given value;
// - command_line.cc: the command line (CLI11);
// - option_sources.cc: the other sources, in their order (CHORUS_RUN_*, PET_*, an
//   exported MASTER_ADDR / MASTER_PORT, the cluster's environment, the defaults);
// - option_values.cc: each text as its value, and the checks across options;
// - options.cc: parse_options, which chains them, and usage_text.
#pragma once

#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "run/cluster_env.h"
#include "run/environment.h"

namespace chorus::run {

struct LaunchOptions;  // options.h

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

inline constexpr OptionSpec kOptions[] = {
    {"nproc-per-node", "N|auto", "1", "workers on this node; auto: one per CPU", true},
    {"nnodes", "N|MIN:MAX", "1",
     "number of nodes, each running one chorusrun; MIN:MAX with MIN < MAX: an\n"
     "      elastic job, which runs on MIN to MAX nodes (see below)",
     true},
    {"node-rank", "K", "0",
     "rank of this node, 0 .. nnodes-1; in an elastic job only 0 counts\n"
     "      (that node hosts the store; any other value: ranked by join order)",
     true},
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
    {"rdzv-conf", "CONF", "",
     "KEY=VALUE,...: join_timeout=SECONDS (as --rdzv-join-timeout),\n"
     "      last_call_timeout=SECONDS (elastic: how long the first round waits for\n"
     "      more than MIN nodes; default 2)",
     true},
    {"rdzv-join-timeout", "SECONDS", "30",
     "elastic: how long node 0 waits for MIN nodes (at the start and after a\n"
     "      loss): 0.1..86400"},
    {"join-at-checkpoint", "SECONDS", "0",
     "elastic: when a node joins, ask the workers to stop at their next\n"
     "      checkpoint and wait up to SECONDS for it, then stop them anyway\n"
     "      (0: stop them at once): 0..86400"},
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

std::string member_name(const OptionSpec& spec);
std::string dashed_flag(const OptionSpec& spec);
std::string environment_name(const OptionSpec& spec, std::string_view prefix);
const OptionSpec* find_spec(std::string_view flag);

// A value as it was given, and by whom: "--nnodes", "CHORUS_RUN_NNODES", "SLURM_NNODES",
// "default". Keyed by LaunchOptions member name.
struct Given {
  std::string text;
  std::string source;
};
using GivenValues = std::map<std::string, Given>;

std::string describe(const Given& given);
std::string reference(const Given& given, std::string_view option);
[[noreturn]] void reject(const Given& given, std::string_view allowed);

// --- The command line (command_line.cc) --------------------------------------------

struct CommandLine {
  GivenValues given;
  std::string program;
  std::vector<std::string> program_args;
};

CommandLine parse_command_line(const std::vector<std::string>& args);

// --- Other sources (option_sources.cc) ---------------------------------------------

GivenValues from_environment(const Environment& env, std::string_view prefix);
void add_below(const GivenValues& lower, GivenValues& given);
void map_endpoint(GivenValues& level);
void add_exported_master(const Environment& env, bool standalone, GivenValues& given);
std::optional<ClusterInfo> add_cluster(const Environment& env, GivenValues& given);
void check_cluster(const std::optional<ClusterInfo>& cluster, const Environment& env,
                   const GivenValues& given, LaunchOptions& options);
void add_defaults(GivenValues& given);

// --- Values and checks across options (option_values.cc) ---------------------------

bool to_bool(const Given& given);
void convert_values(const GivenValues& given, int cpus, LaunchOptions& options);
void apply_standalone(const GivenValues& given, LaunchOptions& options);
void check_combinations(const GivenValues& given, const LaunchOptions& options);
void warn_unused_master_addr(const Environment& env, LaunchOptions& options);

}  // namespace chorus::run
