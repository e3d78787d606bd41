#pragma once
// ReLU: the CUDA entry points (layers/cuda/relu.cu). Layer sources call them on CUDA tensors
// without #if; a build without CUDA gets, beside each declaration, a body that throws
// (core/cuda_op.h).

#include "core/cuda_op.h"
#include "layers/relu.h"

namespace kiln {

// CUDA launchers (layers/cuda/relu.cu) on dense tensors of one dtype.
namespace relu_cuda {
KILN_CUDA_OP("ReLU", void forward(const Tensor& x, Tensor& y));  // y may be x
KILN_CUDA_OP("ReLU", void forward_add(const Tensor& x, const Tensor& r,
                                      Tensor& y));  // y = relu(x + r); y may be x
KILN_CUDA_OP("ReLU", void backward(const Tensor& y, const Tensor& dy, Tensor& dx));  // dx may be dy
}  // namespace relu_cuda

}  // namespace kiln
