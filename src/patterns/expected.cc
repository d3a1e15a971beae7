#include "patterns/expected.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <type_traits>

namespace chorus::patterns {

// ----- 16-bit floating point -----

namespace {

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Shifts `value` right by `shift` (>= 1) rounding to nearest, ties to even.
uint32_t shift_round_even(uint32_t value, uint32_t shift) {
  uint32_t result = value >> shift;
  uint32_t rest = value & ((1u << shift) - 1);
  uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (result & 1u))) ++result;
  return result;
}

}  // namespace

uint16_t float_to_half_bits(float value) {
  const uint32_t x = float_bits(value);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;        // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;       // >= 65520 rounds to infinity
  if (abs < 0x33000000u) return sign;                  // <= 2^-25 rounds to zero
  if (abs < 0x38800000u) {                             // half subnormal: units of 2^-24
    const uint32_t exponent = abs >> 23;
    const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    return sign | static_cast<uint16_t>(shift_round_even(mantissa, 126 - exponent));
  }
  // Normal: rebias the exponent (127 -> 15) and round away 13 mantissa bits; a carry
  // into the exponent is the correct rounding up to the next binade.
  const uint32_t rebased = abs - (112u << 23);
  return sign | static_cast<uint16_t>(shift_round_even(rebased, 13));
}

