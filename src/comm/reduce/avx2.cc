// The AVX2 reduction kernels (x86-64, with F16C for f16). The file is compiled for the
// baseline target like the rest of the library: only the functions marked
// TARGET_AVX2 use AVX2, and reduce.cc hands them out only on CPUs that have it.
// Everything here has internal linkage, so that no AVX2 copy of an inline function can
// stand in for the baseline one elsewhere.
#include "comm/reduce/kernels.h"

#if defined(__x86_64__)

#include <immintrin.h>

#include <cstring>
#include <type_traits>

#define TARGET_AVX2 __attribute__((target("avx2,f16c")))

namespace chorus::reduce {
namespace {

// Computation domains: an element adapter loads into the vector of its domain, and the
// operators are overloaded on the domain.
struct Ps {};     // 8 x float
struct Pd {};     // 4 x double
struct Bytes {};  // 32 x 8 bits, for what signedness does not change
struct Epi8 : Bytes {};
struct Epu8 : Bytes {};
struct Epi32 {};
struct Epi64 {};

struct F32 : Ps {
  using Elem = float;
  static constexpr NanFrom kNanFrom = nan_from(DataType::kFloat32);
  static constexpr size_t kLanes = 8;
  TARGET_AVX2 static __m256 load(const float* p) { return _mm256_loadu_ps(p); }
  TARGET_AVX2 static void store(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
};

struct F64 : Pd {
  using Elem = double;
  static constexpr NanFrom kNanFrom = nan_from(DataType::kFloat64);
  static constexpr size_t kLanes = 4;
  TARGET_AVX2 static __m256d load(const double* p) { return _mm256_loadu_pd(p); }
  TARGET_AVX2 static void store(double* p, __m256d v) { _mm256_storeu_pd(p, v); }
};

// F16C converts exactly and rounds to nearest even, as half_to_float and float_to_half
// do. It differs only in quieting a signaling NaN on load, where half_to_float keeps
// it; float_to_half sets the quiet bit of every NaN it stores, so results agree.
struct F16 : Ps {
  using Elem = uint16_t;
  static constexpr NanFrom kNanFrom = nan_from(DataType::kFloat16);
  static constexpr size_t kLanes = 8;
  TARGET_AVX2 static __m256 load(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  TARGET_AVX2 static void store(uint16_t* p, __m256 v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
};

// float_to_bfloat16 on 8 lanes: round to nearest even by adding 0x7fff plus the lowest
// kept bit, except that a NaN keeps its upper half with the quiet bit set.
TARGET_AVX2 __m256i round_to_bfloat16(__m256 v) {
  __m256i x = _mm256_castps_si256(v);
  __m256i upper = _mm256_srli_epi32(x, 16);
  __m256i abs = _mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff));
  __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
  __m256i bias =
      _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(upper, _mm256_set1_epi32(1)));
  __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(x, bias), 16);
  __m256i quiet = _mm256_or_si256(upper, _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(rounded, quiet, nan);
}

struct BF16 : Ps {
  using Elem = uint16_t;
  static constexpr NanFrom kNanFrom = nan_from(DataType::kBFloat16);
  static constexpr size_t kLanes = 8;
  TARGET_AVX2 static __m256 load(const uint16_t* p) {
    __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  // The rounded lanes are below 2^16, so the saturating pack keeps them as they are.
  TARGET_AVX2 static void store(uint16_t* p, __m256 v) {
    __m256i r = round_to_bfloat16(v);
    __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
  }
};

template <class T, class Domain>
struct Int : Domain {
  using Elem = T;
  static constexpr size_t kLanes = 32 / sizeof(T);
  TARGET_AVX2 static __m256i load(const T* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  TARGET_AVX2 static void store(T* p, __m256i v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
  }
};

// 8-bit products (there is no 8-bit multiply): the low byte of a 16-bit product
// depends only on the low bytes of its factors, so multiplying the even bytes in place
// and the odd bytes shifted down gives every byte's product modulo 256.
TARGET_AVX2 __m256i mullo_epi8(__m256i a, __m256i b) {
  __m256i even = _mm256_mullo_epi16(a, b);
  __m256i odd = _mm256_mullo_epi16(_mm256_srli_epi16(a, 8), _mm256_srli_epi16(b, 8));
  return _mm256_or_si256(_mm256_and_si256(even, _mm256_set1_epi16(0xff)),
                         _mm256_slli_epi16(odd, 8));
}

// 64-bit products modulo 2^64 from 32x32->64 multiplies: lo*lo + ((lo*hi + hi*lo) << 32).
TARGET_AVX2 __m256i mullo_epi64(__m256i a, __m256i b) {
  __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), b),
                                   _mm256_mul_epu32(a, _mm256_srli_epi64(b, 32)));
  return _mm256_add_epi64(_mm256_mul_epu32(a, b), _mm256_slli_epi64(cross, 32));
}

struct Sum {
  static constexpr bool kArithmetic = true;
  TARGET_AVX2 static __m256 apply(Ps, __m256 a, __m256 b) { return _mm256_add_ps(a, b); }
  TARGET_AVX2 static __m256d apply(Pd, __m256d a, __m256d b) { return _mm256_add_pd(a, b); }
  TARGET_AVX2 static __m256i apply(Bytes, __m256i a, __m256i b) { return _mm256_add_epi8(a, b); }
  TARGET_AVX2 static __m256i apply(Epi32, __m256i a, __m256i b) { return _mm256_add_epi32(a, b); }
  TARGET_AVX2 static __m256i apply(Epi64, __m256i a, __m256i b) { return _mm256_add_epi64(a, b); }
};

struct Prod {
  static constexpr bool kArithmetic = true;
  TARGET_AVX2 static __m256 apply(Ps, __m256 a, __m256 b) { return _mm256_mul_ps(a, b); }
  TARGET_AVX2 static __m256d apply(Pd, __m256d a, __m256d b) { return _mm256_mul_pd(a, b); }
  TARGET_AVX2 static __m256i apply(Bytes, __m256i a, __m256i b) { return mullo_epi8(a, b); }
  TARGET_AVX2 static __m256i apply(Epi32, __m256i a, __m256i b) { return _mm256_mullo_epi32(a, b); }
  TARGET_AVX2 static __m256i apply(Epi64, __m256i a, __m256i b) { return mullo_epi64(a, b); }
};

// The float operators take (b, a) for min and max: the instructions return their
// second operand when the comparison is false (a NaN, or +0 against -0), and the
// scalar contract keeps `a` then.
struct Min {
  static constexpr bool kArithmetic = false;
  TARGET_AVX2 static __m256 apply(Ps, __m256 a, __m256 b) { return _mm256_min_ps(b, a); }
  TARGET_AVX2 static __m256d apply(Pd, __m256d a, __m256d b) { return _mm256_min_pd(b, a); }
  TARGET_AVX2 static __m256i apply(Epi8, __m256i a, __m256i b) { return _mm256_min_epi8(a, b); }
  TARGET_AVX2 static __m256i apply(Epu8, __m256i a, __m256i b) { return _mm256_min_epu8(a, b); }
  TARGET_AVX2 static __m256i apply(Epi32, __m256i a, __m256i b) { return _mm256_min_epi32(a, b); }
  TARGET_AVX2 static __m256i apply(Epi64, __m256i a, __m256i b) {
    return _mm256_blendv_epi8(a, b, _mm256_cmpgt_epi64(a, b));
  }
};

struct Max {
  static constexpr bool kArithmetic = false;
  TARGET_AVX2 static __m256 apply(Ps, __m256 a, __m256 b) { return _mm256_max_ps(b, a); }
  TARGET_AVX2 static __m256d apply(Pd, __m256d a, __m256d b) { return _mm256_max_pd(b, a); }
  TARGET_AVX2 static __m256i apply(Epi8, __m256i a, __m256i b) { return _mm256_max_epi8(a, b); }
  TARGET_AVX2 static __m256i apply(Epu8, __m256i a, __m256i b) { return _mm256_max_epu8(a, b); }
  TARGET_AVX2 static __m256i apply(Epi32, __m256i a, __m256i b) { return _mm256_max_epi32(a, b); }
  TARGET_AVX2 static __m256i apply(Epi64, __m256i a, __m256i b) {
    return _mm256_blendv_epi8(a, b, _mm256_cmpgt_epi64(b, a));
  }
};

// finish_avg's quotient (vector_loops.h, divide()).
struct Div {
  TARGET_AVX2 static __m256 apply(Ps, __m256 a, __m256 b) { return _mm256_div_ps(a, b); }
  TARGET_AVX2 static __m256d apply(Pd, __m256d a, __m256d b) { return _mm256_div_pd(a, b); }
};

TARGET_AVX2 __m256 splat(Ps, double v) { return _mm256_set1_ps(static_cast<float>(v)); }
TARGET_AVX2 __m256d splat(Pd, double v) { return _mm256_set1_pd(v); }

// keep_nan of kernels.h on vectors: lanes where `chosen` is a NaN get it quieted.
TARGET_AVX2 __m256 keep_nan(__m256 chosen, __m256 result) {
  __m256 quiet = _mm256_or_ps(chosen, _mm256_castsi256_ps(_mm256_set1_epi32(1 << 22)));
  return _mm256_blendv_ps(result, quiet, _mm256_cmp_ps(chosen, chosen, _CMP_UNORD_Q));
}

TARGET_AVX2 __m256d keep_nan(__m256d chosen, __m256d result) {
  __m256d quiet = _mm256_or_pd(chosen, _mm256_castsi256_pd(_mm256_set1_epi64x(int64_t{1} << 51)));
  return _mm256_blendv_pd(result, quiet, _mm256_cmp_pd(chosen, chosen, _CMP_UNORD_Q));
}

#define CHORUS_REDUCE_TARGET TARGET_AVX2
#include "comm/reduce/vector_loops.h"
#undef CHORUS_REDUCE_TARGET

}  // namespace

ReduceFn avx2_kernel(DataType dtype, ReduceOp op) { return select_kernel<Isa>(dtype, op); }
ReduceManyFn avx2_many_kernel(DataType dtype, ReduceOp op) {
  return select_kernel<Isa, Many>(dtype, op);
}
DivideFn avx2_divide(DataType dtype) { return select_divide<Isa>(dtype); }

}  // namespace chorus::reduce

#else  // not x86-64

namespace chorus::reduce {
ReduceFn avx2_kernel(DataType, ReduceOp) { return nullptr; }
ReduceManyFn avx2_many_kernel(DataType, ReduceOp) { return nullptr; }
DivideFn avx2_divide(DataType) { return nullptr; }
}  // namespace chorus::reduce

#endif
