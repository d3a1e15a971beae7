// The portable reduction kernels: the scalar loop of the reference, with f16 and bf16
// converted by the branch-free functions of kernels.h instead, so that the
// compiler vectorizes every loop for the baseline target (SSE2 on x86-64, NEON on
// AArch64). The native types' loops are the reference's own.
#include "comm/reduce/kernels.h"

namespace chorus::reduce {
namespace {

struct PortableHalf {
  using Elem = uint16_t;
  static constexpr NanFrom kNanFrom = nan_from(DataType::kFloat16);
  static float load(uint16_t h) { return portable_half_to_float(h); }
  static uint16_t store(float f) { return portable_float_to_half(f); }
};

struct PortableBFloat {
  using Elem = uint16_t;
  static constexpr NanFrom kNanFrom = nan_from(DataType::kBFloat16);
  static float load(uint16_t b) { return portable_bfloat16_to_float(b); }
  static uint16_t store(float f) { return portable_float_to_bfloat16(f); }
};

struct Portable {
  using F32 = Native<float>;
  using F64 = Native<double>;
  using F16 = PortableHalf;
  using BF16 = PortableBFloat;
  using I8 = Native<int8_t>;
  using U8 = Native<uint8_t>;
  using I32 = Native<int32_t>;
  using I64 = Native<int64_t>;
  using Sum = ScalarSum;
  using Prod = ScalarProd;
  using Min = ScalarMin;
  using Max = ScalarMax;
  template <class Type, class Op> static ReduceFn kernel() { return scalar_reduce<Type, Op>; }
  template <class Type, class Op> static ReduceManyFn many() {
    return scalar_reduce_many<Type, Op>;
  }
  template <class Type> static DivideFn divide() { return scalar_divide<Type, true>; }
};

}  // namespace

ReduceFn portable_kernel(DataType dtype, ReduceOp op) { return select_kernel<Portable>(dtype, op); }
ReduceManyFn portable_many_kernel(DataType dtype, ReduceOp op) {
  return select_kernel<Portable, Many>(dtype, op);
}
DivideFn portable_divide(DataType dtype) { return select_divide<Portable>(dtype); }

}  // namespace chorus::reduce
