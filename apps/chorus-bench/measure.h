// One rank's measurement: the chosen collective at one size, timed and then checked
// against closed-form patterns (chorus_patterns, the tests' util/expected.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "chorus/chorus.h"
#include "options.h"

namespace chorus::bench {

inline constexpr int kRoot = 0;

struct Bench {
  Communicator& comm;
  const Options& options;
  const CollectiveInfo& info;
  std::vector<std::byte> send, recv;
};

// One row of the report. `count` is as nccl-tests prints it: the whole buffer of the
// blocked collectives.
struct Row {
  size_t bytes, count;
  const char* algo;
  double time_us, algbw, busbw;
  std::optional<int64_t> wrong;  // unset without --check
};

// Sizes both buffers for options.max_bytes and fills the send buffer with this rank's
// input: reduce_input() for the reducing collectives, move_value() for the others.
void prepare_buffers(Bench& b);

// Times `bytes` worth of the collective (the maximum over ranks of the average op) and,
// with --check, counts the wrong elements of one more op, summed over ranks. Every
// rank must call it with the same `bytes`.
Row measure_size(Bench& b, uint64_t bytes);

}  // namespace chorus::bench
