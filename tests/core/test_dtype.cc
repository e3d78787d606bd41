#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/check.h"
#include "core/dtype.h"

namespace kiln {
namespace {

// Reference: round a float to the nearest representable half by exhaustive search of neighbours.
float reference_half_round(float f) {
  float lower = -std::numeric_limits<float>::infinity(), upper = lower;
  // All finite positive halves, scanned once.
  static std::vector<float> halves = [] {
    std::vector<float> v;
    for (std::uint32_t h = 0; h < 0x7c00u; ++h)
      v.push_back(half_bits_to_float(static_cast<std::uint16_t>(h)));
    return v;
  }();
  float a = std::fabs(f);
  auto it = std::lower_bound(halves.begin(), halves.end(), a);
  if (it == halves.end()) return std::copysign(a >= 65520.0f ? INFINITY : 65504.0f, f);
  upper = *it;
  lower = it == halves.begin() ? upper : *(it - 1);
  float chosen;
  if (a - lower < upper - a)
    chosen = lower;
  else if (upper - a < a - lower)
    chosen = upper;
  else
    chosen = ((float_to_half_bits(lower) & 1u) == 0) ? lower : upper;  // tie: even mantissa
  return std::copysign(chosen, f);
}

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::F32), 4u);
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_EQ(dtype_size(DType::I64), 8u);
  EXPECT_EQ(dtype_from_name("bf16"), DType::BF16);
  EXPECT_THROW(dtype_from_name("f8"), InputError);
}

// The name table serves both directions and the error's list of known names.
TEST(DType, EveryNameParsesBack) {
  for (DType t :
       {DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64, DType::U8}) {
    EXPECT_EQ(dtype_from_name(dtype_name(t)), t);
  }
  try {
    dtype_from_name("f8");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "unknown dtype 'f8' (known: f32, f64, f16, bf16, i32, i64, u8)");
  }
}

TEST(DType, HalfRoundTripIsExactForEveryHalf) {
  for (std::uint32_t h = 0; h < 0x10000u; ++h) {
    auto bits = static_cast<std::uint16_t>(h);
    float f = half_bits_to_float(bits);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(half_bits_to_float(float_to_half_bits(f))));
      continue;
    }
    ASSERT_EQ(float_to_half_bits(f), bits) << "half 0x" << std::hex << h;
  }
}

TEST(DType, HalfRoundsToNearestEven) {
  // Midpoints between neighbouring halves must go to the even one.
  EXPECT_EQ(float_to_half_bits(1.0f + 1.0f / 2048.0f), 0x3c00u);  // tie -> 1.0 (even)
  EXPECT_EQ(float_to_half_bits(1.0f + 3.0f / 2048.0f), 0x3c02u);  // tie -> even up
  EXPECT_EQ(float_to_half_bits(65504.0f), 0x7bffu);
  EXPECT_EQ(float_to_half_bits(65520.0f), 0x7c00u);  // rounds to inf
  EXPECT_EQ(float_to_half_bits(-0.0f), 0x8000u);
  EXPECT_EQ(float_to_half_bits(std::ldexp(1.0f, -25)), 0x0000u);  // tie below min subnormal
  EXPECT_EQ(float_to_half_bits(std::ldexp(1.5f, -25)), 0x0001u);
  std::uint32_t state = 12345;
  for (int i = 0; i < 20000; ++i) {
    state = state * 1664525u + 1013904223u;
    float f =
        std::ldexp(static_cast<float>(state % 100000) / 100000.0f + 0.5f, (int)(state >> 27) - 20);
    if (state & 1) f = -f;
    ASSERT_EQ(half_bits_to_float(float_to_half_bits(f)), reference_half_round(f)) << f;
  }
}

TEST(DType, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16_bits(1.0f), 0x3f80u);
  EXPECT_EQ(float_to_bf16_bits(bits_float(0x3f808000u)), 0x3f80u);  // tie -> even (down)
  EXPECT_EQ(float_to_bf16_bits(bits_float(0x3f818000u)), 0x3f82u);  // tie -> even (up)
  EXPECT_EQ(float_to_bf16_bits(bits_float(0x3f808001u)), 0x3f81u);  // above tie -> up
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(float_to_bf16_bits(NAN))));
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    float f = bf16_bits_to_float(static_cast<std::uint16_t>(b));
    if (!std::isnan(f)) {
      ASSERT_EQ(float_to_bf16_bits(f), b);
    }
  }
}

}  // namespace
}  // namespace kiln
