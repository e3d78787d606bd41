#pragma once
// the pooling layers: the CUDA entry points (layers/cuda/pooling.cu). Layer sources call them on
// CUDA tensors without #if; a build without CUDA gets, beside each declaration, a body that throws
// (core/cuda_op.h).

#include "core/cuda_op.h"
#include "layers/pooling.h"

namespace kiln {

// CUDA launchers (layers/cuda/pooling.cu) on physical tensors.
namespace pooling_cuda {
KILN_CUDA_OP("MaxPool2d",
             void max_forward(const PoolGeometry& g, const Tensor& x, Tensor& y, Tensor& argmax));
KILN_CUDA_OP("MaxPool2d", void max_backward(const PoolGeometry& g, const Tensor& dy,
                                            const Tensor& argmax, Tensor& dx));
KILN_CUDA_OP("AvgPool2d", void avg_forward(const PoolGeometry& g, const Tensor& x, Tensor& y));
KILN_CUDA_OP("AvgPool2d", void avg_backward(const PoolGeometry& g, const Tensor& dy, Tensor& dx));
KILN_CUDA_OP("GlobalAvgPool", void global_avg_forward(const PoolGeometry& g, const Tensor& x,
                                                      Tensor& y));  // y (N, C)
KILN_CUDA_OP("GlobalAvgPool", void global_avg_backward(const PoolGeometry& g, const Tensor& dy,
                                                       Tensor& dx));  // dy (N, C)
}  // namespace pooling_cuda

}  // namespace kiln
