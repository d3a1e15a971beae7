// chorusrun's command line: torchrun's options, spelled with dashes or underscores,
// each also settable through CHORUS_RUN_<OPTION> (e.g. CHORUS_RUN_NPROC_PER_NODE=2),
// and those torchrun has also through torchrun's PET_<OPTION> (PET_NPROC_PER_NODE=2).
// Precedence: command line, then CHORUS_RUN_*, then PET_*, then an exported
// MASTER_ADDR / MASTER_PORT (for --master-addr / --master-port), then the cluster's
// environment (Slurm, Open MPI; see cluster_env.h), then the defaults below.
// --rdzv-endpoint HOST[:PORT] counts as --master-addr / --master-port given at its own
// level (two different values at one level are refused).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "run/cpu_binding.h"
#include "run/environment.h"

namespace chorus::run {

// -h or --help before the program: chorusrun prints usage_text() and exits with code 0.
class HelpRequested : public std::exception {
 public:
  const char* what() const noexcept override { return "help requested"; }
};

// --version before the program: chorusrun prints "chorusrun VERSION" and exits with 0.
class VersionRequested : public std::exception {
 public:
  const char* what() const noexcept override { return "version requested"; }
};

// Which worker streams an output option applies to: torchrun's 0 (none), 1 (stdout),
// 2 (stderr), 3 (both).
enum class Streams : uint8_t { kNone = 0, kStdout = 1, kStderr = 2, kBoth = 3 };

// Whether `set` holds stream 0 (stdout) or 1 (stderr).
inline bool contains(Streams set, int stream) {
  auto bit = stream == 0 ? Streams::kStdout : Streams::kStderr;
  return (static_cast<uint8_t>(set) & static_cast<uint8_t>(bit)) != 0;
}

struct LaunchOptions {
  int nproc_per_node = 1;          // --nproc-per-node N|auto (auto: number of CPUs)
  int nnodes = 1;                  // --nnodes N, or the MAX of MIN:MAX
  int min_nnodes = 1;              // the MIN of --nnodes MIN:MAX; N for --nnodes N
  int node_rank = 0;               // --node-rank
  std::string master_addr = "127.0.0.1";  // --master-addr
  uint16_t master_port = 29500;    // --master-port (0 only with --standalone: picked)
  bool standalone = false;         // --standalone: one node, a free port on 127.0.0.1
  std::string rdzv_backend = "static";  // --rdzv-backend static|c10d (the same here)
  std::string rdzv_endpoint;       // --rdzv-endpoint HOST[:PORT], as given (already
                                   // applied to master_addr / master_port)
  int max_restarts = 0;            // --max-restarts
  // An elastic job (--nnodes MIN:MAX, MIN < MAX; elastic.h): how long node 0 waits for
  // MIN nodes (--rdzv-join-timeout, or --rdzv-conf join_timeout=), and how long after
  // MIN more may come before the first round starts (--rdzv-conf last_call_timeout=).
  std::chrono::milliseconds join_timeout{30000};
  std::chrono::milliseconds last_call{2000};
  // Elastic: how long node 0 waits, when a node joins, for the workers to stop at their
  // next checkpoint (--join-at-checkpoint; 0: they are stopped at once). elastic.h.
  std::chrono::milliseconds join_at_checkpoint{0};
  std::chrono::milliseconds monitor_interval{100};  // --monitor-interval SECONDS (float)
  std::string rdzv_id = "none";    // --rdzv-id: job id, also the job token
  std::string log_dir;             // --log-dir: per-rank log files below it
  Streams tee = Streams::kNone;    // --tee: prefix these console lines with the rank
  Streams redirects = Streams::kNone;  // --redirects: these streams go only to log files
  std::string local_addr;          // --local-addr: address this node listens on
                                   // (workers get CHORUS_IF_IP); empty: chosen by route
  std::chrono::milliseconds grace_period{5000};  // --grace-period SECONDS: SIGTERM..SIGKILL
  CpuBind cpu_bind = CpuBind::kAuto;  // --cpu-bind auto|none|share (cpu_binding.h)
  bool module = false;             // -m, --module: PROGRAM is a Python module
  bool no_python = false;          // --no-python: PROGRAM runs itself, even as *.py
  std::string python;              // --python PATH; empty: see python_interpreter()
  bool use_env = false;            // --use-env (torch.distributed.launch's; the default)
  bool local_rank_arg = false;     // --local-rank-arg: workers also get --local_rank=N
  std::string program;             // PROGRAM (with --module: the module's name)
  std::vector<std::string> program_args;  // ARGS...
  bool elastic() const { return min_nnodes < nnodes; }
  // Things worth telling the user that do not stop the launch ("MASTER_ADDR=... is not
  // used"); chorusrun prints each as a warning.
  std::vector<std::string> warnings;
  // Where each value came from, for messages: "--nnodes", "CHORUS_RUN_NNODES",
  // "SLURM_NNODES", "--standalone", "default". Keyed by member name ("nproc_per_node",
  // "master_port", ...); holds every option member (not program/program_args).
  std::map<std::string, std::string> source;
};

// Parses `args` (argv[1..]); everything from the first argument that is not an option
// (or after "--") is the program and its arguments. Throws UsageError, or
// HelpRequested for -h/--help. `cpus` is what --nproc-per-node auto resolves to.
// Empty CHORUS_RUN_*, PET_* and MASTER_* variables count as unset. With --standalone
// the cluster's environment and an exported MASTER_ADDR are not read (the latter with a
// warning when it names another host); an exported MASTER_PORT still is.
LaunchOptions parse_options(const std::vector<std::string>& args, const Environment& env,
                            int cpus);

// chorusrun --help text.
std::string usage_text();

}  // namespace chorus::run
