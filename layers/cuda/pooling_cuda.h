#pragma once
// the pooling layers: the CUDA entry points (layers/cuda/pooling.cu). Layer sources call them
// on CUDA tensors without #if: a build without CUDA links layers/cuda_stubs.cc, whose definitions
// throw.

#include "layers/pooling.h"

namespace kiln {

// CUDA launchers (layers/cuda/pooling.cu) on physical tensors.
namespace pooling_cuda {
void max_forward(const PoolGeometry& g, const Tensor& x, Tensor& y, Tensor& argmax);
void max_backward(const PoolGeometry& g, const Tensor& dy, const Tensor& argmax, Tensor& dx);
void avg_forward(const PoolGeometry& g, const Tensor& x, Tensor& y);
void avg_backward(const PoolGeometry& g, const Tensor& dy, Tensor& dx);
void global_avg_forward(const PoolGeometry& g, const Tensor& x, Tensor& y);     // y (N, C)
void global_avg_backward(const PoolGeometry& g, const Tensor& dy, Tensor& dx);  // dy (N, C)
}  // namespace pooling_cuda

}  // namespace kiln
