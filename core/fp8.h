#pragma once
// The 8-bit floating-point formats of the RTX 4090's and the H100/H200's tensor cores (OCP FP8):
//   E4M3: 4 exponent bits (bias 7), 3 mantissa bits; largest 448; no infinities, NaN S.1111.111
//   E5M2: 5 exponent bits (bias 15), 2 mantissa bits; largest 57344; IEEE infinities and NaNs
// Conversion from float as CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, ...): round to nearest
// even, subnormals kept, a magnitude beyond the largest finite one (infinity included) saturates to
// it, NaN stays NaN. Host and device share these functions: the CPU twin of an FP8 cast rounds as
// the CUDA kernel does, bit for bit.

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/host_device.h"

namespace kiln {

enum class Fp8Format : std::uint8_t { E4M3, E5M2 };

KILN_HOST_DEVICE_INLINE int fp8_mantissa_bits(Fp8Format f) {
  return f == Fp8Format::E4M3 ? 3 : 2;
}
KILN_HOST_DEVICE_INLINE int fp8_bias(Fp8Format f) {
  return f == Fp8Format::E4M3 ? 7 : 15;
}
// The largest finite magnitude and its code (sign bit clear).
KILN_HOST_DEVICE_INLINE float fp8_max(Fp8Format f) {
  return f == Fp8Format::E4M3 ? 448.0f : 57344.0f;
}
KILN_HOST_DEVICE_INLINE std::uint8_t fp8_max_code(Fp8Format f) {
  return f == Fp8Format::E4M3 ? 0x7E : 0x7B;
}

KILN_HOST_DEVICE_INLINE std::uint8_t fp8_encode(float x, Fp8Format f) {
  std::uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  const std::uint8_t sign = static_cast<std::uint8_t>((bits >> 24) & 0x80u);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return sign | 0x7F;  // NaN (both formats)
  const float a = fabsf(x);
  if (a >= fp8_max(f)) return sign | fp8_max_code(f);  // infinity too: SATFINITE
  const int m = fp8_mantissa_bits(f), bias = fp8_bias(f);
  // The float's own exponent; subnormal floats are far below FP8's smallest step (they give 0).
  const int exponent = static_cast<int>((bits >> 23) & 0xffu) - 127;
  if (exponent < 1 - bias) {                             // FP8 subnormal: steps of 2^(1 - bias - m)
    const float steps = rintf(ldexpf(a, m + bias - 1));  // exact scaling, round half to even
    return sign | static_cast<std::uint8_t>(steps);      // 2^m steps is the smallest normal's code
  }
  // Normal: a = n 2^(exponent - m) with n in [2^m, 2^(m+1)]; n = 2^(m+1) carries into the exponent
  // field, which the code's bit layout does by itself.
  const float n = rintf(ldexpf(a, m - exponent));
  const std::uint32_t code = (static_cast<std::uint32_t>(exponent + bias) << m) +
                             (static_cast<std::uint32_t>(n) - (1u << m));
  return sign | static_cast<std::uint8_t>(code > fp8_max_code(f) ? fp8_max_code(f) : code);
}

KILN_HOST_DEVICE_INLINE float fp8_decode(std::uint8_t b, Fp8Format f) {
  const int m = fp8_mantissa_bits(f), bias = fp8_bias(f);
  const int field = (b & 0x7F) >> m, mantissa = b & ((1 << m) - 1);
  const float sign = (b & 0x80) ? -1.0f : 1.0f;
  if (f == Fp8Format::E4M3 && field == 15 && mantissa == 7) return NAN;
  if (f == Fp8Format::E5M2 && field == 31) return mantissa == 0 ? sign * INFINITY : NAN;
  if (field == 0) return sign * ldexpf(static_cast<float>(mantissa), 1 - bias - m);
  return sign * ldexpf(static_cast<float>(mantissa + (1 << m)), field - bias - m);
}

// Transformer Engine's per-tensor scale from an absolute maximum: fp8_max / amax / 2^margin, so
// that amax lands at the format's largest value; `previous` where amax is 0 or not finite (an
// all-zero tensor, an overflow that the loss scaler deals with).
KILN_HOST_DEVICE_INLINE float fp8_scale_for(float amax, Fp8Format f, float margin, float previous) {
  if (!(amax > 0.0f) || !(amax < INFINITY)) return previous;
  const float scale = fp8_max(f) / amax / exp2f(margin);
  return scale < INFINITY ? scale : previous;
}

// Per-tensor scaling, Transformer Engine's two recipes (issue 37): the scale a cast multiplies by
// comes from the amax of the tensor being cast (Current, measured in a pass before the cast) or
// from the largest amax of the last `history` casts (Delayed: no pass before the cast).
enum class Fp8Recipe : std::uint8_t { Current, Delayed };

struct Fp8ScalingOptions {
  Fp8Recipe recipe = Fp8Recipe::Delayed;
  int history = 16;     // casts remembered (Delayed)
  float margin = 0.0f;  // the scale is divided by 2^margin
};

// One tensor's scaling state as floats, the layout that the host class (optim/amp/fp8_scaling.h),
// the checkpointed buffers of FP8 projections and their CUDA casts share:
//   [0] the scale of the next cast  [1] overflows counted  [2] the next history slot
//   [3, 3 + history) the amax history (a ring)
constexpr int kFp8StateHeader = 3;

// The amax a cast measured, recorded into `state`: a non-finite one (an overflow upstream) is
// counted and changes nothing else; a finite one enters the history, and the next scale is
// taken from the history's largest (Delayed) or from it (Current).
KILN_HOST_DEVICE_INLINE void fp8_scaling_record(float* state, const Fp8ScalingOptions& options,
                                                Fp8Format format, float amax) {
  if (!(amax < INFINITY)) {  // NaN or infinity
    state[1] += 1.0f;
    return;
  }
  float* history = state + kFp8StateHeader;
  const int next = static_cast<int>(state[2]);
  history[next] = amax;
  state[2] = static_cast<float>((next + 1) % options.history);
  float largest = amax;
  if (options.recipe == Fp8Recipe::Delayed) {
    for (int i = 0; i < options.history; ++i) largest = fmaxf(largest, history[i]);
  }
  state[0] = fp8_scale_for(largest, format, options.margin, state[0]);
}

// Delayed scaling after the amax histories of every data-parallel rank were merged (the
// elementwise largest): the next scale from the merged history, as fp8_scaling_record takes it.
KILN_HOST_DEVICE_INLINE void fp8_scale_from_history(float* state, const Fp8ScalingOptions& options,
                                                    Fp8Format format) {
  const float* history = state + kFp8StateHeader;
  float largest = 0.0f;
  for (int i = 0; i < options.history; ++i) largest = fmaxf(largest, history[i]);
  state[0] = fp8_scale_for(largest, format, options.margin, state[0]);
}

}  // namespace kiln
