// The AVX-512 reduction kernels (x86-64, F and BW). The file is compiled for the
// baseline target like the rest of the library: only the functions marked
// TARGET_AVX512 use AVX-512, and reduce.cc hands them out only on CPUs that
// have it. Everything here has internal linkage, so that no AVX-512 copy of an inline
// function can stand in for the baseline one elsewhere. The structure is that of
// avx2.cc, with twice the lanes and the native 64-bit min and max.
#include "comm/reduce/kernels.h"

#if defined(__x86_64__)

#include <immintrin.h>

#include <cstring>
#include <type_traits>

// GCC 12's AVX-512 intrinsics start from a deliberately undefined vector, which
// -Wmaybe-uninitialized reports at every use (GCC bug 105593, fixed in later releases);
// where the use is inlined into a loop (reduce_many), as -Wuninitialized.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#define TARGET_AVX512 __attribute__((target("avx512f,avx512bw")))

namespace chorus::reduce {
namespace {

struct Ps {};     // 16 x float
struct Pd {};     // 8 x double
struct Bytes {};  // 64 x 8 bits, for what signedness does not change
struct Epi8 : Bytes {};
struct Epu8 : Bytes {};
struct Epi32 {};
struct Epi64 {};

struct F32 : Ps {
  using Elem = float;
  static constexpr NanFrom kNanFrom = nan_from(DataType::kFloat32);
  static constexpr size_t kLanes = 16;
  TARGET_AVX512 static __m512 load(const float* p) { return _mm512_loadu_ps(p); }
  TARGET_AVX512 static void store(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
};

struct F64 : Pd {
  using Elem = double;
  static constexpr NanFrom kNanFrom = nan_from(DataType::kFloat64);
  static constexpr size_t kLanes = 8;
  TARGET_AVX512 static __m512d load(const double* p) { return _mm512_loadu_pd(p); }
  TARGET_AVX512 static void store(double* p, __m512d v) { _mm512_storeu_pd(p, v); }
};

// As in avx2.cc: exact conversions, rounding to nearest even; a signaling NaN
// is quieted on load, which float_to_half does on store anyway.
struct F16 : Ps {
  using Elem = uint16_t;
  static constexpr NanFrom kNanFrom = nan_from(DataType::kFloat16);
  static constexpr size_t kLanes = 16;
  TARGET_AVX512 static __m512 load(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  TARGET_AVX512 static void store(uint16_t* p, __m512 v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
};

// float_to_bfloat16 on 16 lanes (see avx2.cc).
TARGET_AVX512 __m512i round_to_bfloat16(__m512 v) {
  __m512i x = _mm512_castps_si512(v);
  __m512i upper = _mm512_srli_epi32(x, 16);
  __m512i abs = _mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff));
  __mmask16 nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7f800000));
  __m512i bias =
      _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(upper, _mm512_set1_epi32(1)));
  __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(x, bias), 16);
  __m512i quiet = _mm512_or_si512(upper, _mm512_set1_epi32(0x40));
  return _mm512_mask_blend_epi32(nan, rounded, quiet);
}

struct BF16 : Ps {
  using Elem = uint16_t;
  static constexpr NanFrom kNanFrom = nan_from(DataType::kBFloat16);
  static constexpr size_t kLanes = 16;
  TARGET_AVX512 static __m512 load(const uint16_t* p) {
    __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
  }
  // The rounded lanes are below 2^16: truncating them to 16 bits keeps them.
  TARGET_AVX512 static void store(uint16_t* p, __m512 v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(round_to_bfloat16(v)));
  }
};

template <class T, class Domain>
struct Int : Domain {
  using Elem = T;
  static constexpr size_t kLanes = 64 / sizeof(T);
  TARGET_AVX512 static __m512i load(const T* p) { return _mm512_loadu_si512(p); }
  TARGET_AVX512 static void store(T* p, __m512i v) { _mm512_storeu_si512(p, v); }
};

// 8-bit products through 16-bit ones (see avx2.cc).
TARGET_AVX512 __m512i mullo_epi8(__m512i a, __m512i b) {
  __m512i even = _mm512_mullo_epi16(a, b);
  __m512i odd = _mm512_mullo_epi16(_mm512_srli_epi16(a, 8), _mm512_srli_epi16(b, 8));
  return _mm512_or_si512(_mm512_and_si512(even, _mm512_set1_epi16(0xff)),
                         _mm512_slli_epi16(odd, 8));
}

// 64-bit products without AVX-512 DQ: lo*lo + ((lo*hi + hi*lo) << 32).
TARGET_AVX512 __m512i mullo_epi64(__m512i a, __m512i b) {
  __m512i cross = _mm512_add_epi64(_mm512_mul_epu32(_mm512_srli_epi64(a, 32), b),
                                   _mm512_mul_epu32(a, _mm512_srli_epi64(b, 32)));
  return _mm512_add_epi64(_mm512_mul_epu32(a, b), _mm512_slli_epi64(cross, 32));
}

struct Sum {
  static constexpr bool kArithmetic = true;
  TARGET_AVX512 static __m512 apply(Ps, __m512 a, __m512 b) { return _mm512_add_ps(a, b); }
  TARGET_AVX512 static __m512d apply(Pd, __m512d a, __m512d b) { return _mm512_add_pd(a, b); }
  TARGET_AVX512 static __m512i apply(Bytes, __m512i a, __m512i b) { return _mm512_add_epi8(a, b); }
  TARGET_AVX512 static __m512i apply(Epi32, __m512i a, __m512i b) { return _mm512_add_epi32(a, b); }
  TARGET_AVX512 static __m512i apply(Epi64, __m512i a, __m512i b) { return _mm512_add_epi64(a, b); }
};

