// One rank's measurement: the chosen collective at one size, timed and then checked
// against closed-form patterns (chorus_patterns, the tests' util/expected.h), out of
// place, in place, or both (--mode).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "chorus/chorus.h"
#include "options.h"

namespace chorus::bench {

inline constexpr int kRoot = 0;

// The benchmark's bytes, from the heap or, with --buffers shared, node-shared memory
// (chorus::allocate_shared). Null until allocate().
class Buffer {
 public:
  void allocate(size_t bytes, bool shared);
  std::byte* data() const { return data_; }

 private:
  std::vector<std::byte> heap_;
  std::shared_ptr<SharedBuffer> shared_;
  std::byte* data_ = nullptr;
};

struct Bench {
  Communicator& comm;
  const Options& options;
  const CollectiveInfo& info;
  // Out of place: send -> recv. In place: recv alone holds input and result; without
  // out-of-place runs (--mode in) send is never allocated.
  Buffer send, recv;
};

// One layout's figures.
struct Result {
  double time_us, algbw, busbw;
  std::optional<int64_t> wrong;  // unset without --check
};

// One row of the report. `count` is as nccl-tests prints it: the whole buffer of the
// blocked collectives. `out` and `in` are set for the layouts --mode measures.
struct Row {
  size_t bytes, count;
  const char* algo;
  std::optional<Result> out, in;
};

// Allocates the buffers for options.max_bytes and fills the send buffer (the in-place
// one with --mode in) with this rank's input: reduce_input() for the reducing
// collectives, move_value() for the others.
void prepare_buffers(Bench& b);

// Times `bytes` worth of the collective (the maximum over ranks of the average op) and,
// with --check, counts the wrong elements of one more op, summed over ranks: out of
// place, then in place, as --mode asks. Every rank must call it with the same `bytes`.
Row measure_size(Bench& b, uint64_t bytes);

}  // namespace chorus::bench
