#pragma once
// Dropout: the CUDA entry points (layers/cuda/dropout.cu). Layer sources call them on CUDA tensors
// without #if; a build without CUDA gets, beside each declaration, a body that throws
// (core/cuda_op.h).

#include "core/cuda_op.h"
#include "layers/dropout.h"

namespace kiln {

namespace cuda {
// out = in * keep(i) * scale over contiguous tensors of equal numel (forward and backward alike).
// step_source (device memory), when not null, holds the step instead of `step`, read by the kernel.
KILN_CUDA_OP("Dropout", void dropout_apply(const Tensor& in, Tensor& out, std::uint64_t key,
                                           std::uint64_t step, const std::uint64_t* step_source,
                                           double p, double scale));
}  // namespace cuda

}  // namespace kiln
