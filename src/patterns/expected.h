// Closed-form inputs and expected results for the collective sweeps of the tests and
// for chorus-bench's check (library chorus_patterns; tests include it as
// util/expected.h). Not part of chorus's API: for its own tests and benchmarks.
//
// No expectation is computed by running chorus: every input is a formula of
// (dtype, op, rank, element index), and every expected value is the same formula
// reduced over the ranks by plain C++ arithmetic here.
//
// Inputs are small integers chosen so that every result is exact in every type:
//   * sum/min/max/avg: element i of rank r is  b(r, i) + h(i) * scale(dtype)  where
//       b(r, i) = ±(1 + (i + 3r) % 7)  (negative when i % 3 == 2, for signed types)
//       h(i)    = (i / 21) % H(dtype)  the same on every rank (spreads values over
//                                      the range of the type, and catches shifted
//                                      or misplaced blocks)
//     H and scale keep the largest sum of 8 ranks exact: |sum| <= 127 for i8, 255 for
//     u8, 256 for bf16 (8 significant bits), 2048 for f16, 2^53 for f64 and i64
//     (whose scale of 2^33 / 2^30 also exercises the high bits).
//   * prod: element i of rank r is 2 when (i + r) % 5 == 0, else 1, negated when
//     (i + 2r) % 3 == 0 for signed types; at most two ranks of 8 hold a 2, so
//     |product| <= 4.
//   * avg divides the exact sum by the world size: integer types truncate toward zero
//     (the pattern produces negative sums, so floor-vs-trunc is caught); floating types
//     must be exact when the division is exact and within one unit in the last place
//     of the type otherwise (relative 2^-23 f32, 2^-52 f64, 2^-10 f16, 2^-7 bf16),
//     because the library may round the f32 quotient before rounding to f16/bf16.
// Data-movement collectives use move_value(), which identifies (rank, index) as far
// as the type's exact integer range allows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "chorus/types.h"

namespace chorus::patterns {

// IEEE binary16 and bfloat16 <-> float, round to nearest even (NaN stays NaN).
uint16_t float_to_half_bits(float value);
float half_bits_to_float(uint16_t bits);
uint16_t float_to_bf16_bits(float value);
float bf16_bits_to_float(uint16_t bits);

bool is_floating(DataType dtype);
bool is_signed(DataType dtype);

// Element `index` of a buffer of `dtype`, through double (exact for every value used
// by these tests). store_element rounds to nearest (even) for f16/bf16.
double load_element(DataType dtype, const void* buf, size_t index);
void store_element(DataType dtype, void* buf, size_t index, double value);

// ----- reductions -----

// Input of `rank` at (global) element index `index` for `op`.
double reduce_input(DataType dtype, ReduceOp op, int rank, size_t index);
// buf[k] = reduce_input(dtype, op, rank, first + k) for k < n.
void fill_reduce_input(DataType dtype, ReduceOp op, int rank, void* buf, size_t first, size_t n);
// "" when buf[k] == reduce_input(dtype, op, rank, first + k) for every k < n, else a
// description of the first mismatches (used to check that send buffers stay intact).
std::string check_reduce_input(DataType dtype, ReduceOp op, int rank, const void* buf,
                               size_t first, size_t n);

// The result of `op` over ranks 0..size-1 of reduce_input().
class ReduceExpectation {
 public:
  ReduceExpectation(DataType dtype, ReduceOp op, int size);

  // The exact mathematical result at global index `index` (before rounding to dtype).
  double exact(size_t index) const;
  // "" when buf[k] matches the result at global index first + k for every k < n, else a
  // description of the mismatches (count, first few with expected and seen values).
  std::string check(const void* buf, size_t first, size_t n) const;
  // chorus-bench's check, for worlds of any size: how many of buf[k] (global index
  // first + k, k < n) differ from the result as the library leaves it in dtype. Integer
  // sums and products wrap around in the type, as the library's do once a world's
  // results leave its range (beyond the 8 ranks kept exact above); a floating result
  // is the exact one rounded to the type, and may differ from it by rel_tolerance
  // times max(1, |result|) (the roundings of worlds whose sums the type cannot hold
  // exactly).
  size_t count_wrong(const void* buf, size_t first, size_t n, double rel_tolerance) const;

 private:
  DataType dtype_;
  ReduceOp op_;
  int size_;
  std::vector<double> table_;  // per index % period: sum/min/max/prod of the b() part
  std::vector<uint64_t> wrapped_;  // the same in integer arithmetic modulo 2^64
};

// ----- data movement -----

// A value that identifies (rank, index) within the exact integer range of dtype.
double move_value(DataType dtype, int rank, size_t index);
void fill_move(DataType dtype, int rank, void* buf, size_t first, size_t n);
// "" when buf[k] == move_value(dtype, rank, first + k) for every k < n.
std::string check_move(DataType dtype, int rank, const void* buf, size_t first, size_t n);
// The number of k < n with buf[k] != move_value(dtype, rank, first + k).
size_t count_wrong_move(DataType dtype, int rank, const void* buf, size_t first, size_t n);

// ----- raw bytes -----

inline constexpr uint8_t kSentinelByte = 0xA5;
// "" when every one of `bytes` bytes is kSentinelByte, else where the first change is.
std::string check_sentinel(const void* buf, size_t bytes);
// A 64-bit hash of the bytes (for comparing results across ranks).
uint64_t checksum(const void* buf, size_t bytes);

}  // namespace chorus::patterns
