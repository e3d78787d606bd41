#pragma once
// Embedding: the CUDA entry points (layers/cuda/embedding.cu). Layer sources call them on CUDA
// tensors without #if; a build without CUDA gets, beside each declaration, a body that throws
// (core/cuda_op.h).

#include "core/cuda_op.h"
#include "layers/embedding.h"

namespace kiln {

namespace cuda {
// Launchers (layers/cuda/embedding.cu). ids (N) I64; y (N, dim); weight_grad (num, dim) +=.
KILN_CUDA_OP("Embedding",
             void embedding_forward(const Tensor& ids, const Tensor& weight, Tensor& y));
KILN_CUDA_OP("Embedding", void embedding_backward(const Tensor& ids, const Tensor& dy,
                                                  std::int64_t padding_idx, Tensor& weight_grad));
}  // namespace cuda

}  // namespace kiln
