// Internals of the reduction kernels behind reduce.h: the scalar operators and loop
// shared by the reference and the portable kernels, the portable conversions, and the
// kernel table of each instruction set (portable.cc, avx2.cc,
// avx512.cc). Only those files, reduce.cc and tests include this header.
#pragma once

#include <bit>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "comm/reduce/reduce.h"

namespace chorus::reduce {

// ----- kernel tables -----

// Each returns the kernel of (dtype, op) built for its instruction set; kAvg is kSum.
// The x86 ones return nullptr where the library was not built for x86-64; none checks
// that the CPU can run what it returns (reduce.cc does).
ReduceFn portable_kernel(DataType dtype, ReduceOp op);
ReduceFn avx2_kernel(DataType dtype, ReduceOp op);
ReduceFn avx512_kernel(DataType dtype, ReduceOp op);
ReduceManyFn portable_many_kernel(DataType dtype, ReduceOp op);
ReduceManyFn avx2_many_kernel(DataType dtype, ReduceOp op);
ReduceManyFn avx512_many_kernel(DataType dtype, ReduceOp op);
// finish_avg's kernels (reduce.h). The x86 ones return nullptr for the integer types,
// which the portable kernels serve.
DivideFn portable_divide(DataType dtype);
DivideFn avx2_divide(DataType dtype);
DivideFn avx512_divide(DataType dtype);

// Which of an instruction set's kernels select_kernel() picks: the two-source ones
// (Isa::kernel<Type, Op>()) or the many-source ones (Isa::many<Type, Op>()).
struct Pairwise {
  using Fn = ReduceFn;
  template <class Isa, class Type, class Op> static Fn of() { return Isa::template kernel<Type, Op>(); }
};
struct Many {
  using Fn = ReduceManyFn;
  template <class Isa, class Type, class Op> static Fn of() { return Isa::template many<Type, Op>(); }
};

// The table of one instruction set, written once for all of them. `Isa` names its
// element adapters (F32 ... I64) and operators (Sum ... Max), and makes the kernels of
// an adapter and an operator with Isa::kernel<Type, Op>() and Isa::many<Type, Op>().
template <class Isa, class Op, class Kind>
typename Kind::Fn select_for_dtype(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32: return Kind::template of<Isa, typename Isa::F32, Op>();
    case DataType::kFloat64: return Kind::template of<Isa, typename Isa::F64, Op>();
    case DataType::kFloat16: return Kind::template of<Isa, typename Isa::F16, Op>();
    case DataType::kBFloat16: return Kind::template of<Isa, typename Isa::BF16, Op>();
    case DataType::kInt8: return Kind::template of<Isa, typename Isa::I8, Op>();
    case DataType::kUInt8: return Kind::template of<Isa, typename Isa::U8, Op>();
    case DataType::kInt32: return Kind::template of<Isa, typename Isa::I32, Op>();
    case DataType::kInt64: return Kind::template of<Isa, typename Isa::I64, Op>();
  }
  return nullptr;
}

template <class Isa, class Kind = Pairwise>
typename Kind::Fn select_kernel(DataType dtype, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return select_for_dtype<Isa, typename Isa::Sum, Kind>(dtype);
    case ReduceOp::kProd: return select_for_dtype<Isa, typename Isa::Prod, Kind>(dtype);
    case ReduceOp::kMin: return select_for_dtype<Isa, typename Isa::Min, Kind>(dtype);
    case ReduceOp::kMax: return select_for_dtype<Isa, typename Isa::Max, Kind>(dtype);
  }
  return nullptr;
}

// The divide kernel of each dtype in an instruction set's table: Isa::divide<Type>().
template <class Isa>
DivideFn select_divide(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32: return Isa::template divide<typename Isa::F32>();
    case DataType::kFloat64: return Isa::template divide<typename Isa::F64>();
    case DataType::kFloat16: return Isa::template divide<typename Isa::F16>();
    case DataType::kBFloat16: return Isa::template divide<typename Isa::BF16>();
    case DataType::kInt8: return Isa::template divide<typename Isa::I8>();
    case DataType::kUInt8: return Isa::template divide<typename Isa::U8>();
    case DataType::kInt32: return Isa::template divide<typename Isa::I32>();
    case DataType::kInt64: return Isa::template divide<typename Isa::I64>();
  }
  return nullptr;
}

// Whether x / d may be computed as x * (1 / d): d a power of two, whose reciprocal is
// exact. x / 2^k and x * 2^-k are then the same real number, which both operations
// round once, the same way, so the bits agree for every x (NaN payloads, signed zeros,
// infinities and subnormal results included), and a multiply costs a fraction of a
// divide.
constexpr bool divide_by_reciprocal(int d) { return d > 0 && (d & (d - 1)) == 0; }

