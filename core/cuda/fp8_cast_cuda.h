#pragma once
// The FP8 cast's CUDA entry point (core/cuda/fp8_cast.cu); see core/fp8_cast.h.

#include "core/cuda_op.h"
#include "core/fp8.h"
#include "core/tensor.h"

namespace kiln::cuda {
KILN_CUDA_OP("The FP8 cast", void fp8_cast(const Tensor& x, float scale, Fp8Format format,
                                           Tensor& out, Tensor& amax));
}  // namespace kiln::cuda
