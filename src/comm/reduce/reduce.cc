#include "comm/reduce/reduce.h"

#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "chorus/error.h"
#include "comm/common/logging.h"
#include "comm/common/settings.h"
#include "comm/reduce/kernels.h"

namespace chorus {

float half_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000 | (mant << 13);  // inf / NaN
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalize
    int shift = 0;
    while ((mant & 0x400) == 0) {
      mant <<= 1;
      ++shift;
    }
    mant &= 0x3ff;
    bits = sign | (static_cast<uint32_t>(113 - shift) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  uint32_t abs = x & 0x7fffffff;
  if (abs >= 0x7f800000) {  // inf or NaN (keep NaN quiet and non-zero)
    return static_cast<uint16_t>(sign | 0x7c00 | (abs > 0x7f800000 ? 0x200 | ((abs >> 13) & 0x3ff) : 0));
  }
  if (abs >= 0x477ff000) return static_cast<uint16_t>(sign | 0x7c00);  // overflow to inf
  if (abs < 0x38800000) {  // result is subnormal or zero
    if (abs < 0x33000000) return static_cast<uint16_t>(sign);
    uint32_t exp = abs >> 23;
    uint32_t mant = (abs & 0x7fffff) | 0x800000;
    uint32_t shift = 126 - exp;  // 14 + (113 - exp) - 1
    uint32_t half_mant = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half_mant & 1))) ++half_mant;
    return static_cast<uint16_t>(sign | half_mant);
  }
  uint32_t rounded = abs + 0xfff + ((abs >> 13) & 1);  // round to nearest even
  return static_cast<uint16_t>(sign | ((rounded - 0x38000000) >> 13));
}

