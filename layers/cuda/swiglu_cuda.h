#pragma once
// SwiGLU: the CUDA entry points (layers/cuda/swiglu.cu); see layers/swiglu_mlp.h.

#include "core/cuda_op.h"
#include "core/tensor.h"

namespace kiln::cuda {
KILN_CUDA_OP("SwiGLU", void swiglu_forward(const Tensor& g, const Tensor& u, Tensor& a));
KILN_CUDA_OP("SwiGLU", void swiglu_backward(const Tensor& da, const Tensor& g, const Tensor& u,
                                            Tensor& dg, Tensor& du));
}  // namespace kiln::cuda
