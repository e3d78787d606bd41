#pragma once
// SwiGLU: the CUDA entry points (layers/cuda/swiglu.cu); see layers/swiglu_mlp.h.

#include "core/cuda_op.h"
#include "core/tensor.h"

namespace kiln::cuda {
// gate_up (N, 2I) = [g | u] -> a (N, I); backward -> dgate_up (N, 2I).
KILN_CUDA_OP("SwiGLU", void swiglu_forward(const Tensor& gate_up, Tensor& a));
KILN_CUDA_OP("SwiGLU",
             void swiglu_backward(const Tensor& da, const Tensor& gate_up, Tensor& dgate_up));
}  // namespace kiln::cuda
