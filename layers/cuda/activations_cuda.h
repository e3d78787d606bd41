#pragma once
// GELU's and Linear's activation passes: the CUDA entry points (layers/cuda/activations.cu). Layer
// sources call them on CUDA tensors without #if: a build without CUDA links layers/cuda_stubs.cc,
// whose definitions throw.

#include "layers/activations.h"

namespace kiln {

namespace cuda {
// y = act(x) / dx = dy * act'(x), elementwise over contiguous tensors of equal numel (any
// floating dtypes each; fp32 math for halves).
void activation_forward(Activation act, const Tensor& x, Tensor& y);
void activation_backward(Activation act, const Tensor& x, const Tensor& dy, Tensor& dx);
}  // namespace cuda

}  // namespace kiln
