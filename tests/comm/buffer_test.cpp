#include "comm_backends/buffer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "comm_backends/reduction.h"
#include "common/errors.h"

namespace partrain::comm {
namespace {

TEST(Buffer, DtypeNamesRoundTrip) {
  for (DType t : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64}) {
    EXPECT_EQ(parse_dtype(dtype_name(t)), t);
  }
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::i64), 8u);
  EXPECT_THROW(parse_dtype("float"), UsageError);
  EXPECT_EQ(parse_reduce_op("avg"), ReduceOp::avg);
  EXPECT_THROW(parse_reduce_op("prod"), UsageError);
  Buffer b;
  b.count = 10;
  b.dtype = DType::f16;
  EXPECT_EQ(b.bytes(), 20u);
}

TEST(Buffer, HalfConversionMatchesKnownBits) {
  EXPECT_EQ(float_to_half(1.0f), 0x3c00);
  EXPECT_EQ(float_to_half(-2.0f), 0xc000);
  EXPECT_EQ(float_to_half(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_half(1e6f), 0x7c00);                    // overflow to inf
  EXPECT_EQ(float_to_half(5.9604644775390625e-8f), 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_half(1.0f + 1.0f / 2048), 0x3c00);      // tie rounds to even
  EXPECT_EQ(float_to_half(1.0f + 3.0f / 2048), 0x3c02);
  EXPECT_TRUE(std::isnan(half_to_float(float_to_half(std::nanf("")))));
  for (std::uint32_t bits = 0; bits < 0x7c00; bits += 7) {  // every finite class round-trips
    const auto h = static_cast<std::uint16_t>(bits);
    EXPECT_EQ(float_to_half(half_to_float(h)), h) << bits;
  }
}

TEST(Buffer, Bf16ConversionRoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
  EXPECT_EQ(float_to_bf16(1.0f + 1.0f / 256), 0x3f80);  // tie, even stays
  EXPECT_EQ(float_to_bf16(1.0f + 3.0f / 256), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(bf16_to_float(float_to_bf16(3.140625f)), 3.140625f);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
}

TEST(Buffer, ConvertElementsBetweenFloatTypes) {
  const float in[4] = {0.5f, -1.25f, 3.0f, 1024.0f};
  std::uint16_t half[4];
  double wide[4];
  float back[4];
  convert_elements(in, DType::f32, half, DType::f16, 4);
  convert_elements(half, DType::f16, wide, DType::f64, 4);
  convert_elements(wide, DType::f64, back, DType::f32, 4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(back[i], in[i]);
  std::int32_t ints[2] = {1, 2};
  EXPECT_THROW(convert_elements(ints, DType::i32, back, DType::f32, 2), UsageError);
}

TEST(Reduction, AccumulatesNarrowInputInF32) {
  float acc[3] = {1.0f, 5.0f, -2.0f};
  std::uint16_t in[3] = {float_to_bf16(2.0f), float_to_bf16(-1.0f), float_to_bf16(4.0f)};
  reduce_into(acc, DType::f32, in, DType::bf16, 3, ReduceOp::sum);
  EXPECT_EQ(acc[0], 3.0f);
  EXPECT_EQ(acc[1], 4.0f);
  EXPECT_EQ(acc[2], 2.0f);
  reduce_into(acc, DType::f32, in, DType::bf16, 3, ReduceOp::max);
  EXPECT_EQ(acc[2], 4.0f);
  std::int64_t a[2] = {7, -3}, b[2] = {2, -9};
  reduce_into(a, DType::i64, b, DType::i64, 2, ReduceOp::min);
  EXPECT_EQ(a[0], 2);
  EXPECT_EQ(a[1], -9);
  divide_elements(a, DType::i64, 2, 2);
  EXPECT_EQ(a[0], 1);
  EXPECT_THROW(reduce_into(a, DType::i64, b, DType::i32, 2, ReduceOp::sum), UsageError);
}

// The shm backend chains reduce_pair() where the ring chains reduce_into(); the bits must agree
// where the order of the operands shows (a signed zero or a NaN under min and max), also when the
// result overwrites the second operand.
TEST(Reduction, PairHasReduceIntosBits) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float held[4] = {-0.0f, nan, 1.5f, 3.0f};
  const float into[4] = {0.0f, 2.0f, nan, 1.0f};
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::min, ReduceOp::max}) {
    float expected[4], out[4], aliased[4];
    std::memcpy(expected, held, sizeof held);
    reduce_into(expected, DType::f32, into, DType::f32, 4, op);
    reduce_pair(out, held, into, DType::f32, 4, op);
    std::memcpy(aliased, into, sizeof into);
    reduce_pair(aliased, held, aliased, DType::f32, 4, op);
    EXPECT_EQ(std::memcmp(out, expected, sizeof out), 0) << static_cast<int>(op);
    EXPECT_EQ(std::memcmp(aliased, expected, sizeof out), 0) << static_cast<int>(op);
  }
  std::int32_t a[2] = {7, -3}, b[2] = {2, -9}, c[2];
  reduce_pair(c, a, b, DType::i32, 2, ReduceOp::max);
  EXPECT_EQ(c[0], 7);
  EXPECT_EQ(c[1], -3);
  EXPECT_THROW(reduce_pair(c, a, b, DType::f16, 2, ReduceOp::sum), UsageError);
}

}  // namespace
}  // namespace partrain::comm
