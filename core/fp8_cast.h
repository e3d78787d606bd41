#pragma once
// The FP8 cast (issue 37's scaling, the cast that feeds FP8 GEMMs): each element of a float, half
// or bfloat16 tensor multiplied by a per-tensor scale and rounded to E4M3 or E5M2 (core/fp8.h),
// the tensor's absolute maximum before scaling measured in the same pass (the "current" scaling's
// amax, and what a delayed scaling's history records). On CUDA the conversion is
// __nv_cvt_float_to_fp8 with saturation; the CPU twin gives the same bytes (test_core_gpu).

#include "core/fp8.h"
#include "core/tensor.h"

namespace kiln {

// out (U8, x's element count) = fp8(x * scale); amax (F32, one element, x's device) = max |x|,
// where infinity ranks above every finite value and NaN above infinity, so an overflow upstream
// shows in amax. x: F32, F16 or BF16, contiguous.
void fp8_cast(const Tensor& x, float scale, Fp8Format format, Tensor& out, Tensor& amax);

// The float of each FP8 byte (out F32), divided by `scale`: what an FP8 GEMM reads back.
void fp8_dequantize(const Tensor& bytes, float scale, Fp8Format format, Tensor& out);

}  // namespace kiln
