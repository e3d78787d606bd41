#pragma once
// Linear: the CUDA entry points (layers/cuda/linear.cu). Layer sources call them on CUDA tensors
// without #if; a build without CUDA gets, beside each declaration, a body that throws
// (core/cuda_op.h).

#include "core/cuda_op.h"
#include "layers/fp8_projection.h"
#include "layers/linear.h"

namespace kiln {

namespace cuda {
// Forward on CUDA: y (M, out) = act(x W^T + b). x (M, in) and w (out, in) share a dtype; bias
// may be undefined. Returns what backward needs (y for ReLU, z for GELU, empty otherwise) and
// its leading dimension.
// With `residual` (M, out) in y's dtype: y = act(x W^T + b) + residual, the addition in the GEMM's
// epilogue (beta = 1 over residual as C) where it can.
// With `fp8`: the GEMM multiplies these casts of W and x instead (precision.fp8).
struct Fp8Forward {
  Fp8Operand weight;  // W (out, in) rows
  Fp8Operand input;   // x (M, in) rows
};
KILN_CUDA_OP("Linear",
             void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias,
                                 Activation act, Tensor& y, Tensor& saved, std::int64_t& saved_ld,
                                 const Tensor& residual = Tensor(),
                                 const Fp8Forward* fp8 = nullptr));
// The activation of the layer that produced x, its pre-activation kept as `saved` (leading
// dimension saved_ld): backward can apply its derivative to dx in the GEMM's epilogue.
struct InputActivation {
  Activation act = Activation::None;
  Tensor saved;
  std::int64_t saved_ld = 0;
};
// Backward on CUDA: dz = dy * act'(saved); weight_grad += dz^T x (undefined: none, a frozen
// weight); bias_grad += sum_rows dz (null: none); dx (M, in) = dz W (undefined: not computed). With
// input_activation (GELU, half GEMMs) dx is multiplied by its derivative in the dx GEMM's epilogue
// where cuBLASLt can: true when it was. With `fp8`: both GEMMs on its casts of x, W and dz
// (x and W at the scales its forward casts used).
KILN_CUDA_OP("Linear",
             bool linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy,
                                  Activation act, const Tensor& saved, std::int64_t saved_ld,
                                  Tensor& weight_grad, Tensor* bias_grad, Tensor& dx,
                                  const InputActivation* input_activation = nullptr,
                                  Fp8Projection* fp8 = nullptr));
// The forward operands of `fp8` for x (M, in) and w (out, in): casts recorded unless
// `recomputing` (a recomputed forward casts at the scales of the forward it repeats).
inline Fp8Forward fp8_forward_operands(Fp8Projection& fp8, const Tensor& x, const Tensor& w,
                                       bool recomputing) {
  return {fp8.cast(Fp8Projection::Weight, w, false, !recomputing), fp8.cast_input(x, !recomputing)};
}
}  // namespace cuda

}  // namespace kiln
