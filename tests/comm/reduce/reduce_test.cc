// Reduction kernels: every instruction set this CPU has, forced one at a time, against
// the scalar reference, bit for bit. Swept over dtype x op x count (around every vector
// width) x alignment x aliasing, with inputs that mix random bits and special values
// (NaN payloads, signed zeros, infinities, subnormals, integer extremes). f16 and bf16
// also run every value against a set of partners, and the portable conversions are
// checked against chorus's own. A few closed-form cases pin the reference itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "chorus/error.h"
#include "comm/reduce/reduce.h"
#include "comm/reduce/kernels.h"

namespace chorus {
namespace {

constexpr size_t kCounts[] = {0, 1, 7, 15, 16, 17, 31, 33, 63, 64, 65, 127, 1000, 4099};
constexpr size_t kMaxCount = 4099;
constexpr uint8_t kSentinel = 0xa5;
constexpr size_t kGuardBytes = 64;  // before and after every output, must stay kSentinel
// Mismatching cases after which a test stops (a systematic bug would print thousands).
constexpr int kMaxFailedCases = 10;

// ----- inputs -----

// Bit patterns that every instruction set must treat exactly like the reference.
std::vector<uint64_t> special_values(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32:
      return {0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00001,
              0x7f800001, 0x7fa5a5a5, 0xffbfffff, 0x00000001, 0x807fffff, 0x00800000,
              0x7f7fffff, 0xff7fffff, 0x3f800000, 0xbf800000, 0x3f800001, 0x4b000001,
              0x33800000, 0x1f800000};
    case DataType::kFloat64:
      return {0x0000000000000000, 0x8000000000000000, 0x7ff0000000000000, 0xfff0000000000000,
              0x7ff8000000000000, 0xfff8000000000001, 0x7ff0000000000001, 0x7ff5a5a5a5a5a5a5,
              0x0000000000000001, 0x800fffffffffffff, 0x0010000000000000, 0x7fefffffffffffff,
              0xffefffffffffffff, 0x3ff0000000000000, 0xbff0000000000000, 0x3ff0000000000001,
              0x1ff0000000000000};
    case DataType::kFloat16:
      return {0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0xfe01, 0x7c01, 0x7d55, 0xfdff,
              0x0001, 0x83ff, 0x0400, 0x0200, 0x7bff, 0xfbff, 0x3c00, 0xbc00, 0x3c01,
              0x1400, 0x5bff, 0x7800};
    case DataType::kBFloat16:
      return {0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0xffc1, 0x7f81, 0x7fa5, 0xffbf,
              0x0001, 0x807f, 0x0080, 0x7f7f, 0xff7f, 0x3f80, 0xbf80, 0x3f81, 0x4b01, 0x0040};
    case DataType::kInt8:
    case DataType::kUInt8: return {0x00, 0x01, 0xff, 0x80, 0x7f, 0x81, 0x7e, 0x02, 0x10, 0x55};
    case DataType::kInt32:
      return {0, 1, 0xffffffff, 0x80000000, 0x7fffffff, 0x80000001, 0x7ffffffe, 2, 0x10000,
              0x55555555};
    case DataType::kInt64:
      return {0,
              1,
              0xffffffffffffffff,
              0x8000000000000000,
              0x7fffffffffffffff,
              0x8000000000000001,
              0x00000000ffffffff,
              0x0000000100000000,
              0xffffffff00000001,
              0x5555555555555555};
  }
  return {};
}

void put(uint8_t* p, uint64_t bits, size_t size) {
  // Little endian: the low `size` bytes of `bits` are the element.
  std::memcpy(p, &bits, size);
}

// `count` elements: a special value, random bits, or (for floats, when `near` is given)
// a neighbour of near's element, whose sum or product needs rounding.
std::vector<uint8_t> make_input(DataType dtype, size_t count, std::mt19937_64& rng,
                                const std::vector<uint8_t>* near) {
  size_t size = dtype_size(dtype);
  std::vector<uint64_t> specials = special_values(dtype);
  bool floating = dtype == DataType::kFloat32 || dtype == DataType::kFloat64 ||
                  dtype == DataType::kFloat16 || dtype == DataType::kBFloat16;
  std::vector<uint8_t> out(count * size);
  for (size_t i = 0; i < count; ++i) {
    uint64_t bits = rng();
    unsigned kind = static_cast<unsigned>(bits % 5);
    bits = rng();
    if (kind <= 1) {
      bits = specials[bits % specials.size()];
    } else if (kind == 2 && floating && near != nullptr) {
      uint64_t base = 0;
      std::memcpy(&base, near->data() + i * size, size);
      bits = base ^ (bits & 0x1f);
    }
    put(out.data() + i * size, bits, size);
  }
  return out;
}

// ----- one case -----

enum class Alias { kNone, kOutIsA, kOutIsB, kAll };

const char* alias_name(Alias alias) {
  switch (alias) {
    case Alias::kNone: return "separate";
    case Alias::kOutIsA: return "out==a";
    case Alias::kOutIsB: return "out==b";
    case Alias::kAll: return "out==a==b";
  }
  return "?";
}

// Bytes with a 64-byte aligned start, guarded by kSentinel on both sides.
class GuardedBuffer {
 public:
  GuardedBuffer(size_t bytes, size_t offset) : storage_(bytes + offset + 2 * kGuardBytes + 64) {
    std::memset(storage_.data(), kSentinel, storage_.size());
    auto base = reinterpret_cast<uintptr_t>(storage_.data());
    size_t align = (64 - base % 64) % 64;
    data_ = storage_.data() + align + kGuardBytes + offset;
    bytes_ = bytes;
  }
  uint8_t* data() { return data_; }
  bool guards_intact() const {
    for (const uint8_t* p = storage_.data(); p < data_; ++p) {
      if (*p != kSentinel) return false;
    }
    for (const uint8_t* p = data_ + bytes_; p < storage_.data() + storage_.size(); ++p) {
      if (*p != kSentinel) return false;
    }
    return true;
  }

