// Element-wise reduction kernels, chosen once per operation by dtype and op.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <optional>
#include <string>

#include "chorus/types.h"

namespace chorus {

// out[i] = a[i] (op) b[i] for i < count. `out` may alias `a` or `b` exactly.
// kAvg reduces as kSum; finish_avg() divides at the end. Integer sums and products
// wrap around (two's complement) instead of being undefined. f16/bf16 compute in
// float32 and round to nearest even once per element. min and max keep `a` when the
// comparison is false (a NaN on either side, +0 against -0). A sum or product of two
// NaNs is one of them, quieted: b's for f32, f64 and bf16, a's for f16 (see nan_from()
// in kernels.h for why).
using ReduceFn = void (*)(void* out, const void* a, const void* b, size_t count);

// out = (...((src[0] (op) src[1]) (op) src[2]) ...) (op) src[k - 1], element-wise, for
// k >= 2 sources: bit for bit what k - 1 calls of the ReduceFn of the same dtype and op
// give (out = src[0] op src[1], then out = out op src[j]), in one pass that reads the
// sources side by side instead of one after another (4 f32 sources, two of them just
// written by another core, best of 5: 16 KiB 1.7 -> 1.5 us, 64 KiB 6.8 -> 5.3 us; but
// 256 KiB 22.6 -> 24.4 us). `out` may alias src[0] or src[1] exactly, and no other
// source.
using ReduceManyFn = void (*)(void* out, const void* const* src, int k, size_t count);

// The kernel of the instruction set reduce_isa() chose.
ReduceFn reduce_function(DataType dtype, ReduceOp op);
ReduceManyFn reduce_many_function(DataType dtype, ReduceOp op);

// buf[i] /= divisor (divisor >= 1; integers truncate toward zero). For kAvg.
void finish_avg(void* buf, size_t count, DataType dtype, int divisor);

// The kernel behind finish_avg: buf[i] = buf[i] / divisor for i < count, f16 and bf16
// computing in float32 and rounding once. Every instruction set gives the quotient's
// bits; a power-of-two divisor is a multiply by its reciprocal, which gives the same
// bits for every input (kernels.h, scalar_divide). The vector ones are what make it
// cheap: the portable loop over an allreduce's output (f32, 2 ranks, node-shared, 1 MiB)
// doubled an average's time against the sum's, 57 against 27 us.
using DivideFn = void (*)(void* buf, size_t count, int divisor);

// ----- instruction sets -----
//
// Every instruction set gives results bitwise equal to the scalar reference kernels
// below, for every input (NaN payloads, signed zeros, infinities, subnormals, integer
// wrap-around included), in the default floating-point environment (round to nearest,
// no flush-to-zero), which chorus never changes.

// The kernel families, in order of preference.
enum class ReduceIsa : uint8_t {
  kPortable,  // plain loops the compiler vectorizes for the baseline target
  kAvx2,      // x86-64 AVX2 with F16C
  kAvx512,    // x86-64 AVX-512 F and BW
};

inline constexpr ReduceIsa kAllReduceIsas[] = {ReduceIsa::kPortable, ReduceIsa::kAvx2,
                                               ReduceIsa::kAvx512};

// "portable", "avx2", "avx512".
const char* reduce_isa_name(ReduceIsa isa);

// Whether this CPU (and its operating system) can run the kernels of `isa`.
bool reduce_isa_supported(ReduceIsa isa);

// The instruction set a CHORUS_REDUCE_ISA value names: "portable", "avx2", "avx512", or
// nullopt for "auto". Any other value throws ConfigError naming the variable and the
// choices. The one list of the names (settings::reduce_isa() only reads the variable).
std::optional<ReduceIsa> parse_reduce_isa(const std::string& name);

// The instruction set that `requested` (a value parse_reduce_isa accepts) names on this
// CPU: "auto" is the best supported one; an unsupported one falls back to the best
// supported one and logs a warning. Exposed for tests; reduce_isa() applies it to
// CHORUS_REDUCE_ISA.
ReduceIsa resolve_reduce_isa(const std::string& requested);

// The instruction set of reduce_function(dtype, op): CHORUS_REDUCE_ISA resolved as
// above, decided once per process (the first call reads the variable and logs).
ReduceIsa reduce_isa();

// The kernel of `isa`, for tests and benchmarks that compare instruction sets. Throws
// InvalidArgumentError when reduce_isa_supported(isa) is false.
ReduceFn reduce_function(DataType dtype, ReduceOp op, ReduceIsa isa);
ReduceManyFn reduce_many_function(DataType dtype, ReduceOp op, ReduceIsa isa);
DivideFn divide_function(DataType dtype, ReduceIsa isa);

// The scalar kernels, written one element at a time with chorus's conversions: the
// definition every instruction set must match bit for bit. (The compiler may still
// vectorize their loops; that changes no result.)
ReduceFn reference_reduce_function(DataType dtype, ReduceOp op);
// The same for finish_avg: a division per element.
DivideFn reference_divide_function(DataType dtype);

}  // namespace chorus