// The sources of a many-source kernel after the first `done` elements, as `Elem`s.
template <class Elem>
const Elem* source_at(const void* const* src, int j, size_t done) {
  return static_cast<const Elem*>(src[j]) + done;
}

// ----- NaN payloads -----

// Which NaN a sum or product of two NaNs returns (quieted). The hardware returns one of
// the two, but which one follows the operand order the compiler happens to pick, so
// the scalar code before the vector kernels left it to the compiler: the release build
// (GCC 12, -O3) gave b's for f32 and f64, a's for f16, and for bf16 b's in its
// auto-vectorized loop body but a's in the scalar remainder of the same loop; -O0,
// sanitizers or -march=native chose differently again. Every kernel, the reference
// included, now pins the release build's choice per dtype (b's for bf16, as for most of
// its elements), so that all instruction sets agree bit for bit. A NaN made from
// numbers (inf - inf) is the hardware's default NaN in every kernel.
enum class NanFrom { kA, kB };

constexpr NanFrom nan_from(DataType dtype) {
  return dtype == DataType::kFloat16 ? NanFrom::kA : NanFrom::kB;
}

// c ? a : b through a mask. A conditional expression lets GCC sink the float arithmetic
// of the unselected case into a branch, which it then may not vectorize (the
// arithmetic could trap under -ftrapping-math).
template <class U>
U select_bits(bool c, U a, U b) {
  U mask = U{0} - static_cast<U>(c);
  return (a & mask) | (b & ~mask);
}

// `chosen` quieted (the top mantissa bit set, as the hardware quiets) when it is a NaN,
// else `result`.
template <class T>
T keep_nan(T chosen, T result) {
  using U = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  constexpr U kQuiet = U{1} << (std::numeric_limits<T>::digits - 2);
  U quiet = std::bit_cast<U>(chosen) | kQuiet;
  return std::bit_cast<T>(select_bits(chosen != chosen, quiet, std::bit_cast<U>(result)));
}

// ----- scalar operators and loop (reference and portable kernels) -----

// Integers compute in unsigned types so that overflow wraps instead of being undefined.
struct ScalarSum {
  static constexpr bool kArithmetic = true;  // NaN payloads need pinning
  template <class T> static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    } else {
      return a + b;
    }
  }
};
// Narrow types multiply as unsigned int: uint8_t or uint16_t would promote to (signed)
// int, whose overflow is undefined.
struct ScalarProd {
  static constexpr bool kArithmetic = true;
  template <class T> static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      using U = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned,
                                   std::make_unsigned_t<T>>;
      return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
    } else {
      return a * b;
    }
  }
};
// Min and Max keep `a` unless `b` compares strictly smaller (larger): a NaN on either
// side and equal values (+0 against -0) give `a`. This asymmetry is part of the
// contract; every instruction set reproduces it. They only select, so NaN payloads
// need no pinning.
struct ScalarMin {
  static constexpr bool kArithmetic = false;
  template <class T> static T apply(T a, T b) { return b < a ? b : a; }
};
struct ScalarMax {
  static constexpr bool kArithmetic = false;
  template <class T> static T apply(T a, T b) { return a < b ? b : a; }
};

// An element type that computes as itself.
template <class T>
struct Native {
  using Elem = T;
  // f32 or f64 (unused for integers).
  static constexpr NanFrom kNanFrom =
      nan_from(sizeof(T) == 8 ? DataType::kFloat64 : DataType::kFloat32);
  static T load(T v) { return v; }
  static T store(T v) { return v; }
};

// store(op(load(x), load(y))), NaN payloads pinned.
template <class Type, class Op>
typename Type::Elem scalar_step(typename Type::Elem x, typename Type::Elem y) {
  auto u = Type::load(x), v = Type::load(y);
  auto r = Op::apply(u, v);
  if constexpr (Op::kArithmetic && std::is_floating_point_v<decltype(r)>) {
    r = keep_nan(Type::kNanFrom == NanFrom::kA ? u : v, r);
  }
  return Type::store(r);
}

// out[i] = store(op(load(a[i]), load(b[i]))). Each element is read before its result
// is written, so `out` may alias `a` or `b` exactly.
template <class Type, class Op>
void scalar_reduce(void* out, const void* a, const void* b, size_t n) {
  using Elem = typename Type::Elem;
  Elem* o = static_cast<Elem*>(out);
  const Elem* x = static_cast<const Elem*>(a);
  const Elem* y = static_cast<const Elem*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = scalar_step<Type, Op>(x[i], y[i]);
}

