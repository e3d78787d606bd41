#pragma once
// LayerNorm: the CUDA entry points (layers/cuda/layernorm.cu). Layer sources call them on CUDA
// tensors without #if; a build without CUDA gets, beside each declaration, a body that throws
// (core/cuda_op.h).

#include "core/cuda_op.h"
#include "layers/layernorm.h"

namespace kiln {

namespace cuda {
// Launchers (layers/cuda/layernorm.cu). x, y, dy, dx (rows, C) contiguous, one dtype; weight,
// bias, mean, rstd fp32 (f64 when x is f64).
// RMSNorm: bias (forward) and dbias (backward) undefined; the kernels then hold the mean at 0.
// Forward: with `delta` defined, the row normalised is x + delta, rounded to x's dtype and
// written to `sum` (rows, C).
KILN_CUDA_OP("LayerNorm",
             void layernorm_forward(const Tensor& x, const Tensor& delta, const Tensor& weight,
                                    const Tensor& bias, double eps, Tensor& y, Tensor& sum,
                                    Tensor& mean, Tensor& rstd));
// Backward: dx = LN'(dy) (+ residual_grad when defined); dweight/dbias (C) in the statistics'
// type, overwritten or, with `accumulate`, added to.
KILN_CUDA_OP("LayerNorm",
             void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                     const Tensor& mean, const Tensor& rstd,
                                     const Tensor& residual_grad, Tensor& dx, Tensor& dweight,
                                     Tensor& dbias, bool accumulate));
}  // namespace cuda

}  // namespace kiln