float half_bits_to_float(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {
    float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return bits_float(sign | 0x7f800000u | (mantissa << 13));
  return bits_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

uint16_t float_to_bf16_bits(float value) {
  const uint32_t x = float_bits(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  return static_cast<uint16_t>(shift_round_even(x, 16));
}

float bf16_bits_to_float(uint16_t bits) { return bits_float(static_cast<uint32_t>(bits) << 16); }

// ----- typed access -----

namespace {

struct Half {
  uint16_t bits;
};
struct BFloat {
  uint16_t bits;
};

template <class S>
double decode(S v) {
  return static_cast<double>(v);
}
template <>
double decode(Half v) {
  return half_bits_to_float(v.bits);
}
template <>
double decode(BFloat v) {
  return bf16_bits_to_float(v.bits);
}

template <class S>
S encode(double v) {
  return static_cast<S>(v);
}
template <>
Half encode(double v) {
  return Half{float_to_half_bits(static_cast<float>(v))};
}
template <>
BFloat encode(double v) {
  return BFloat{float_to_bf16_bits(static_cast<float>(v))};
}

// Calls f(S{}) with the storage type S of dtype.
template <class F>
decltype(auto) visit(DataType dtype, F&& f) {
  switch (dtype) {
    case DataType::kFloat32: return f(float{});
    case DataType::kFloat64: return f(double{});
    case DataType::kFloat16: return f(Half{});
    case DataType::kBFloat16: return f(BFloat{});
    case DataType::kInt8: return f(int8_t{});
    case DataType::kUInt8: return f(uint8_t{});
    case DataType::kInt32: return f(int32_t{});
    case DataType::kInt64: return f(int64_t{});
  }
  throw std::invalid_argument("unknown DataType " + std::to_string(static_cast<int>(dtype)));
}

// Bits of precision after the leading one.
int mantissa_bits(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32: return 23;
    case DataType::kFloat64: return 52;
    case DataType::kFloat16: return 10;
    case DataType::kBFloat16: return 7;
    default: return 0;
  }
}

// Collects mismatches: a count and the first few, for one readable line.
class Mismatches {
 public:
  void add(size_t index, double expected, double seen) {
    if (count_++ < 4) {
      out_ << (count_ > 1 ? "; " : "") << "[" << index << "] expected " << expected << " seen "
           << seen;
    }
  }
  size_t count() const { return count_; }
  std::string text(size_t n) const {
    if (count_ == 0) return "";
    std::ostringstream s;
    s.precision(17);
    s << count_ << " of " << n << " elements wrong: " << out_.str();
    return s.str();
  }

 private:
  size_t count_ = 0;
  std::ostringstream out_ = [] {
    std::ostringstream o;
    o.precision(17);
    return o;
  }();
};

// b(r, i) of the header comment.
int64_t base_part(bool is_signed_type, int rank, size_t index) {
  int64_t b = 1 + static_cast<int64_t>((index + 3 * static_cast<size_t>(rank)) % 7);
  return (is_signed_type && index % 3 == 2) ? -b : b;
}

// h(i) * scale(dtype) of the header comment.
double shared_part(DataType dtype, size_t index) {
  size_t limit;
  double scale = 1;
  switch (dtype) {
    case DataType::kInt8: limit = 8; break;
    case DataType::kUInt8: limit = 20; break;
    case DataType::kBFloat16: limit = 16; break;
    case DataType::kFloat16: limit = 200; break;
    case DataType::kInt64: limit = 1000; scale = 8589934592.0; break;  // 2^33
    case DataType::kFloat64: limit = 1000; scale = 1073741824.0; break;  // 2^30
    default: limit = 1000; break;
  }
  return static_cast<double>((index / 21) % limit) * scale;
}

int64_t prod_part(bool is_signed_type, int rank, size_t index) {
  int64_t v = ((index + static_cast<size_t>(rank)) % 5 == 0) ? 2 : 1;
  return (is_signed_type && (index + 2 * static_cast<size_t>(rank)) % 3 == 0) ? -v : v;
}

constexpr size_t kBasePeriod = 21;
constexpr size_t kProdPeriod = 15;

}  // namespace

bool is_floating(DataType dtype) {
  return dtype == DataType::kFloat32 || dtype == DataType::kFloat64 ||
         dtype == DataType::kFloat16 || dtype == DataType::kBFloat16;
}

bool is_signed(DataType dtype) { return dtype != DataType::kUInt8; }

double load_element(DataType dtype, const void* buf, size_t index) {
  return visit(dtype, [&](auto tag) {
    using S = decltype(tag);
    S v;
    std::memcpy(&v, static_cast<const char*>(buf) + index * sizeof(S), sizeof(S));
    return decode(v);
  });
}

void store_element(DataType dtype, void* buf, size_t index, double value) {
  visit(dtype, [&](auto tag) {
    using S = decltype(tag);
    S v = encode<S>(value);
    std::memcpy(static_cast<char*>(buf) + index * sizeof(S), &v, sizeof(S));
  });
}

// ----- periodic patterns -----
//
// Every pattern here is periodic in the element index (value(i) == value(i % period)),
// so large buffers are filled by copying one encoded period and checked with memcmp
// per period, falling back to element-wise comparison only where bytes differ. This
// keeps the test's own work well below the library's on the 2^20-element cases.

namespace {

// Element-wise comparison of n elements of `in` (global indices first..) with value().
template <class S, class Value, class Accept>
void compare_elements(const S* in, size_t first, size_t n, const Value& value,
                      const Accept& accept, Mismatches& bad) {
  for (size_t k = 0; k < n; ++k) {
    const double want = value(first + k), seen = decode(in[k]);
    if (!accept(want, seen)) bad.add(first + k, want, seen);
  }
}

// Encoded table of one period, or empty when filling element by element is cheaper.
template <class S, class Value>
std::vector<S> period_table(size_t period, size_t n, const Value& value) {
  std::vector<S> table;
  if (period == 0 || n < 2 * period) return table;
  table.resize(period);
  for (size_t j = 0; j < period; ++j) table[j] = encode<S>(value(j));
  return table;
}

template <class S, class Value>
void fill_periodic(S* out, size_t first, size_t n, size_t period, const Value& value) {
  std::vector<S> table = period_table<S>(period, n, value);
  if (table.empty()) {
    for (size_t k = 0; k < n; ++k) out[k] = encode<S>(value(first + k));
    return;
  }
  for (size_t k = 0; k < n;) {
    const size_t j = (first + k) % period, run = std::min(period - j, n - k);
    std::memcpy(out + k, table.data() + j, run * sizeof(S));
    k += run;
  }
}

template <class S, class Value, class Accept>
Mismatches compare_periodic(const S* in, size_t first, size_t n, size_t period,
                            const Value& value, const Accept& accept) {
  Mismatches bad;
  std::vector<S> table = period_table<S>(period, n, value);
  if (table.empty()) {
    compare_elements(in, first, n, value, accept, bad);
    return bad;
  }
  for (size_t k = 0; k < n;) {
    const size_t j = (first + k) % period, run = std::min(period - j, n - k);
    if (std::memcmp(in + k, table.data() + j, run * sizeof(S)) != 0) {
      compare_elements(in + k, first + k, run, value, accept, bad);
    }
    k += run;
  }
  return bad;
}

template <class S, class Value, class Accept>
std::string check_periodic(const S* in, size_t first, size_t n, size_t period, const Value& value,
                           const Accept& accept) {
  return compare_periodic(in, first, n, period, value, accept).text(n);
}

bool exactly_equal(double want, double seen) { return want == seen; }

// Period of h(i) * scale in elements (see shared_part).
size_t shared_period(DataType dtype) {
  switch (dtype) {
    case DataType::kInt8: return kBasePeriod * 8;
    case DataType::kUInt8: return kBasePeriod * 20;
    case DataType::kBFloat16: return kBasePeriod * 16;
    case DataType::kFloat16: return kBasePeriod * 200;
    default: return kBasePeriod * 1000;
  }
}

size_t reduce_period(DataType dtype, ReduceOp op) {
  return op == ReduceOp::kProd ? kProdPeriod : shared_period(dtype);
}

size_t move_period(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat16: return 2048;
    case DataType::kBFloat16:
    case DataType::kUInt8:
    case DataType::kInt8: return 256;
    default: return 0;  // not periodic within any buffer used here; cheap to compute
  }
}

// The b() (or prod) part of index j reduced over `size` ranks in two's complement
// arithmetic modulo 2^64, which narrowing to a smaller integer type keeps exact.
uint64_t wrapped_fold(ReduceOp op, bool is_signed_type, int size, size_t j) {
  auto part = [&](int r) {
    return static_cast<uint64_t>(op == ReduceOp::kProd ? prod_part(is_signed_type, r, j)
                                                       : base_part(is_signed_type, r, j));
  };
  uint64_t acc = part(0);
  for (int r = 1; r < size; ++r) {
    const uint64_t v = part(r);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg: acc += v; break;
      case ReduceOp::kProd: acc *= v; break;
      case ReduceOp::kMin:
        acc = static_cast<uint64_t>(std::min(static_cast<int64_t>(acc), static_cast<int64_t>(v)));
        break;
      case ReduceOp::kMax:
        acc = static_cast<uint64_t>(std::max(static_cast<int64_t>(acc), static_cast<int64_t>(v)));
        break;
    }
  }
  return acc;
}

// `value` (modulo 2^64) as an element of the integer type S: narrowing wraps around.
template <class S>
double narrow(uint64_t value) {
  if constexpr (std::is_integral_v<S>) {
    return static_cast<double>(static_cast<S>(value));
  } else {
    return static_cast<double>(static_cast<int64_t>(value));  // not used for floating types
  }
}

}  // namespace

