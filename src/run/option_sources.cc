// The sources of option values below the command line, each filling only what the
// ones above it left open (option_table.h): CHORUS_RUN_* and PET_* variables, an exported
// MASTER_ADDR / MASTER_PORT, the cluster's environment (cluster_env.h), the defaults.
#include <optional>
#include <utility>

#include "run/cluster_env.h"
#include "run/option_table.h"

namespace chorus::run {
namespace {

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

}  // namespace

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

// Only when some option it could supply is missing: a cluster variable that chorus
// cannot read must not block a user who gave every value himself. A launch the cluster
// says cannot work (cluster_env.h: ClusterInfo::refusal) is refused when the cluster
// would give this launcher its node count or rank.
std::optional<ClusterInfo> add_cluster(const Environment& env, GivenValues& given) {
  if (!cluster_can_help(given)) return std::nullopt;
  std::optional<ClusterInfo> cluster = detect_cluster(env);
  if (!cluster) return std::nullopt;
  bool places_this_node = given.count("nnodes") == 0 || given.count("node_rank") == 0;
  if (!cluster->refusal.empty() && places_this_node) throw UsageError(cluster->refusal);
  offer(*cluster, "nnodes", as_text(cluster->nnodes), given);
  offer(*cluster, "node_rank", as_text(cluster->node_rank), given);
  offer(*cluster, "master_addr", cluster->master_addr, given);
  offer(*cluster, "master_port", as_text(cluster->master_port), given);
  offer(*cluster, "rdzv_id", cluster->job_id, given);
  return cluster;
}

// What the cluster's values mean once all values are known:
// - under mpirun across hosts, a loopback master address is each host itself, so the
//   launchers would never meet; Open MPI does not say where rank 0 runs, so the user
//   must (docs/launcher.md, "Running under mpirun", says why no other channel is used);
// - Slurm's job id, the job token unless CHORUS_JOB_TOKEN is set, is public (squeue).
void check_cluster(const std::optional<ClusterInfo>& cluster, const Environment& env,
                   const GivenValues& given, LaunchOptions& options) {
  if (!cluster) return;
  const std::string& addr = options.master_addr;
  bool loopback = addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
  if (cluster->scheduler == "mpirun" && cluster->several_hosts && options.nnodes > 1 &&
      loopback) {
    throw UsageError(
        "mpirun started the launchers on more than one host (" + cluster->hosts_evidence +
        "), but the master address is " + reference(given.at("master_addr"), "--master-addr") +
        ", which every host reads as itself: Open MPI does not say where rank 0 runs, so "
        "give node 0's address: --master-addr HOST (or mpirun -x MASTER_ADDR=HOST), HOST "
        "being where mpirun places rank 0 (the first host of --host or --hostfile)");
  }
  auto token = env.find("CHORUS_JOB_TOKEN");
  bool token_set = token != env.end() && !token->second.empty();
  if (options.source.at("rdzv_id") == "SLURM_JOB_ID" && !token_set) {
    options.warnings.push_back(
        "the job token is the Slurm job id " + options.rdzv_id +
        " (SLURM_JOB_ID), which every user of the cluster can read (squeue): export "
        "CHORUS_JOB_TOKEN set to a secret before srun, e.g. "
        "CHORUS_JOB_TOKEN=$(openssl rand -hex 32) in the batch script");
  }
}

void add_defaults(GivenValues& given) {
  for (const OptionSpec& spec : kOptions) {
    given.try_emplace(member_name(spec),
                      Given{std::string(spec.default_value), std::string(kDefault)});
  }
}

}  // namespace chorus::run
