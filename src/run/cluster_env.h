// What a cluster scheduler tells a launcher through the environment, so that chorusrun
// started by the scheduler's own tools (srun, mpirun) needs no node options.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "run/environment.h"

namespace chorus::run {

struct ClusterInfo {
  std::string scheduler;  // "slurm" or "mpirun"
  std::optional<int> nnodes;
  std::optional<int> node_rank;
  std::optional<std::string> master_addr;  // Slurm: first host of SLURM_JOB_NODELIST
  std::optional<std::string> job_id;       // Slurm: SLURM_JOB_ID (used as rdzv id)
  // The variable each value came from, keyed like LaunchOptions::source ("nnodes",
  // "node_rank", "master_addr", "rdzv_id" for job_id): e.g. "SLURM_JOB_NUM_NODES".
  std::map<std::string, std::string> source;
};

// Slurm when SLURM_JOB_ID is set (SLURM_NNODES or SLURM_JOB_NUM_NODES, SLURM_NODEID,
// SLURM_JOB_NODELIST or SLURM_NODELIST); Open MPI with one launcher per node when
// OMPI_COMM_WORLD_SIZE is set (OMPI_COMM_WORLD_SIZE nodes, OMPI_COMM_WORLD_RANK). When
// both are set (mpirun inside a Slurm allocation) Open MPI wins: its rank is the one of
// this very process. Empty variables count as unset. Empty result when neither. Throws
// UsageError naming the variable for malformed values.
std::optional<ClusterInfo> detect_cluster(const Environment& env);

// Expands a Slurm host list: "node[01-03,07],gpu5,a[1-2]b" ->
// node01 node02 node03 node07 gpu5 a1b a2b (zero padding kept). Throws UsageError on
// malformed input (unbalanced brackets, reversed ranges, more than 100000 hosts).
std::vector<std::string> expand_nodelist(const std::string& list);

}  // namespace chorus::run
