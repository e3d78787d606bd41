// The FP8 cast on CUDA (CUDA's own __nv_cvt_float_to_fp8, saturating) against its CPU twin
// (core/fp8.h's encoding) on fresh random inputs spread over every binade of both formats, with
// zeros, subnormals, halfway points, values past the largest and non-finite ones: the same bytes,
// bit for bit, and the same amax, for f32, bf16 and f16 inputs and both formats.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/fp8_cast.h"
#include "core/ops.h"
#include "tests/gpu_test_util.h"

namespace kiln {
namespace {

using testing::fresh_seed;
using testing::kGpu;

std::vector<float> fp8_test_values(std::uint64_t seed) {
  Tensor u = Tensor::empty({1 << 16}, DType::F32);
  ops::fill_uniform(u, 0.0, 1.0, seed);
  std::vector<float> v;
  const float* p = u.data<float>();
  for (int i = 0; i < (1 << 16); i += 2) {  // magnitudes 2^-24 .. 2^18, random mantissas, signs
    const float mag = std::ldexp(1.0f + p[i], static_cast<int>(p[i + 1] * 42.0f) - 24);
    v.push_back((i / 2) % 2 ? -mag : mag);
  }
  for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    for (int b = 0; b < 255; ++b) {  // every code and the halfway point above it
      const float lo = fp8_decode(static_cast<std::uint8_t>(b), f);
      const float hi = fp8_decode(static_cast<std::uint8_t>(b + 1), f);
      if (!std::isfinite(lo)) continue;
      v.push_back(lo);
      if (std::isfinite(hi) && ((b ^ (b + 1)) & 0x80) == 0) v.push_back((lo + hi) / 2);
    }
  }
  for (float s :
       {0.0f, -0.0f, 1e-30f, 448.0f, 464.0f, 500.0f, 57344.0f, 61440.0f, 1e9f, INFINITY, -INFINITY})
    v.push_back(s);
  return v;
}

TEST(Fp8CastGpu, SameBytesAndAmaxAsTheCpuTwin) {
  const std::vector<float> values = fp8_test_values(fresh_seed());
  const std::int64_t n = static_cast<std::int64_t>(values.size());
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
      for (float scale : {1.0f, 0.37f, 1024.0f}) {
        const Tensor x = Tensor::from_vector<float>(values, {n}).to(dtype);
        Tensor want = Tensor::empty({n}, DType::U8), want_amax = Tensor::empty({1}, DType::F32);
        fp8_cast(x, scale, f, want, want_amax);
        const Tensor xg = x.to(kGpu);
        Tensor got = Tensor::full({n}, 0xAB, DType::U8, kGpu);
        Tensor got_amax = Tensor::full({1}, -1.0, DType::F32, kGpu);
        fp8_cast(xg, scale, f, got, got_amax);
        const Tensor g = got.to(Device::cpu());
        std::int64_t differ = 0, first = -1;
        for (std::int64_t i = 0; i < n; ++i) {
          if (g.data<std::uint8_t>()[i] != want.data<std::uint8_t>()[i]) {
            if (first < 0) first = i;
            ++differ;
          }
        }
        EXPECT_EQ(differ, 0) << dtype_name(dtype) << " format " << static_cast<int>(f) << " scale "
                             << scale << ": first at value "
                             << (first >= 0 ? values[static_cast<std::size_t>(first)] : 0.0f)
                             << " gpu " << (first >= 0 ? int(g.data<std::uint8_t>()[first]) : 0)
                             << " cpu " << (first >= 0 ? int(want.data<std::uint8_t>()[first]) : 0);
        const float a = static_cast<float>(got_amax.to(Device::cpu()).item());
        const float b = static_cast<float>(want_amax.item());
        EXPECT_EQ(std::memcmp(&a, &b, sizeof(a)), 0) << a << " against " << b;
        EXPECT_EQ(b, INFINITY);  // the inputs hold infinities
      }
    }
  }
  // Finite inputs only (the random ones): the largest magnitude itself.
  const std::vector<float> finite(values.begin(), values.begin() + (1 << 15));
  const Tensor x = Tensor::from_vector<float>(finite, {1 << 15});
  Tensor bytes = Tensor::empty({1 << 15}, DType::U8), want = Tensor::empty({1}, DType::F32);
  fp8_cast(x, 1.0f, Fp8Format::E4M3, bytes, want);
  Tensor got_bytes = Tensor::empty({1 << 15}, DType::U8, kGpu);
  Tensor got = Tensor::empty({1}, DType::F32, kGpu);
  fp8_cast(x.to(kGpu), 1.0f, Fp8Format::E4M3, got_bytes, got);
  EXPECT_EQ(got.to(Device::cpu()).item(), want.item());
  EXPECT_GT(want.item(), 1e5);
}

}  // namespace
}  // namespace kiln
