// chorus_patterns' counting check (chorus-bench's): results as the library leaves them
// in the element type count as right for worlds of any size, and every other value
// counts as wrong, once per element.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "util/expected.h"

namespace chorus {
namespace {

using test::ReduceExpectation;

// The sum over `size` ranks of reduce_input() in the arithmetic of T, which wraps.
template <class T>
std::vector<T> wrapped_sums(DataType dtype, int size, size_t n) {
  std::vector<T> out(n, 0);
  for (int r = 0; r < size; ++r)
    for (size_t i = 0; i < n; ++i)
      out[i] = static_cast<T>(out[i] + static_cast<int64_t>(test::reduce_input(dtype, ReduceOp::kSum, r, i)));
  return out;
}

// 12 ranks of i8: the sums leave [-128, 127] and wrap around; the check follows them.
TEST(PatternsTest, IntegerSumsOfLargeWorldsWrapAround) {
  const size_t n = 1000;
  std::vector<int8_t> sums = wrapped_sums<int8_t>(DataType::kInt8, 12, n);
  ReduceExpectation want(DataType::kInt8, ReduceOp::kSum, 12);
  EXPECT_EQ(want.count_wrong(sums.data(), 0, n, 0), 0u);
  size_t overflowed = 0;
  for (size_t i = 0; i < n; ++i) overflowed += want.exact(i) > 127 || want.exact(i) < -128;
  EXPECT_GT(overflowed, 0u);  // the world's sums did leave the type's range
  sums[7] = static_cast<int8_t>(sums[7] + 1);
  sums[900] = static_cast<int8_t>(sums[900] - 3);
  EXPECT_EQ(want.count_wrong(sums.data(), 0, n, 0), 2u);
}

// An offset buffer (reduce_scatter's block) is checked at its global indices.
TEST(PatternsTest, CountsAtGlobalIndices) {
  const size_t n = 600, first = 333;
  std::vector<int32_t> all = wrapped_sums<int32_t>(DataType::kInt32, 3, first + n);
  ReduceExpectation want(DataType::kInt32, ReduceOp::kSum, 3);
  EXPECT_EQ(want.count_wrong(all.data() + first, first, n, 0), 0u);
  EXPECT_EQ(want.count_wrong(all.data() + first, first + 1, n, 0), n);
}

// Floating results may differ from the exact one by the relative tolerance, no more.
TEST(PatternsTest, FloatingResultsWithinTheTolerance) {
  const size_t n = 100;
  ReduceExpectation want(DataType::kFloat32, ReduceOp::kSum, 4);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(want.exact(i));
  out[5] *= 1.0f + 1e-6f;
  EXPECT_EQ(want.count_wrong(out.data(), 0, n, 1e-5), 0u);
  EXPECT_EQ(want.count_wrong(out.data(), 0, n, 0), 1u);
  out[6] = -3;
  EXPECT_EQ(want.count_wrong(out.data(), 0, n, 1e-5), 1u);
}

TEST(PatternsTest, MovedValuesCountedExactly) {
  const size_t n = 5000;
  std::vector<uint16_t> buf(n);
  test::fill_move(DataType::kFloat16, 2, buf.data(), 10, n);
  EXPECT_EQ(test::count_wrong_move(DataType::kFloat16, 2, buf.data(), 10, n), 0u);
  EXPECT_EQ(test::check_move(DataType::kFloat16, 2, buf.data(), 10, n), "");
  buf[4321] ^= 1;
  EXPECT_EQ(test::count_wrong_move(DataType::kFloat16, 2, buf.data(), 10, n), 1u);
  EXPECT_EQ(test::count_wrong_move(DataType::kFloat16, 3, buf.data(), 10, n), n);
}

}  // namespace
}  // namespace chorus
