#include "core/fp8_cast.h"

#include <cstring>

#include "core/check.h"
#include "core/cpu/element.h"
#include "core/cuda/fp8_cast_cuda.h"
#include "core/dispatch.h"

namespace kiln {
namespace {

void check_cast(const Tensor& x, const Tensor& out, const Tensor& amax) {
  KILN_CHECK(x.is_contiguous() &&
                 (x.dtype() == DType::F32 || x.dtype() == DType::F16 || x.dtype() == DType::BF16),
             "fp8_cast: expected a contiguous f32, f16 or bf16 tensor, got " + x.str());
  KILN_CHECK(out.dtype() == DType::U8 && out.is_contiguous() && out.numel() == x.numel() &&
                 out.device() == x.device(),
             "fp8_cast: output " + out.str() + " for input " + x.str());
  KILN_CHECK(amax.dtype() == DType::F32 && amax.numel() == 1 && amax.device() == x.device(),
             "fp8_cast: amax " + amax.str() + " must be one f32 on " + x.device().str());
}

}  // namespace

void fp8_cast(const Tensor& x, float scale, Fp8Format format, Tensor& out, Tensor& amax) {
  check_cast(x, out, amax);
  if (x.device().is_cuda()) {
    DeviceGuard guard(x.device());
    cuda::fp8_cast(x, scale, format, out, amax);
    return;
  }
  std::uint8_t* bytes = out.data<std::uint8_t>();
  std::uint32_t largest = 0;  // |x|'s bits: their integer order is the magnitudes' (NaN on top)
  KILN_DISPATCH_FLOATING(x.dtype(), T, {
    const T* p = x.data<T>();
    for (std::int64_t i = 0, n = x.numel(); i < n; ++i) {
      const float v = static_cast<float>(cpu::load(p[i]));
      std::uint32_t bits;
      std::memcpy(&bits, &v, sizeof(bits));
      bits &= 0x7fffffffu;
      if (bits > largest) largest = bits;
      bytes[i] = fp8_encode(v * scale, format);
    }
  });
  float a;
  std::memcpy(&a, &largest, sizeof(a));
  *amax.data<float>() = a;
}

void fp8_dequantize(const Tensor& bytes, float scale, Fp8Format format, Tensor& out) {
  KILN_CHECK(bytes.dtype() == DType::U8 && bytes.is_contiguous() && bytes.device().is_cpu() &&
                 out.dtype() == DType::F32 && out.numel() == bytes.numel() && out.device().is_cpu(),
             "fp8_dequantize: U8 " + bytes.str() + " into F32 " + out.str() + ", on the CPU");
  const std::uint8_t* b = bytes.data<std::uint8_t>();
  float* o = out.data<float>();
  for (std::int64_t i = 0, n = bytes.numel(); i < n; ++i) o[i] = fp8_decode(b[i], format) / scale;
}

}  // namespace kiln
