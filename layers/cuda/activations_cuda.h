#pragma once
// GELU's and Linear's activation passes: the CUDA entry points (layers/cuda/activations.cu). Layer
// sources call them on CUDA tensors without #if; a build without CUDA gets, beside each
// declaration, a body that throws (core/cuda_op.h).

#include "core/cuda_op.h"
#include "layers/activations.h"

namespace kiln {

namespace cuda {
// y = act(x) / dx = dy * act'(x), elementwise over contiguous tensors of equal numel (any
// floating dtypes each; fp32 math for halves).
KILN_CUDA_OP("an activation", void activation_forward(Activation act, const Tensor& x, Tensor& y));
KILN_CUDA_OP("an activation", void activation_backward(Activation act, const Tensor& x,
                                                       const Tensor& dy, Tensor& dx));
}  // namespace cuda

}  // namespace kiln
