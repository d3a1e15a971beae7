// Element-wise reduction kernels, chosen once per operation by dtype and op.
#pragma once

#include <cstddef>
#include <cstdint>

#include "chorus/types.h"

namespace chorus {

// out[i] = a[i] (op) b[i] for i < count. `out` may alias `a` or `b` exactly.
// kAvg reduces as kSum; finish_avg() divides at the end. Integer sums and products
// wrap around (two's complement) instead of being undefined. f16/bf16 compute in
// float32 and round to nearest even once per element.
using ReduceFn = void (*)(void* out, const void* a, const void* b, size_t count);

ReduceFn reduce_function(DataType dtype, ReduceOp op);

// buf[i] /= divisor (integers truncate toward zero). For kAvg.
void finish_avg(void* buf, size_t count, DataType dtype, int divisor);

}  // namespace chorus
