// parse_options: the steps of option_table.h in the order of precedence that options.h
// gives, and usage_text from the option table.
#include "run/options.h"

#include <sstream>

#include "run/option_table.h"

namespace chorus::run {
namespace {

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
  std::optional<ClusterInfo> cluster;
  if (!standalone) cluster = add_cluster(env, given);
  add_defaults(given);
  LaunchOptions options;
  convert_values(given, cpus, options);
  apply_standalone(given, options);
  check_combinations(given, options);
  check_cluster(cluster, env, given, options);
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
         "      (across hosts --master-addr must be given: Open MPI does not say where\n"
         "      rank 0 runs)\n"
         "  Slurm, one chorusrun per node (SLURM_JOB_ID set, and OMPI_COMM_WORLD_SIZE not):\n"
         "      --nnodes SLURM_STEP_NUM_NODES (or SLURM_NNODES, SLURM_JOB_NUM_NODES),\n"
         "      --node-rank SLURM_NODEID, --master-addr the first host of\n"
         "      SLURM_STEP_NODELIST (or SLURM_JOB_NODELIST, SLURM_NODELIST; when its name does\n"
         "      not resolve: Slurm's NodeAddr for it, else SLURM_LAUNCH_NODE_IPADDR),\n"
         "      --master-port 29500 + SLURM_JOB_ID mod 1000, --rdzv-id SLURM_JOB_ID (public:\n"
         "      set CHORUS_JOB_TOKEN to a secret); several tasks on a node are refused\n";
  return out.str();
}

}  // namespace chorus::run
