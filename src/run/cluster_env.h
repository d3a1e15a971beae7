// What a cluster scheduler tells a launcher through the environment, so that chorusrun
// started by the scheduler's own tools (srun, mpirun) needs no node options.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "run/environment.h"
#include "run/options.h"

namespace chorus::run {

struct ClusterInfo {
  std::string scheduler;  // "slurm" or "mpirun"
  std::optional<int> nnodes;
  std::optional<int> node_rank;
  std::optional<std::string> master_addr;  // Slurm: first host of the step's node list
  std::optional<int> master_port;          // Slurm: slurm_port(SLURM_JOB_ID)
  std::optional<std::string> job_id;       // Slurm: SLURM_JOB_ID (used as rdzv id)
  // Non-empty when this launch cannot work whatever the values (Slurm: several tasks
  // on one node, or the batch script of a job of several nodes): the message, saying
  // what to do instead. add_cluster throws it when the cluster supplies the node count
  // or rank.
  std::string refusal;
  // mpirun: the launchers run on more than one host (OMPI_COMM_WORLD_LOCAL_SIZE below
  // OMPI_COMM_WORLD_SIZE, or not set), so 127.0.0.1 cannot be the master address. With
  // the variables that told, for messages.
  bool several_hosts = false;
  std::string hosts_evidence;
  // The variable each value came from, keyed like LaunchOptions::source ("nnodes",
  // "node_rank", "master_addr", "master_port", "rdzv_id" for job_id): e.g.
  // "SLURM_JOB_NUM_NODES".
  std::map<std::string, std::string> source;
};

// Slurm when SLURM_JOB_ID is set: the step's values first where srun sets them
// (SLURM_STEP_NUM_NODES, SLURM_NNODES, SLURM_JOB_NUM_NODES; SLURM_NODEID;
// SLURM_STEP_NODELIST, SLURM_JOB_NODELIST, SLURM_NODELIST), since `srun -N1` inside a
// job of two nodes is a step of one node whose node 0 need not be the job's first host.
// Open MPI with one launcher per node when OMPI_COMM_WORLD_SIZE is set
// (OMPI_COMM_WORLD_SIZE nodes, OMPI_COMM_WORLD_RANK). When both are set (mpirun inside a
// Slurm allocation) Open MPI wins: its rank is the one of this very process. Empty
// variables count as unset. Empty result when neither. Throws UsageError naming the
// variable for malformed values.
std::optional<ClusterInfo> detect_cluster(const Environment& env);

// Expands a Slurm host list: "node[01-03,07],gpu5,a[1-2]b" ->
// node01 node02 node03 node07 gpu5 a1b a2b (zero padding kept). Throws UsageError on
// malformed input (unbalanced brackets, reversed ranges, more than 100000 hosts).
std::vector<std::string> expand_nodelist(const std::string& list);

// The store's port of a Slurm job that names none: kSlurmPortBase + the job id modulo
// kSlurmPorts (a job id that is not a number: its FNV-1a hash), so that jobs sharing a
// node do not all want 29500. The range ends below Linux's ephemeral ports (32768 and
// up), where the workers' ports and outgoing connections are picked.
constexpr int kSlurmPortBase = 29500;
constexpr int kSlurmPorts = 1000;
uint16_t slurm_port(const std::string& job_id);

// How this node finds hosts; tests pass their own.
struct HostLookup {
  // Whether getaddrinfo finds `host` here.
  std::function<bool(const std::string& host)> resolves;
  // The address Slurm reaches node `name` by (its NodeAddr, from `scontrol show node`),
  // if Slurm answers within a few seconds.
  std::function<std::optional<std::string>(const std::string& name)> slurm_node_addr;
};
HostLookup system_host_lookup();

// Makes sure every node can resolve the master address before any of them waits on it:
// a name that does not resolve here is an error at once (every node checks the same
// name, so every node fails, naming it, instead of node 0 failing while the others wait
// for the connect timeout). A name from the Slurm node list that does not resolve is
// replaced, in this order, by Slurm's NodeAddr for it, or by SLURM_LAUNCH_NODE_IPADDR
// (with a warning: that is node 0 only when srun runs on the job's first node, as in a
// batch script). Throws UsageError naming the name and where it came from.
void settle_master_addr(LaunchOptions& options, const Environment& env, const HostLookup& hosts);

}  // namespace chorus::run
