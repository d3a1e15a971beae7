// chorus-bench's command line: what to measure and, with --np, how to start the ranks.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "chorus/chorus.h"
#include "run/cpu_binding.h"

namespace chorus::bench {

struct CollectiveInfo {
  Collective collective;  // "sendrecv" is kSend: rank pairs exchange with send and recv
  bool reduces;  // takes a ReduceOp
  bool blocked;  // a row's count is split into one block per rank
  bool in_place;  // has an in-place form (communicator.h, "In place")
};

// The collectives of --op, by name.
extern const std::map<std::string, CollectiveInfo> kCollectives;

// Which layouts --mode measures: send and receive in separate buffers, in one buffer
// (the "In place" layouts of communicator.h), or both side by side (nccl-tests' rows).
enum class Mode : uint8_t { kOut, kIn, kBoth };

struct Options {
  uint64_t min_bytes = 8;
  uint64_t max_bytes = uint64_t{256} << 20;
  uint64_t step_factor = 2;
  std::string collective = "allreduce";
  ReduceOp op = ReduceOp::kSum;
  DataType dtype = DataType::kFloat32;
  int iters = 20;
  int warmup = 5;
  bool check = true;
  Mode mode = Mode::kBoth;
  bool shared_buffers = false;  // --buffers shared: chorus::allocate_shared
  std::optional<Algorithm> algorithm;  // unset: CHORUS_ALGO or auto
  int np = 0;                          // 0: ranks come from the environment
  int nodes = 0;                       // --np ranks as this many simulated nodes; 0: none
  int timeout_s = 900;                 // deadline of the whole --np run
  run::CpuBind cpu_bind = run::CpuBind::kAuto;  // of --np ranks
  bool json = false;
};

// Parses the command line. --help and --version print and exit 0; a bad command line
// prints why and exits 2.
Options parse_options(int argc, char** argv);

}  // namespace chorus::bench