// ----- reductions -----

double reduce_input(DataType dtype, ReduceOp op, int rank, size_t index) {
  if (op == ReduceOp::kProd) return static_cast<double>(prod_part(is_signed(dtype), rank, index));
  return static_cast<double>(base_part(is_signed(dtype), rank, index)) + shared_part(dtype, index);
}

void fill_reduce_input(DataType dtype, ReduceOp op, int rank, void* buf, size_t first, size_t n) {
  visit(dtype, [&](auto tag) {
    using S = decltype(tag);
    fill_periodic(static_cast<S*>(buf), first, n, reduce_period(dtype, op),
                  [&](size_t i) { return reduce_input(dtype, op, rank, i); });
  });
}

std::string check_reduce_input(DataType dtype, ReduceOp op, int rank, const void* buf,
                               size_t first, size_t n) {
  return visit(dtype, [&](auto tag) {
    using S = decltype(tag);
    return check_periodic(static_cast<const S*>(buf), first, n, reduce_period(dtype, op),
                          [&](size_t i) { return reduce_input(dtype, op, rank, i); },
                          exactly_equal);
  });
}

ReduceExpectation::ReduceExpectation(DataType dtype, ReduceOp op, int size)
    : dtype_(dtype), op_(op), size_(size) {
  const bool sgn = is_signed(dtype);
  const size_t period = op == ReduceOp::kProd ? kProdPeriod : kBasePeriod;
  table_.resize(period);
  wrapped_.resize(period);
  for (size_t j = 0; j < period; ++j) {
    double acc = op == ReduceOp::kProd ? static_cast<double>(prod_part(sgn, 0, j))
                                       : static_cast<double>(base_part(sgn, 0, j));
    for (int r = 1; r < size; ++r) {
      double v = op == ReduceOp::kProd ? static_cast<double>(prod_part(sgn, r, j))
                                       : static_cast<double>(base_part(sgn, r, j));
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kAvg: acc += v; break;
        case ReduceOp::kProd: acc *= v; break;
        case ReduceOp::kMin: acc = std::min(acc, v); break;
        case ReduceOp::kMax: acc = std::max(acc, v); break;
      }
    }
    table_[j] = acc;
    wrapped_[j] = wrapped_fold(op, sgn, size, j);
  }
}

