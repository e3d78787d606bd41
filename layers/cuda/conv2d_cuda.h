#pragma once
// Conv2d: the CUDA entry points (layers/cuda/conv2d.cc, conv2d.cu and conv2d_graph.cc). Layer
// sources call them on CUDA tensors without #if; a build without CUDA gets, beside each
// declaration, a body that throws (core/cuda_op.h).

#include "core/cuda_op.h"
#include "layers/conv2d.h"

namespace kiln {

// The CUDA implementation (layers/cuda/conv2d.cc), following the lifecycle
// can_implement -> workspace size and setup (choose algorithms, cached per geometry) -> run.
// Tensors are physical (NCHW or NHWC contiguous per geometry.channels_last); the filter is
// (K, C/g, R, S) or, when channels_last, (K, R, S, C/g).
namespace cudnn_conv {
KILN_CUDA_OP("Conv2d", bool can_implement(const Conv2dGeometry& g, std::string* why));
KILN_CUDA_OP("Conv2d", ConvAlgorithmChoice setup(const Conv2dGeometry& g,
                                                 const ConvAlgorithmOptions& options));
KILN_CUDA_OP("Conv2d", void forward(const Conv2dGeometry& g, const ConvAlgorithmChoice& algos,
                                    const Tensor& x, const Tensor& w, Tensor& y));
KILN_CUDA_OP("Conv2d", void backward_data(const Conv2dGeometry& g, const ConvAlgorithmChoice& algos,
                                          const Tensor& dy, const Tensor& w, Tensor& dx));
// dw = beta * dw + (gradient); beta 1 accumulates.
KILN_CUDA_OP("Conv2d",
             void backward_filter(const Conv2dGeometry& g, const ConvAlgorithmChoice& algos,
                                  const Tensor& x, const Tensor& dy, Tensor& dw, double beta));
// y (physical) += bias per channel; bias has y's dtype.
KILN_CUDA_OP("Conv2d", void add_bias(Tensor& y, const Tensor& bias, bool channels_last));
KILN_CUDA_OP("Conv2d",
             std::size_t cached_plans());  // how many geometries have been set up (for tests)
}  // namespace cudnn_conv

}  // namespace kiln