float bfloat16_to_float(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_bfloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((x >> 16) | 0x40);  // NaN
  x += 0x7fff + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

using reduce::nan_from;
using reduce::NanFrom;

namespace {

// The element adapters of the reference: f16 and bf16 compute in float through the
// conversions above, the others as themselves.
struct Half {
  using Elem = uint16_t;
  static constexpr NanFrom kNanFrom = nan_from(DataType::kFloat16);
  static float load(uint16_t h) { return half_to_float(h); }
  static uint16_t store(float f) { return float_to_half(f); }
};
struct BFloat {
  using Elem = uint16_t;
  static constexpr NanFrom kNanFrom = nan_from(DataType::kBFloat16);
  static float load(uint16_t b) { return bfloat16_to_float(b); }
  static uint16_t store(float f) { return float_to_bfloat16(f); }
};

struct Reference {
  using F32 = reduce::Native<float>;
  using F64 = reduce::Native<double>;
  using F16 = Half;
  using BF16 = BFloat;
  using I8 = reduce::Native<int8_t>;
  using U8 = reduce::Native<uint8_t>;
  using I32 = reduce::Native<int32_t>;
  using I64 = reduce::Native<int64_t>;
  using Sum = reduce::ScalarSum;
  using Prod = reduce::ScalarProd;
  using Min = reduce::ScalarMin;
  using Max = reduce::ScalarMax;
  template <class Type, class Op> static ReduceFn kernel() {
    return reduce::scalar_reduce<Type, Op>;
  }
  template <class Type> static DivideFn divide() {
    return reduce::scalar_divide<Type, false>;
  }
};

}  // namespace

void finish_avg(void* buf, size_t count, DataType dtype, int divisor) {
  divide_function(dtype, reduce_isa())(buf, count, divisor);
}

// ----- instruction sets -----

const char* reduce_isa_name(ReduceIsa isa) {
  switch (isa) {
    case ReduceIsa::kPortable: return "portable";
    case ReduceIsa::kAvx2: return "avx2";
    case ReduceIsa::kAvx512: return "avx512";
  }
  return "?";
}

namespace {

#if defined(__x86_64__)
// F16C (CPUID leaf 1, ECX bit 29), asked of CPUID itself: not every compiler's
// __builtin_cpu_supports knows the name. The AVX2 check covers the OS side (YMM state).
bool cpu_has_f16c() {
  unsigned eax, ebx, ecx, edx;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
}
#endif

}  // namespace

bool reduce_isa_supported(ReduceIsa isa) {
  switch (isa) {
    case ReduceIsa::kPortable: return true;
#if defined(__x86_64__)
    // __builtin_cpu_supports also checks that the OS saves the vector registers.
    case ReduceIsa::kAvx2:
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx2") && cpu_has_f16c();
    case ReduceIsa::kAvx512:
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
#else
    case ReduceIsa::kAvx2:
    case ReduceIsa::kAvx512: return false;
#endif
  }
  return false;
}

namespace {

ReduceIsa best_supported_isa() {
  ReduceIsa best = ReduceIsa::kPortable;
  for (ReduceIsa isa : kAllReduceIsas) {
    if (reduce_isa_supported(isa)) best = isa;
  }
  return best;
}

}  // namespace

std::optional<ReduceIsa> parse_reduce_isa(const std::string& name) {
  if (name == "auto") return std::nullopt;
  std::string choices = "auto";
  for (ReduceIsa isa : kAllReduceIsas) {
    if (name == reduce_isa_name(isa)) return isa;
    choices += std::string(", ") + reduce_isa_name(isa);
  }
  throw ConfigError("CHORUS_REDUCE_ISA='" + name + "' is not one of " + choices);
}

ReduceIsa resolve_reduce_isa(const std::string& requested) {
  const std::optional<ReduceIsa> named = parse_reduce_isa(requested);
  ReduceIsa best = best_supported_isa();
  if (!named) return best;
  if (reduce_isa_supported(*named)) return *named;
  CHORUS_LOG(kWarn, "CHORUS_REDUCE_ISA=" << requested << ": this CPU does not support it; using "
                                         << reduce_isa_name(best));
  return best;
}

// The CPU and the environment do not change while a process runs: decide once, and log
// a fallback once rather than on every collective.
ReduceIsa reduce_isa() {
  static const ReduceIsa isa = resolve_reduce_isa(settings::reduce_isa());
  return isa;
}

namespace {

void require_supported(ReduceIsa isa) {
  if (!reduce_isa_supported(isa)) {
    throw InvalidArgumentError(std::string("reduction kernels: this CPU does not support ") +
                               reduce_isa_name(isa));
  }
}

}  // namespace

ReduceFn reduce_function(DataType dtype, ReduceOp op, ReduceIsa isa) {
  require_supported(isa);
  switch (isa) {
    case ReduceIsa::kPortable: return reduce::portable_kernel(dtype, op);
    case ReduceIsa::kAvx2: return reduce::avx2_kernel(dtype, op);
    case ReduceIsa::kAvx512: return reduce::avx512_kernel(dtype, op);
  }
  return nullptr;
}

ReduceManyFn reduce_many_function(DataType dtype, ReduceOp op, ReduceIsa isa) {
  require_supported(isa);
  switch (isa) {
    case ReduceIsa::kPortable: return reduce::portable_many_kernel(dtype, op);
    case ReduceIsa::kAvx2: return reduce::avx2_many_kernel(dtype, op);
    case ReduceIsa::kAvx512: return reduce::avx512_many_kernel(dtype, op);
  }
  return nullptr;
}

DivideFn divide_function(DataType dtype, ReduceIsa isa) {
  require_supported(isa);
  DivideFn fn = nullptr;
  switch (isa) {
    case ReduceIsa::kPortable: break;
    case ReduceIsa::kAvx2: fn = reduce::avx2_divide(dtype); break;
    case ReduceIsa::kAvx512: fn = reduce::avx512_divide(dtype); break;
  }
  return fn != nullptr ? fn : reduce::portable_divide(dtype);
}

ReduceFn reduce_function(DataType dtype, ReduceOp op) {
  return reduce_function(dtype, op, reduce_isa());
}

ReduceManyFn reduce_many_function(DataType dtype, ReduceOp op) {
  return reduce_many_function(dtype, op, reduce_isa());
}

ReduceFn reference_reduce_function(DataType dtype, ReduceOp op) {
  return reduce::select_kernel<Reference>(dtype, op);
}

DivideFn reference_divide_function(DataType dtype) {
  return reduce::select_divide<Reference>(dtype);
}

}  // namespace chorus