double ReduceExpectation::exact(size_t index) const {
  if (op_ == ReduceOp::kProd) return table_[index % kProdPeriod];
  const double b = table_[index % kBasePeriod];
  const double h = shared_part(dtype_, index);
  switch (op_) {
    case ReduceOp::kSum: return b + size_ * h;
    case ReduceOp::kMin:
    case ReduceOp::kMax: return b + h;
    case ReduceOp::kAvg: {
      const double total = b + size_ * h;
      if (is_floating(dtype_)) return total / size_;
      return static_cast<double>(static_cast<int64_t>(total) / size_);  // truncates to 0
    }
    case ReduceOp::kProd: break;
  }
  return 0;
}

std::string ReduceExpectation::check(const void* buf, size_t first, size_t n) const {
  const bool inexact_avg = op_ == ReduceOp::kAvg && is_floating(dtype_);
  const double rel = std::ldexp(1.0, -mantissa_bits(dtype_));
  auto accept = [&](double want, double seen) {
    // A quotient that is not a whole number is rounded: allow one unit in the last place.
    if (inexact_avg && want != std::trunc(want)) return std::fabs(seen - want) <= std::fabs(want) * rel;
    return seen == want;
  };
  return visit(dtype_, [&](auto tag) {
    using S = decltype(tag);
    return check_periodic(static_cast<const S*>(buf), first, n, reduce_period(dtype_, op_),
                          [&](size_t i) { return exact(i); }, accept);
  });
}

