#pragma once
// ReLU: the CUDA entry points (layers/cuda/relu.cu). Layer sources call them
// on CUDA tensors without #if: a build without CUDA links layers/cuda_stubs.cc, whose definitions
// throw.

#include "layers/relu.h"

namespace kiln {

// CUDA launchers (layers/cuda/relu.cu) on dense tensors of one dtype.
namespace relu_cuda {
void forward(const Tensor& x, Tensor& y);                       // y may be x
void forward_add(const Tensor& x, const Tensor& r, Tensor& y);  // y = relu(x + r); y may be x
void backward(const Tensor& y, const Tensor& dy, Tensor& dx);   // dx may be dy
}  // namespace relu_cuda

}  // namespace kiln
