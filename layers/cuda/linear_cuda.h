#pragma once
// Linear: the CUDA entry points (layers/cuda/linear.cu). Layer sources call them on CUDA tensors
// without #if; a build without CUDA gets, beside each declaration, a body that throws
// (core/cuda_op.h).

#include "core/cuda_op.h"
#include "layers/linear.h"

namespace kiln {

namespace cuda {
// Forward on CUDA: y (M, out) = act(x W^T + b). x (M, in) and w (out, in) share a dtype; bias
// may be undefined. Returns what backward needs (y for ReLU, z for GELU, empty otherwise) and
// its leading dimension.
KILN_CUDA_OP("Linear",
             void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias,
                                 Activation act, Tensor& y, Tensor& saved, std::int64_t& saved_ld));
// Backward on CUDA: dz = dy * act'(saved); weight_grad += dz^T x; bias_grad += sum_rows dz
// (undefined: none); dx (M, in) = dz W (undefined: not computed).
KILN_CUDA_OP("Linear",
             void linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy,
                                  Activation act, const Tensor& saved, std::int64_t saved_ld,
                                  Tensor& weight_grad, Tensor* bias_grad, Tensor& dx));
}  // namespace cuda

}  // namespace kiln
