// The FP8 formats (core/fp8.h) and the cast's CPU twin (core/fp8_cast.h): every code decodes and
// encodes back to itself, round to nearest even at the halfway points, subnormals, saturation of
// large magnitudes and infinities, NaN kept, the scale TE's recipe gives, and the cast's bytes and
// amax (infinity above every finite value, NaN above infinity).

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/fp8.h"
#include "core/fp8_cast.h"

namespace kiln {
namespace {

TEST(Fp8, EveryCodeRoundTrips) {
  for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    int finite = 0;
    for (int b = 0; b < 256; ++b) {
      const float v = fp8_decode(static_cast<std::uint8_t>(b), f);
      if (std::isnan(v)) continue;
      if (std::isinf(v)) {
        EXPECT_EQ(f, Fp8Format::E5M2) << b;
        continue;
      }
      ++finite;
      const std::uint8_t back = fp8_encode(v, f);
      // +0 and -0 keep their signs; every finite code is its own encoding.
      EXPECT_EQ(back, b) << "format " << static_cast<int>(f) << " code " << b << " value " << v;
    }
    EXPECT_EQ(finite, f == Fp8Format::E4M3 ? 254 : 248);
  }
}

TEST(Fp8, KnownValuesRoundingAndSaturation) {
  const Fp8Format e4 = Fp8Format::E4M3, e5 = Fp8Format::E5M2;
  EXPECT_EQ(fp8_encode(1.0f, e4), 0x38);
  EXPECT_EQ(fp8_encode(-2.0f, e4), 0xC0);
  EXPECT_EQ(fp8_encode(448.0f, e4), 0x7E);
  EXPECT_EQ(fp8_encode(1e6f, e4), 0x7E);  // saturates
  EXPECT_EQ(fp8_encode(-std::numeric_limits<float>::infinity(), e4), 0xFE);
  EXPECT_EQ(fp8_encode(std::numeric_limits<float>::quiet_NaN(), e4), 0x7F);
  EXPECT_EQ(fp8_encode(464.0f, e4), 0x7E);  // halfway to the NaN pattern's 480: the largest
  // Ties to even: 1 + 1/16 is halfway between 1 (mantissa 000) and 1.125 (001).
  EXPECT_EQ(fp8_encode(1.0625f, e4), 0x38);
  EXPECT_EQ(fp8_encode(1.1875f, e4), 0x3A);  // halfway between 1.125 (001) and 1.25 (010)
  EXPECT_EQ(fp8_encode(1.07f, e4), 0x39);    // past halfway
  // Subnormals: steps of 2^-9 in E4M3; half a step rounds to zero (even), 1.5 steps to 2.
  EXPECT_EQ(fp8_encode(std::ldexp(1.0f, -9), e4), 0x01);
  EXPECT_EQ(fp8_encode(std::ldexp(1.0f, -10), e4), 0x00);
  EXPECT_EQ(fp8_encode(3 * std::ldexp(1.0f, -10), e4), 0x02);
  EXPECT_EQ(fp8_encode(7.5f * std::ldexp(1.0f, -9), e4), 0x08);  // rounds up into the normals
  EXPECT_EQ(fp8_encode(1e-30f, e4), 0x00);
  EXPECT_EQ(fp8_encode(1.0f, e5), 0x3C);
  EXPECT_EQ(fp8_encode(57344.0f, e5), 0x7B);
  EXPECT_EQ(fp8_encode(61440.0f, e5), 0x7B);  // halfway to infinity: saturates
  EXPECT_EQ(fp8_encode(std::numeric_limits<float>::infinity(), e5), 0x7B);
  EXPECT_EQ(fp8_encode(std::ldexp(1.0f, -16), e5), 0x01);
  EXPECT_EQ(fp8_decode(0x7C, e5), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(fp8_decode(0x7F, e4)));
  EXPECT_EQ(fp8_decode(0x7E, e4), 448.0f);
}

// Every float between two neighbouring codes rounds to the nearer one (the even one at the tie).
TEST(Fp8, EncodingIsRoundToNearestEverywhere) {
  for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    for (int b = 0; b < fp8_max_code(f); ++b) {
      const float lo = fp8_decode(static_cast<std::uint8_t>(b), f);
      const float hi = fp8_decode(static_cast<std::uint8_t>(b + 1), f);
      for (int k = 1; k < 16; ++k) {
        const float v = lo + (hi - lo) * static_cast<float>(k) / 16.0f;
        const int want = k < 8 ? b : k > 8 ? b + 1 : (b % 2 == 0 ? b : b + 1);
        ASSERT_EQ(fp8_encode(v, f), want) << "format " << static_cast<int>(f) << " v " << v;
      }
    }
  }
}

TEST(Fp8, TransformerEngineScale) {
  EXPECT_EQ(fp8_scale_for(2.0f, Fp8Format::E4M3, 0.0f, 1.0f), 224.0f);
  EXPECT_EQ(fp8_scale_for(2.0f, Fp8Format::E4M3, 1.0f, 1.0f), 112.0f);
  EXPECT_EQ(fp8_scale_for(0.0f, Fp8Format::E4M3, 0.0f, 3.0f), 3.0f);
  EXPECT_EQ(fp8_scale_for(INFINITY, Fp8Format::E5M2, 0.0f, 3.0f), 3.0f);
  EXPECT_EQ(fp8_scale_for(NAN, Fp8Format::E5M2, 0.0f, 3.0f), 3.0f);
  EXPECT_EQ(fp8_scale_for(1e-40f, Fp8Format::E5M2, 0.0f, 3.0f), 3.0f);  // the scale would overflow
}

TEST(Fp8Cast, BytesAndAmaxOnTheCpu) {
  const std::vector<float> v = {0.5f, -3.0f, 1e-3f, 100.0f, -0.0f};
  Tensor x = Tensor::from_vector<float>(v, {5});
  Tensor out = Tensor::empty({5}, DType::U8), amax = Tensor::empty({1}, DType::F32);
  fp8_cast(x, 4.0f, Fp8Format::E4M3, out, amax);
  EXPECT_EQ(amax.item(), 100.0);
  for (std::size_t i = 0; i < v.size(); ++i)
    EXPECT_EQ(out.data<std::uint8_t>()[i], fp8_encode(v[i] * 4.0f, Fp8Format::E4M3)) << i;
  EXPECT_EQ(out.data<std::uint8_t>()[3], 0x7C);  // 400: halfway between 384 and 416, to even 384
  Tensor back = Tensor::empty({5}, DType::F32);
  fp8_dequantize(out, 4.0f, Fp8Format::E4M3, back);
  EXPECT_EQ(back.data<float>()[0], 0.5f);
  EXPECT_EQ(back.data<float>()[1], -3.0f);
  // Infinity above every finite value, NaN above infinity, in bf16 too.
  x = Tensor::from_vector<float>({1.0f, INFINITY, -2.0f}, {3}).to(DType::BF16);
  out = Tensor::empty({3}, DType::U8);
  fp8_cast(x, 1.0f, Fp8Format::E5M2, out, amax);
  EXPECT_EQ(amax.item(), INFINITY);
  x = Tensor::from_vector<float>({NAN, INFINITY}, {2});
  out = Tensor::empty({2}, DType::U8);
  fp8_cast(x, 1.0f, Fp8Format::E5M2, out, amax);
  EXPECT_TRUE(std::isnan(amax.item()));
}

}  // namespace
}  // namespace kiln