 private:
  std::vector<uint8_t> storage_;
  uint8_t* data_;
  size_t bytes_;
};

std::string hex(const uint8_t* p, size_t size) {
  uint64_t bits = 0;
  std::memcpy(&bits, p, size);
  char text[24];
  std::snprintf(text, sizeof text, "0x%0*llx", static_cast<int>(2 * size),
                static_cast<unsigned long long>(bits));
  return text;
}

// "" when `fn` gives the reference's bytes for a[0..count) (op) b[0..count) with this
// alignment and aliasing and writes nothing outside its output, else what differed.
std::string check_case(ReduceFn fn, DataType dtype, ReduceOp op, const uint8_t* a,
                       const uint8_t* b, size_t count, size_t offset_elems, Alias alias) {
  size_t size = dtype_size(dtype), bytes = count * size;
  const uint8_t* b_used = alias == Alias::kAll ? a : b;
  std::vector<uint8_t> expected(bytes + 1);
  reference_reduce_function(dtype, op)(expected.data(), a, b_used, count);

  GuardedBuffer out(bytes, offset_elems * size), in_a(bytes, offset_elems * size),
      in_b(bytes, offset_elems * size);
  std::memcpy(in_a.data(), a, bytes);
  std::memcpy(in_b.data(), b_used, bytes);
  switch (alias) {
    case Alias::kNone: fn(out.data(), in_a.data(), in_b.data(), count); break;
    case Alias::kOutIsA:
      std::memcpy(out.data(), a, bytes);
      fn(out.data(), out.data(), in_b.data(), count);
      break;
    case Alias::kOutIsB:
      std::memcpy(out.data(), b_used, bytes);
      fn(out.data(), in_a.data(), out.data(), count);
      break;
    case Alias::kAll:
      std::memcpy(out.data(), a, bytes);
      fn(out.data(), out.data(), out.data(), count);
      break;
  }
  std::string where = std::string(dtype_name(dtype)) + " " + op_name(op) + " count " +
                      std::to_string(count) + " offset " + std::to_string(offset_elems) + " " +
                      alias_name(alias) + ": ";
  if (!out.guards_intact()) return where + "wrote outside its output";
  for (size_t i = 0; i < count; ++i) {
    if (std::memcmp(out.data() + i * size, expected.data() + i * size, size) != 0) {
      return where + "element " + std::to_string(i) + ": " + hex(a + i * size, size) + " " +
             op_name(op) + " " + hex(b_used + i * size, size) + " = " +
             hex(expected.data() + i * size, size) + " in the reference, " +
             hex(out.data() + i * size, size);
    }
  }
  return "";
}

// ----- the sweep: one test per instruction set and dtype -----

struct SweepParam {
  ReduceIsa isa;
  DataType dtype;
};

std::string sweep_name(const testing::TestParamInfo<SweepParam>& info) {
  return std::string(reduce_isa_name(info.param.isa)) + "_" + dtype_name(info.param.dtype);
}

std::vector<SweepParam> sweep_params() {
  std::vector<SweepParam> params;
  for (ReduceIsa isa : kAllReduceIsas) {
    for (DataType dtype : kAllDataTypes) params.push_back({isa, dtype});
  }
  return params;
}

class ReduceSweep : public testing::TestWithParam<SweepParam> {};

TEST_P(ReduceSweep, MatchesReferenceBitwise) {
  auto [isa, dtype] = GetParam();
  if (!reduce_isa_supported(isa)) GTEST_SKIP() << reduce_isa_name(isa) << " is not supported here";
  std::mt19937_64 rng(static_cast<uint64_t>(dtype) * 1000003 + 17);
  std::vector<uint8_t> a = make_input(dtype, kMaxCount, rng, nullptr);
  std::vector<uint8_t> b = make_input(dtype, kMaxCount, rng, &a);
  int failed = 0;
  for (ReduceOp op : kAllReduceOps) {
    ReduceFn fn = reduce_function(dtype, op, isa);
    ASSERT_NE(fn, nullptr);
    for (size_t count : kCounts) {
      for (size_t offset : {0, 1}) {
        for (Alias alias : {Alias::kNone, Alias::kOutIsA, Alias::kOutIsB, Alias::kAll}) {
          std::string error = check_case(fn, dtype, op, a.data(), b.data(), count, offset, alias);
          if (error.empty()) continue;
          ADD_FAILURE() << reduce_isa_name(isa) << " " << error;
          if (++failed >= kMaxFailedCases) return;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, ReduceSweep, testing::ValuesIn(sweep_params()), sweep_name);

// ----- finish_avg's divide -----

// divide_function(dtype, isa) gives the reference's bytes (a division per element) for
// divisors that are powers of two (multiplied by their reciprocal) and others, 1 and
// divisors beyond what the narrow types hold included, over every count of the sweep,
// at an odd element offset too; nothing is written outside the buffer.
class DivideSweep : public testing::TestWithParam<SweepParam> {};

TEST_P(DivideSweep, MatchesReferenceBitwise) {
  auto [isa, dtype] = GetParam();
  if (!reduce_isa_supported(isa)) GTEST_SKIP() << reduce_isa_name(isa) << " is not supported here";
  std::mt19937_64 rng(static_cast<uint64_t>(dtype) * 7919 + 3);
  const std::vector<uint8_t> input = make_input(dtype, kMaxCount, rng, nullptr);
  const size_t size = dtype_size(dtype);
  DivideFn fn = divide_function(dtype, isa);
  ASSERT_NE(fn, nullptr);
  int failed = 0;
  for (int divisor : {1, 2, 3, 4, 5, 7, 8, 64, 100, 128, 255, 256, 1000, 4096, 16777217, 1 << 30}) {
    for (size_t count : kCounts) {
      for (size_t offset : {0, 1}) {
        std::vector<uint8_t> expected(input.begin(), input.begin() + static_cast<ptrdiff_t>(count * size));
        reference_divide_function(dtype)(expected.data(), count, divisor);
        GuardedBuffer buf(count * size, offset * size);
        std::memcpy(buf.data(), input.data(), count * size);
        fn(buf.data(), count, divisor);
        std::string error;
        if (!buf.guards_intact()) error = "wrote outside its buffer";
        for (size_t i = 0; i < count && error.empty(); ++i) {
          if (std::memcmp(buf.data() + i * size, expected.data() + i * size, size) != 0) {
            error = "element " + std::to_string(i) + ": " + hex(input.data() + i * size, size) + " / " +
                    std::to_string(divisor) + " = " + hex(expected.data() + i * size, size) +
                    " in the reference, " + hex(buf.data() + i * size, size);
          }
        }
        if (error.empty()) continue;
        ADD_FAILURE() << reduce_isa_name(isa) << " " << dtype_name(dtype) << " count " << count << " offset "
                      << offset << ": " << error;
        if (++failed >= kMaxFailedCases) return;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, DivideSweep, testing::ValuesIn(sweep_params()), sweep_name);

// ----- many sources in one pass -----

// reduce_many_function(dtype, op, isa) over k sources gives the bytes of the reference
// applied k - 1 times, source after source (out = s0 op s1, then out = out op s_j), for
// k from 2 to 9 and 17, every count of the sweep, an odd element offset, and with `out`
// being s0 or s1 (the aliasing it allows); nothing is written outside `out`.
class ReduceManySweep : public testing::TestWithParam<SweepParam> {};

TEST_P(ReduceManySweep, MatchesReferenceSourceAfterSource) {
  auto [isa, dtype] = GetParam();
  if (!reduce_isa_supported(isa)) GTEST_SKIP() << reduce_isa_name(isa) << " is not supported here";
  const size_t size = dtype_size(dtype);
  constexpr int kMaxSources = 17;
  std::mt19937_64 rng(static_cast<uint64_t>(dtype) * 7919 + 3);
  // Each source near the one before, so that sums and products round.
  std::vector<std::vector<uint8_t>> inputs;
  for (int j = 0; j < kMaxSources; ++j) {
    inputs.push_back(make_input(dtype, kMaxCount, rng, j == 0 ? nullptr : &inputs.back()));
  }
  int failed = 0;
  for (ReduceOp op : kAllReduceOps) {
    ReduceManyFn many = reduce_many_function(dtype, op, isa);
    ReduceFn ref = reference_reduce_function(dtype, op);
    ASSERT_NE(many, nullptr);
    for (int k : {2, 3, 4, 5, 6, 7, 8, 9, kMaxSources}) {
      for (size_t count : kCounts) {
        const size_t bytes = count * size;
        std::vector<uint8_t> expected(bytes + 1);
        ref(expected.data(), inputs[0].data(), inputs[1].data(), count);
        for (int j = 2; j < k; ++j) ref(expected.data(), expected.data(), inputs[j].data(), count);
        for (int alias : {-1, 0, 1}) {  // out separate, out == s0, out == s1
          const size_t offset = count % 2 == 1 ? size : 0;
          std::vector<GuardedBuffer> sources;
          sources.reserve(k);
          for (int j = 0; j < k; ++j) {
            sources.emplace_back(bytes, offset);
            std::memcpy(sources.back().data(), inputs[j].data(), bytes);
          }
          GuardedBuffer separate(bytes, offset);
          uint8_t* out = alias < 0 ? separate.data() : sources[alias].data();
          std::vector<const void*> src;
          for (auto& b : sources) src.push_back(b.data());
          many(out, src.data(), k, count);
          std::string where = std::string(reduce_isa_name(isa)) + " " + dtype_name(dtype) + " " +
                              op_name(op) + ", " + std::to_string(k) + " sources, count " +
                              std::to_string(count) +
                              (alias < 0 ? "" : ", out == s" + std::to_string(alias)) + ": ";
          bool intact = separate.guards_intact();
          for (auto& b : sources) intact = intact && b.guards_intact();
          size_t i = 0;
          while (i < count && std::memcmp(out + i * size, expected.data() + i * size, size) == 0) ++i;
          if (intact && i == count) continue;
          ADD_FAILURE() << where
                        << (!intact ? std::string("wrote outside its output")
                                    : "element " + std::to_string(i) + " is " +
                                          hex(out + i * size, size) + ", the reference gives " +
                                          hex(expected.data() + i * size, size));
          if (++failed >= kMaxFailedCases) return;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, ReduceManySweep, testing::ValuesIn(sweep_params()), sweep_name);

// ----- f16 and bf16: every value -----

class ReduceAllHalves : public testing::TestWithParam<ReduceIsa> {};

// Every 16-bit pattern as `a`, against each special value and against a shuffled copy
// of all patterns as `b`, and with the roles swapped.
TEST_P(ReduceAllHalves, EveryValueMatchesReference) {
  ReduceIsa isa = GetParam();
  if (!reduce_isa_supported(isa)) GTEST_SKIP() << reduce_isa_name(isa) << " is not supported here";
  std::vector<uint16_t> all(65536);
  std::iota(all.begin(), all.end(), 0);
  std::vector<uint16_t> shuffled = all;
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937_64(7));
  std::vector<uint16_t> expected(all.size()), got(all.size());
  for (DataType dtype : {DataType::kFloat16, DataType::kBFloat16}) {
    std::vector<std::vector<uint16_t>> partners = {shuffled};
    for (uint64_t v : special_values(dtype)) {
      partners.emplace_back(all.size(), static_cast<uint16_t>(v));
    }
    for (ReduceOp op : kAllReduceOps) {
      ReduceFn fn = reduce_function(dtype, op, isa);
      ReduceFn ref = reference_reduce_function(dtype, op);
      for (const auto& partner : partners) {
        for (bool swap : {false, true}) {
          const uint16_t* x = swap ? partner.data() : all.data();
          const uint16_t* y = swap ? all.data() : partner.data();
          ref(expected.data(), x, y, all.size());
          fn(got.data(), x, y, all.size());
          size_t i = 0;
          while (i < all.size() && expected[i] == got[i]) ++i;
          ASSERT_EQ(i, all.size())
              << reduce_isa_name(isa) << " " << dtype_name(dtype) << " " << op_name(op) << ": "
              << hex(reinterpret_cast<const uint8_t*>(x + i), 2) << ", "
              << hex(reinterpret_cast<const uint8_t*>(y + i), 2) << " gives "
              << hex(reinterpret_cast<const uint8_t*>(&got[i]), 2) << ", the reference "
              << hex(reinterpret_cast<const uint8_t*>(&expected[i]), 2);
        }
      }
    }
  }
}

std::string isa_name(const testing::TestParamInfo<ReduceIsa>& info) {
  return reduce_isa_name(info.param);
}

INSTANTIATE_TEST_SUITE_P(Kernels, ReduceAllHalves, testing::ValuesIn(kAllReduceIsas), isa_name);

// ----- the portable conversions -----

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(ReducePortableConversions, HalfToFloatMatchesOnEveryHalf) {
  for (uint32_t h = 0; h < 65536; ++h) {
    auto v = static_cast<uint16_t>(h);
    ASSERT_EQ(bits_of(reduce::portable_half_to_float(v)), bits_of(half_to_float(v)))
        << "half 0x" << std::hex << h;
  }
}

// "" when float x converts to f16 and bf16 alike both ways, for both signs.
std::string float_conversion_mismatch(uint32_t x) {
  for (uint32_t bits : {x, x | 0x80000000u}) {
    float f = float_of(bits);
    uint16_t half = reduce::portable_float_to_half(f);
    uint16_t bf16 = reduce::portable_float_to_bfloat16(f);
    if (half != float_to_half(f) || bf16 != float_to_bfloat16(f)) {
      char text[96];
      std::snprintf(text, sizeof text,
                    "float 0x%08x: f16 0x%04x (want 0x%04x), bf16 0x%04x (want 0x%04x)", bits,
                    half, float_to_half(f), bf16, float_to_bfloat16(f));
      return text;
    }
  }
  return "";
}

// Every float whose f16 is subnormal or the smallest normal (rounded by a float
// addition in the portable path, by integers in float_to_half), and a sweep of all
// the others.
TEST(ReducePortableConversions, FloatToHalfAndBFloat16Match) {
  std::vector<uint32_t> floats;
  for (uint32_t x : {0x7f800000u, 0x7f800001u, 0x7fffffffu, 0x7fc00000u, 0x477fefffu, 0x477ff000u,
                     0x477fe000u, 0x38800000u, 0x387fffffu, 0x3f808000u, 0x3f818000u}) {
    floats.push_back(x);
  }
  for (uint64_t x = 0; x <= 0x7fffffff; x += 997) floats.push_back(static_cast<uint32_t>(x));
  for (uint32_t x : floats) ASSERT_EQ(float_conversion_mismatch(x), "");
  for (uint32_t x = 0x33000000 - 16; x < 0x38800000 + 16; ++x) {
    // A plain comparison first: this loop runs 92 million times.
    float f = float_of(x);
    if (reduce::portable_float_to_half(f) == float_to_half(f) &&
        reduce::portable_float_to_half(-f) == float_to_half(-f)) {
      continue;
    }
    ASSERT_EQ(float_conversion_mismatch(x), "");
  }
}

// ----- the reference itself -----

template <class T>
T reduce_one(DataType dtype, ReduceOp op, T a, T b) {
  T out;
  reference_reduce_function(dtype, op)(&out, &a, &b, 1);
  return out;
}

TEST(ReduceReference, KeepsTheDocumentedSemantics) {
  // Integers wrap around.
  EXPECT_EQ(reduce_one<int8_t>(DataType::kInt8, ReduceOp::kSum, 127, 1), -128);
  EXPECT_EQ(reduce_one<int8_t>(DataType::kInt8, ReduceOp::kProd, -128, -1), -128);
  EXPECT_EQ(reduce_one<uint8_t>(DataType::kUInt8, ReduceOp::kProd, 16, 17), 16);
  EXPECT_EQ(reduce_one<int32_t>(DataType::kInt32, ReduceOp::kSum, INT32_MAX, 1), INT32_MIN);
  EXPECT_EQ(reduce_one<int64_t>(DataType::kInt64, ReduceOp::kProd, INT64_MIN, -1), INT64_MIN);
  // Min and max keep `a` for a NaN on either side and for +0 against -0.
  float nan = std::nanf("");
  EXPECT_TRUE(std::isnan(reduce_one<float>(DataType::kFloat32, ReduceOp::kMin, nan, 1.0f)));
  EXPECT_EQ(reduce_one<float>(DataType::kFloat32, ReduceOp::kMin, 1.0f, nan), 1.0f);
  EXPECT_EQ(reduce_one<float>(DataType::kFloat32, ReduceOp::kMax, 1.0f, nan), 1.0f);
  EXPECT_FALSE(std::signbit(reduce_one<float>(DataType::kFloat32, ReduceOp::kMin, 0.0f, -0.0f)));
  EXPECT_TRUE(std::signbit(reduce_one<float>(DataType::kFloat32, ReduceOp::kMax, -0.0f, 0.0f)));
  // f16: 1 + 2^-11 is a tie, rounded to even (1); a signaling NaN comes back quiet.
  EXPECT_EQ(reduce_one<uint16_t>(DataType::kFloat16, ReduceOp::kSum, 0x3c00, 0x1000), 0x3c00);
  EXPECT_EQ(reduce_one<uint16_t>(DataType::kFloat16, ReduceOp::kMax, 0x7d00, 0x3c00), 0x7f00);
  // bf16: a signaling NaN comes back quiet.
  EXPECT_EQ(reduce_one<uint16_t>(DataType::kBFloat16, ReduceOp::kMin, 0x7f81, 0x3f80), 0x7fc1);
  // Two NaNs: the sum keeps b's payload for f32, f64 and bf16, a's for f16 (quieted).
  EXPECT_EQ(reduce_one<uint32_t>(DataType::kFloat32, ReduceOp::kSum, 0x7fc00001, 0xff800002),
            0xffc00002u);
  EXPECT_EQ(reduce_one<uint64_t>(DataType::kFloat64, ReduceOp::kProd, 0x7ff8000000000001,
                                 0xfff0000000000002),
            0xfff8000000000002u);
  EXPECT_EQ(reduce_one<uint16_t>(DataType::kBFloat16, ReduceOp::kSum, 0x7fc1, 0xff82), 0xffc2);
  EXPECT_EQ(reduce_one<uint16_t>(DataType::kFloat16, ReduceOp::kSum, 0x7c01, 0xfe02), 0x7e01);
}

// ----- choosing the instruction set -----

ReduceIsa best_supported() {
  ReduceIsa best = ReduceIsa::kPortable;
  for (ReduceIsa isa : kAllReduceIsas) {
    if (reduce_isa_supported(isa)) best = isa;
  }
  return best;
}

// The reference divides element by element: truncation toward zero for integers, also
// by divisors a narrow type cannot hold; one rounding of the float quotient for f16.
TEST(ReduceReference, DividesAsTheDocumentedSemantics) {
  auto divide = [](DataType dtype, auto value, int divisor) {
    reference_divide_function(dtype)(&value, 1, divisor);
    return value;
  };
  EXPECT_EQ(divide(DataType::kFloat32, 3.0f, 2), 1.5f);
  EXPECT_EQ(divide(DataType::kFloat32, 1.0f, 3), 1.0f / 3.0f);
  EXPECT_EQ(divide(DataType::kFloat64, 1.0, 3), 1.0 / 3.0);
  EXPECT_EQ(bits_of(divide(DataType::kFloat32, -0.0f, 4)), 0x80000000u);
  EXPECT_EQ(bits_of(divide(DataType::kFloat32, float_of(0x7fa00001), 2)), 0x7fe00001u);  // quieted
  EXPECT_EQ(bits_of(divide(DataType::kFloat32, float_of(0x00000003), 2)), 0x00000002u);  // to even
  EXPECT_EQ(divide(DataType::kInt8, int8_t{-7}, 2), int8_t{-3});
  EXPECT_EQ(divide(DataType::kInt8, int8_t{127}, 200), int8_t{0});
  EXPECT_EQ(divide(DataType::kUInt8, uint8_t{255}, 256), uint8_t{0});
  EXPECT_EQ(divide(DataType::kInt64, int64_t{-9}, 4), int64_t{-2});
  EXPECT_EQ(divide(DataType::kFloat16, uint16_t{0x3c00}, 3), float_to_half(1.0f / 3.0f));  // 1.0
}

TEST(ReduceIsaChoice, ResolvesNamesAndFallsBack) {
  EXPECT_TRUE(reduce_isa_supported(ReduceIsa::kPortable));
  EXPECT_EQ(resolve_reduce_isa("auto"), best_supported());
  // A name that is no instruction set is the caller's error (issue 21), not a fallback.
  EXPECT_THROW(resolve_reduce_isa("not-an-isa"), ConfigError);
  for (ReduceIsa isa : kAllReduceIsas) {
    ReduceIsa got = resolve_reduce_isa(reduce_isa_name(isa));
    EXPECT_EQ(got, reduce_isa_supported(isa) ? isa : best_supported()) << reduce_isa_name(isa);
  }
  std::printf("reduction kernels on this CPU: %s (best supported: %s)\n",
              reduce_isa_name(reduce_isa()), reduce_isa_name(best_supported()));
}

TEST(ReduceIsaChoice, DefaultKernelsAreTheChosenIsas) {
  for (DataType dtype : kAllDataTypes) {
    for (ReduceOp op : kAllReduceOps) {
      EXPECT_EQ(reduce_function(dtype, op), reduce_function(dtype, op, reduce_isa()));
    }
  }
}

TEST(ReduceIsaChoice, UnsupportedIsaIsAnError) {
  for (ReduceIsa isa : kAllReduceIsas) {
    if (reduce_isa_supported(isa)) continue;
    EXPECT_THROW(reduce_function(DataType::kFloat32, ReduceOp::kSum, isa), InvalidArgumentError);
  }
}

}  // namespace
}  // namespace chorus