// The many-source kernel of the scalar loop: each element through scalar_step() from
// the first source to the last, rounded to Elem after each, as the pairwise calls are.
template <class Type, class Op>
void scalar_reduce_many(void* out, const void* const* src, int k, size_t n) {
  using Elem = typename Type::Elem;
  Elem* o = static_cast<Elem*>(out);
  const Elem* x = static_cast<const Elem*>(src[0]);
  const Elem* y = static_cast<const Elem*>(src[1]);
  for (size_t i = 0; i < n; ++i) {
    Elem r = scalar_step<Type, Op>(x[i], y[i]);
    for (int j = 2; j < k; ++j) r = scalar_step<Type, Op>(r, static_cast<const Elem*>(src[j])[i]);
    o[i] = r;
  }
}

// buf[i] = store(load(buf[i]) / d): floating types in their arithmetic type (float for
// f16 and bf16), by the reciprocal where divide_by_reciprocal(d) allows and
// `kReciprocal` asks; integers truncate toward zero, divided as int64 so that no
// divisor wraps in a narrow type.
template <class Type, bool kReciprocal>
void scalar_divide(void* buf, size_t n, int d) {
  using Elem = typename Type::Elem;
  using F = decltype(Type::load(Elem{}));
  Elem* p = static_cast<Elem*>(buf);
  if constexpr (std::is_floating_point_v<F>) {
    if (kReciprocal && divide_by_reciprocal(d)) {
      const F reciprocal = F(1) / static_cast<F>(d);
      for (size_t i = 0; i < n; ++i) p[i] = Type::store(Type::load(p[i]) * reciprocal);
      return;
    }
    const F divisor = static_cast<F>(d);
    for (size_t i = 0; i < n; ++i) p[i] = Type::store(Type::load(p[i]) / divisor);
  } else {
    for (size_t i = 0; i < n; ++i) p[i] = static_cast<Elem>(static_cast<int64_t>(p[i]) / d);
  }
}

// ----- portable conversions -----
//
// Branch-free forms of half_to_float, float_to_half and float_to_bfloat16 (every case
// computed, one selected), which the compiler can vectorize. Bitwise equal to those for
// every input; reduce_test checks it over all halves and a sweep of floats.

inline float portable_half_to_float(uint16_t h) {
  uint32_t exp = h & 0x7c00u;
  uint32_t shifted = static_cast<uint32_t>(h & 0x7fff) << 13;
  uint32_t normal = shifted + (112u << 23);  // exponent bias 15 -> 127
  uint32_t special = shifted | 0x7f800000u;  // inf and NaN, payload kept as it is
  // A subnormal half is mantissa * 2^-24: exact in float, and a normal float.
  float mantissa = static_cast<float>(static_cast<int32_t>(h & 0x3ff));
  uint32_t subnormal = std::bit_cast<uint32_t>(mantissa * 0x1p-24f);
  uint32_t bits = select_bits<uint32_t>(exp == 0x7c00u, special,
                                       select_bits<uint32_t>(exp == 0, subnormal, normal));
  return std::bit_cast<float>(bits | (static_cast<uint32_t>(h & 0x8000) << 16));
}

inline uint16_t portable_float_to_half(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  // Signed compares: abs fits, and they are the ones SSE2 has.
  int32_t abs = static_cast<int32_t>(x & 0x7fffffffu);
  uint32_t a = static_cast<uint32_t>(abs);
  uint32_t normal = (a + 0xfffu + ((a >> 13) & 1) - 0x38000000u) >> 13;  // nearest even
  // Below 2^-14 the result is a multiple of 2^-24: adding 0.5f (whose unit in the last
  // place is 2^-24) rounds to it to nearest even, as the integer rounding of
  // float_to_half does, in the default rounding mode.
  uint32_t subnormal = std::bit_cast<uint32_t>(std::bit_cast<float>(a) + 0.5f) - 0x3f000000u;
  uint32_t nan = 0x7e00u | ((a >> 13) & 0x3ffu);  // quiet, upper payload kept
  uint32_t r = select_bits<uint32_t>(abs < 0x38800000, subnormal, normal);
  r = select_bits<uint32_t>(abs >= 0x477ff000, 0x7c00u, r);  // overflow, and inf
  r = select_bits<uint32_t>(abs > 0x7f800000, nan, r);
  return static_cast<uint16_t>(r | ((x >> 16) & 0x8000u));
}

inline float portable_bfloat16_to_float(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

inline uint16_t portable_float_to_bfloat16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1)) >> 16;  // nearest even
  uint32_t quiet_nan = (x >> 16) | 0x40u;
  bool nan = static_cast<int32_t>(x & 0x7fffffffu) > 0x7f800000;
  return static_cast<uint16_t>(select_bits<uint32_t>(nan, quiet_nan, rounded));
}

}  // namespace chorus::reduce
