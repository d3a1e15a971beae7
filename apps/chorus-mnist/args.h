// chorus-mnist's command line (Args, parse) and its checks against what a run meets:
// the world size (batch_divides) and a checkpoint's saved training state (mismatch).
// A check that fails says why: batch_divides on stderr, mismatch in the text it
// returns. checkpoint_path names the checkpoint that --checkpoint-dir holds.
#pragma once

#include <cstdint>
#include <string>

#include "chorus/torch/checkpoint.h"

namespace chorus::mnist {

struct Args {
  std::string model = "mlp";
  std::string dataset = "fashion";
  std::string data_dir;
  int64_t epochs = 5;
  int64_t batch_size = 512;  // global: split across ranks, as in seed 000
  double lr = 1e-3;
  double momentum = 0;
  uint64_t seed = 0;
  int64_t log_interval = 100;
  int64_t workers = 1;
  std::string checkpoint_dir;
  int64_t checkpoint_interval = 100;
  bool resume = false;
  std::string device = "cpu";
  int64_t max_steps = 0;  // 0: no limit (benchmarks and tests stop early with it)
  int64_t warmup_steps = 0;  // steps left out of samples_per_second (benchmarks)
  int threads = 0;        // 0: OMP_NUM_THREADS, else 1
  std::string metrics;    // rank 0 writes JSON lines here
  std::string sample_log;  // every rank appends the indices of each step here
  std::string malloc_thresholds;  // what keep_freed_memory() did (not an option)
};

// The command line into `a`, --data-dir's default filled in. 0; -1 where it printed
// what was asked (--help, --version), after which the program exits 0; 2 where it
// refuses the command line (said on stderr), the program's exit status.
int parse(int argc, char** argv, Args& a);

// Why `state` (a checkpoint) cannot be continued with these arguments, or "". Its
// sampler must shuffle with the same seed, and its steps must have the same global
// batch, else the rest of the epoch would not be the rest of the same permutation.
// Checkpoints from before these were recorded (world_size 0) are not checked.
std::string mismatch(const Args& a, const chorus::torch_ext::TrainingState& state);

// Whether the global batch splits evenly across the ranks; says why not.
bool batch_divides(const Args& a, int world);

// <checkpoint-dir>/checkpoint.pt, or "" without --checkpoint-dir.
std::string checkpoint_path(const Args& a);

}  // namespace chorus::mnist
