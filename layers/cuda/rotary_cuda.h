#pragma once
// RotaryEmbedding: the CUDA entry point (layers/cuda/rotary.cu). Layer sources call it on CUDA
// tensors without #if; a build without CUDA gets, beside the declaration, a body that throws.

#include "core/cuda_op.h"
#include "core/tensor.h"

namespace kiln::cuda {
// x (N, W) rows (contiguous innermost, row stride x.stride(0)); cos, sin (positions, d/2) fp32
// (f64 for f64 x); document_starts (N) I32 or undefined: row n's position is then
// n % tokens - document_starts[n] (clamped to [0, n % tokens]). See RotaryEmbedding::apply.
KILN_CUDA_OP("RotaryEmbedding", void rotary_apply(Tensor& x, const Tensor& cos, const Tensor& sin,
                                                  std::int64_t heads, std::int64_t head_dim,
                                                  std::int64_t tokens, std::int64_t first_position,
                                                  const Tensor& document_starts, bool inverse));
}  // namespace kiln::cuda
