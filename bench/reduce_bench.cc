// reduce-bench: throughput of the reduction kernels of every instruction set this CPU
// has, for f32, bf16 and f16 sums on buffers of 64 KiB, 1 MiB and 16 MiB, side by side
// with the ratio to the portable kernels.
//
// GB/s counts the bytes a kernel moves: two inputs read and one output written, so 3 x
// the buffer size per call (out-of-place; 1e9 bytes per GB). Each figure is the best of
// several rounds of at least kRoundSeconds, after one warm-up call. It prints and never
// judges: the numbers depend on the machine and on what else runs on it.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "chorus/types.h"
#include "comm/reduce/reduce.h"

namespace {

using chorus::DataType;
using chorus::ReduceIsa;

constexpr double kRoundSeconds = 0.02;
constexpr int kRounds = 5;
constexpr size_t kSizes[] = {size_t{64} << 10, size_t{1} << 20, size_t{16} << 20};
constexpr DataType kDtypes[] = {DataType::kFloat32, DataType::kBFloat16, DataType::kFloat16};

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Bytes = std::unique_ptr<uint8_t, FreeDeleter>;

// `bytes` of 64-byte aligned memory holding ordinary finite values of `dtype`, so that
// the timing is that of the common case.
Bytes make_buffer(DataType dtype, size_t bytes, float seed) {
  Bytes buf(static_cast<uint8_t*>(std::aligned_alloc(64, bytes)));
  size_t count = bytes / chorus::dtype_size(dtype);
  for (size_t i = 0; i < count; ++i) {
    float v = seed + static_cast<float>(i % 1000) * 0.01f;
    auto* halves = reinterpret_cast<uint16_t*>(buf.get());
    if (dtype == DataType::kFloat32) reinterpret_cast<float*>(buf.get())[i] = v;
    if (dtype == DataType::kFloat16) halves[i] = chorus::float_to_half(v);
    if (dtype == DataType::kBFloat16) halves[i] = chorus::float_to_bfloat16(v);
  }
  return buf;
}

// Best GB/s of `fn` over kRounds rounds.
double measure(chorus::ReduceFn fn, DataType dtype, size_t bytes) {
  Bytes a = make_buffer(dtype, bytes, 1.0f), b = make_buffer(dtype, bytes, 2.0f);
  Bytes out = make_buffer(dtype, bytes, 0.0f);
  size_t count = bytes / chorus::dtype_size(dtype);
  fn(out.get(), a.get(), b.get(), count);
  double best = 0;
  for (int round = 0; round < kRounds; ++round) {
    auto start = std::chrono::steady_clock::now();
    double seconds = 0;
    size_t calls = 0;
    while (seconds < kRoundSeconds) {
      fn(out.get(), a.get(), b.get(), count);
      ++calls;
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    double moved = 3.0 * static_cast<double>(bytes) * static_cast<double>(calls);
    best = std::max(best, moved / seconds / 1e9);
  }
  return best;
}

std::string size_name(size_t bytes) {
  return bytes >= (size_t{1} << 20) ? std::to_string(bytes >> 20) + " MiB"
                                    : std::to_string(bytes >> 10) + " KiB";
}

void print_row(DataType dtype, size_t bytes) {
  std::printf("%-5s %-7s", chorus::dtype_name(dtype), size_name(bytes).c_str());
  double portable = 0;
  for (ReduceIsa isa : chorus::kAllReduceIsas) {
    if (!chorus::reduce_isa_supported(isa)) {
      std::printf("  %18s", "-");
      continue;
    }
    auto fn = chorus::reduce_function(dtype, chorus::ReduceOp::kSum, isa);
    double gbps = measure(fn, dtype, bytes);
    if (isa == ReduceIsa::kPortable) {
      portable = gbps;
      std::printf("  %18.1f", gbps);
    } else {
      std::printf("  %9.1f (%5.2fx)", gbps, gbps / portable);
    }
  }
  std::printf("\n");
}

}  // namespace

int main() {
  std::printf("reduction kernels, sum, GB/s (3 x buffer bytes per call; ratio to portable)\n");
  std::printf("instruction set chosen on this CPU: %s\n\n",
              chorus::reduce_isa_name(chorus::reduce_isa()));
  std::printf("%-5s %-7s", "dtype", "buffer");
  for (ReduceIsa isa : chorus::kAllReduceIsas) std::printf("  %18s", chorus::reduce_isa_name(isa));
  std::printf("\n");
  for (DataType dtype : kDtypes) {
    for (size_t bytes : kSizes) print_row(dtype, bytes);
  }
  return 0;
}