size_t ReduceExpectation::count_wrong(const void* buf, size_t first, size_t n,
                                      double rel_tolerance) const {
  return visit(dtype_, [&](auto tag) {
    using S = decltype(tag);
    // The result as an element of dtype: integers wrap around, floating values round
    // (a sum past the type's range is infinite on both sides).
    auto result = [&](size_t i) -> double {
      if (is_floating(dtype_)) return decode(encode<S>(exact(i)));
      if (op_ == ReduceOp::kProd) return narrow<S>(wrapped_[i % kProdPeriod]);
      const uint64_t b = wrapped_[i % kBasePeriod];
      const uint64_t h = static_cast<uint64_t>(static_cast<int64_t>(shared_part(dtype_, i)));
      switch (op_) {
        case ReduceOp::kMin:
        case ReduceOp::kMax: return narrow<S>(b + h);
        case ReduceOp::kAvg:  // the wrapped sum, divided truncating toward zero
          return std::trunc(narrow<S>(b + static_cast<uint64_t>(size_) * h) / size_);
        default: return narrow<S>(b + static_cast<uint64_t>(size_) * h);
      }
    };
    auto accept = [&](double want, double seen) {
      return seen == want || std::fabs(seen - want) <= rel_tolerance * std::max(1.0, std::fabs(want));
    };
    return compare_periodic(static_cast<const S*>(buf), first, n, reduce_period(dtype_, op_),
                            result, accept).count();
  });
}

// ----- data movement -----

double move_value(DataType dtype, int rank, size_t index) {
  const uint64_t r = static_cast<uint64_t>(rank), i = index;
  switch (dtype) {
    case DataType::kInt64: return static_cast<double>((r << 40) + i + 1);
    case DataType::kFloat64: return static_cast<double>((r << 32) + i + 1);
    case DataType::kInt32: return static_cast<double>((r << 27) + i + 1);
    case DataType::kFloat32: return static_cast<double>(((r << 21) + i + 1) % (1u << 24));
    case DataType::kFloat16: return static_cast<double>((r * 509 + i) % 2048);
    case DataType::kBFloat16:
    case DataType::kUInt8: return static_cast<double>((r * 37 + i) % 256);
    case DataType::kInt8: return static_cast<double>((r * 37 + i) % 256) - 128;
  }
  return 0;
}

void fill_move(DataType dtype, int rank, void* buf, size_t first, size_t n) {
  visit(dtype, [&](auto tag) {
    using S = decltype(tag);
    fill_periodic(static_cast<S*>(buf), first, n, move_period(dtype),
                  [&](size_t i) { return move_value(dtype, rank, i); });
  });
}

std::string check_move(DataType dtype, int rank, const void* buf, size_t first, size_t n) {
  return visit(dtype, [&](auto tag) {
    using S = decltype(tag);
    return check_periodic(static_cast<const S*>(buf), first, n, move_period(dtype),
                          [&](size_t i) { return move_value(dtype, rank, i); }, exactly_equal);
  });
}

size_t count_wrong_move(DataType dtype, int rank, const void* buf, size_t first, size_t n) {
  return visit(dtype, [&](auto tag) {
    using S = decltype(tag);
    return compare_periodic(static_cast<const S*>(buf), first, n, move_period(dtype),
                            [&](size_t i) { return move_value(dtype, rank, i); }, exactly_equal)
        .count();
  });
}

// ----- raw bytes -----

std::string check_sentinel(const void* buf, size_t bytes) {
  const uint8_t* p = static_cast<const uint8_t*>(buf);
  for (size_t k = 0; k < bytes; ++k) {
    if (p[k] != kSentinelByte) {
      size_t changed = 0;
      for (size_t j = k; j < bytes; ++j) changed += p[j] != kSentinelByte;
      return "memory that must not be written was changed: " + std::to_string(changed) +
             " of " + std::to_string(bytes) + " bytes, first at byte " + std::to_string(k);
    }
  }
  return "";
}

uint64_t checksum(const void* buf, size_t bytes) {
  const uint8_t* p = static_cast<const uint8_t*>(buf);
  uint64_t h = 0x9e3779b97f4a7c15ull ^ bytes;
  size_t k = 0;
  for (; k + 8 <= bytes; k += 8) {
    uint64_t w;
    std::memcpy(&w, p + k, 8);
    h = (h ^ w) * 0xff51afd7ed558ccdull;
    h ^= h >> 32;
  }
  for (; k < bytes; ++k) h = (h ^ p[k]) * 0x100000001b3ull;
  return h;
}

}  // namespace chorus::patterns