struct Prod {
  static constexpr bool kArithmetic = true;
  TARGET_AVX512 static __m512 apply(Ps, __m512 a, __m512 b) { return _mm512_mul_ps(a, b); }
  TARGET_AVX512 static __m512d apply(Pd, __m512d a, __m512d b) { return _mm512_mul_pd(a, b); }
  TARGET_AVX512 static __m512i apply(Bytes, __m512i a, __m512i b) { return mullo_epi8(a, b); }
  TARGET_AVX512 static __m512i apply(Epi32, __m512i a, __m512i b) {
    return _mm512_mullo_epi32(a, b);
  }
  TARGET_AVX512 static __m512i apply(Epi64, __m512i a, __m512i b) { return mullo_epi64(a, b); }
};

// Float min and max take (b, a): see avx2.cc.
struct Min {
  static constexpr bool kArithmetic = false;
  TARGET_AVX512 static __m512 apply(Ps, __m512 a, __m512 b) { return _mm512_min_ps(b, a); }
  TARGET_AVX512 static __m512d apply(Pd, __m512d a, __m512d b) { return _mm512_min_pd(b, a); }
  TARGET_AVX512 static __m512i apply(Epi8, __m512i a, __m512i b) { return _mm512_min_epi8(a, b); }
  TARGET_AVX512 static __m512i apply(Epu8, __m512i a, __m512i b) { return _mm512_min_epu8(a, b); }
  TARGET_AVX512 static __m512i apply(Epi32, __m512i a, __m512i b) { return _mm512_min_epi32(a, b); }
  TARGET_AVX512 static __m512i apply(Epi64, __m512i a, __m512i b) { return _mm512_min_epi64(a, b); }
};

struct Max {
  static constexpr bool kArithmetic = false;
  TARGET_AVX512 static __m512 apply(Ps, __m512 a, __m512 b) { return _mm512_max_ps(b, a); }
  TARGET_AVX512 static __m512d apply(Pd, __m512d a, __m512d b) { return _mm512_max_pd(b, a); }
  TARGET_AVX512 static __m512i apply(Epi8, __m512i a, __m512i b) { return _mm512_max_epi8(a, b); }
  TARGET_AVX512 static __m512i apply(Epu8, __m512i a, __m512i b) { return _mm512_max_epu8(a, b); }
  TARGET_AVX512 static __m512i apply(Epi32, __m512i a, __m512i b) { return _mm512_max_epi32(a, b); }
  TARGET_AVX512 static __m512i apply(Epi64, __m512i a, __m512i b) { return _mm512_max_epi64(a, b); }
};

// finish_avg's quotient (vector_loops.h, divide()).
struct Div {
  TARGET_AVX512 static __m512 apply(Ps, __m512 a, __m512 b) { return _mm512_div_ps(a, b); }
  TARGET_AVX512 static __m512d apply(Pd, __m512d a, __m512d b) { return _mm512_div_pd(a, b); }
};

TARGET_AVX512 __m512 splat(Ps, double v) { return _mm512_set1_ps(static_cast<float>(v)); }
TARGET_AVX512 __m512d splat(Pd, double v) { return _mm512_set1_pd(v); }

// keep_nan of kernels.h on vectors: lanes where `chosen` is a NaN get it quieted.
TARGET_AVX512 __m512 keep_nan(__m512 chosen, __m512 result) {
  __mmask16 nan = _mm512_cmp_ps_mask(chosen, chosen, _CMP_UNORD_Q);
  __m512i quiet = _mm512_or_si512(_mm512_castps_si512(chosen), _mm512_set1_epi32(1 << 22));
  return _mm512_mask_blend_ps(nan, result, _mm512_castsi512_ps(quiet));
}

TARGET_AVX512 __m512d keep_nan(__m512d chosen, __m512d result) {
  __mmask8 nan = _mm512_cmp_pd_mask(chosen, chosen, _CMP_UNORD_Q);
  __m512i quiet = _mm512_or_si512(_mm512_castpd_si512(chosen), _mm512_set1_epi64(int64_t{1} << 51));
  return _mm512_mask_blend_pd(nan, result, _mm512_castsi512_pd(quiet));
}

#define CHORUS_REDUCE_TARGET TARGET_AVX512
#include "comm/reduce/vector_loops.h"
#undef CHORUS_REDUCE_TARGET

}  // namespace

ReduceFn avx512_kernel(DataType dtype, ReduceOp op) { return select_kernel<Isa>(dtype, op); }
ReduceManyFn avx512_many_kernel(DataType dtype, ReduceOp op) {
  return select_kernel<Isa, Many>(dtype, op);
}
DivideFn avx512_divide(DataType dtype) { return select_divide<Isa>(dtype); }

}  // namespace chorus::reduce

#else  // not x86-64

namespace chorus::reduce {
ReduceFn avx512_kernel(DataType, ReduceOp) { return nullptr; }
ReduceManyFn avx512_many_kernel(DataType, ReduceOp) { return nullptr; }
DivideFn avx512_divide(DataType) { return nullptr; }
}  // namespace chorus::reduce

#endif
