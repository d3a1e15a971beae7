#include "comm/core/reduce.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

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

namespace {

struct Sum {
  template <class T> static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    } else {
      return a + b;
    }
  }
};
struct Prod {
  template <class T> static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      using U = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
      return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
    } else {
      return a * b;
    }
  }
};
struct Min {
  template <class T> static T apply(T a, T b) { return b < a ? b : a; }
};
struct Max {
  template <class T> static T apply(T a, T b) { return a < b ? b : a; }
};

template <class T, class Op>
void reduce_native(void* out, const void* a, const void* b, size_t n) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = Op::apply(x[i], y[i]);
}

template <float (*ToF)(uint16_t), uint16_t (*FromF)(float), class Op>
void reduce_16(void* out, const void* a, const void* b, size_t n) {
  uint16_t* o = static_cast<uint16_t*>(out);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = FromF(Op::apply(ToF(x[i]), ToF(y[i])));
}

template <class Op>
ReduceFn pick(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32: return reduce_native<float, Op>;
    case DataType::kFloat64: return reduce_native<double, Op>;
    case DataType::kFloat16: return reduce_16<half_to_float, float_to_half, Op>;
    case DataType::kBFloat16: return reduce_16<bfloat16_to_float, float_to_bfloat16, Op>;
    case DataType::kInt8: return reduce_native<int8_t, Op>;
    case DataType::kUInt8: return reduce_native<uint8_t, Op>;
    case DataType::kInt32: return reduce_native<int32_t, Op>;
    case DataType::kInt64: return reduce_native<int64_t, Op>;
  }
  return nullptr;
}

template <class T>
void divide_native(void* buf, size_t n, int d) {
  T* p = static_cast<T*>(buf);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<T>(p[i] / static_cast<T>(d));
}

template <float (*ToF)(uint16_t), uint16_t (*FromF)(float)>
void divide_16(void* buf, size_t n, int d) {
  uint16_t* p = static_cast<uint16_t*>(buf);
  for (size_t i = 0; i < n; ++i) p[i] = FromF(ToF(p[i]) / static_cast<float>(d));
}

}  // namespace

ReduceFn reduce_function(DataType dtype, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return pick<Sum>(dtype);
    case ReduceOp::kProd: return pick<Prod>(dtype);
    case ReduceOp::kMin: return pick<Min>(dtype);
    case ReduceOp::kMax: return pick<Max>(dtype);
  }
  return nullptr;
}

void finish_avg(void* buf, size_t count, DataType dtype, int divisor) {
  switch (dtype) {
    case DataType::kFloat32: return divide_native<float>(buf, count, divisor);
    case DataType::kFloat64: return divide_native<double>(buf, count, divisor);
    case DataType::kFloat16: return divide_16<half_to_float, float_to_half>(buf, count, divisor);
    case DataType::kBFloat16:
      return divide_16<bfloat16_to_float, float_to_bfloat16>(buf, count, divisor);
    case DataType::kInt8: return divide_native<int8_t>(buf, count, divisor);
    case DataType::kUInt8: return divide_native<uint8_t>(buf, count, divisor);
    case DataType::kInt32: return divide_native<int32_t>(buf, count, divisor);
    case DataType::kInt64: return divide_native<int64_t>(buf, count, divisor);
  }
}

}  // namespace chorus
