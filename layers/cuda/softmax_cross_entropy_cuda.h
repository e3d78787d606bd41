#pragma once
// SoftmaxCrossEntropy: the CUDA entry points (layers/cuda/softmax_cross_entropy.cu). Layer sources
// call them on CUDA tensors without #if; a build without CUDA gets, beside each declaration, a body
// that throws (core/cuda_op.h).

#include "core/cuda_op.h"
#include "layers/softmax_cross_entropy.h"

namespace kiln {

namespace cuda {
// logits and dlogits are (N, C) with unit column stride and any row stride (a padded row).
// One block per row: row_lse, row_loss and row_flags (1 counted, 2 correct, 4 invalid target);
// then one block reduces the rows in a fixed order into loss, counted, correct and adds the
// batch's invalid rows to `invalid`.
KILN_CUDA_OP("SoftmaxCrossEntropy",
             void softmax_cross_entropy_forward(const Tensor& logits, const Tensor& targets,
                                                double smoothing, std::int64_t ignore_index,
                                                Tensor& row_lse, Tensor& loss, Tensor& counted,
                                                Tensor& correct, Tensor& invalid));
// One block per row: dlogits = scale / max(1, counted) * (softmax - (1 - eps) onehot - eps / C).
// scale_source (device memory), when not null, replaces `scale` by *scale_source / scale_divisor,
// computed in double by the kernel as it runs.
KILN_CUDA_OP("SoftmaxCrossEntropy",
             void softmax_cross_entropy_backward(const Tensor& logits, const Tensor& targets,
                                                 double smoothing, std::int64_t ignore_index,
                                                 const Tensor& row_lse, const Tensor& counted,
                                                 double scale, const double* scale_source,
                                                 std::int64_t scale_divisor, Tensor& dlogits));
// Forward and backward in one pass over each row (training, half or fp32 logits whose rows are
// 16-byte aligned; false, with nothing launched, otherwise): what the two calls above compute, the
// gradient written into dlogits (which may be the logits: in place), scaled as backward's with
// scale_source (null: 1 / scale_divisor). The counted rows are counted from the targets first.
KILN_CUDA_OP("SoftmaxCrossEntropy",
             bool softmax_cross_entropy_fused(const Tensor& logits, const Tensor& targets,
                                              double smoothing, std::int64_t ignore_index,
                                              const double* scale_source,
                                              std::int64_t scale_divisor, Tensor& row_lse,
                                              Tensor& loss, Tensor& counted, Tensor& correct,
                                              Tensor& invalid, Tensor& dlogits));
// The fused pass over a batch in chunks of rows (the language-model head's chunks, whose logits
// never exist whole): count the batch's counted rows from all its targets; then for each chunk,
// the fused pass over its rows, which start at `first_row` of the batch (targets, row_lse,
// row_loss and row_flags are the batch's); then finish over all rows, in the same fixed order as
// softmax_cross_entropy_fused, which is these three on one chunk.
KILN_CUDA_OP("SoftmaxCrossEntropy",
             bool softmax_cross_entropy_fusable(const Tensor& logits, const Tensor& dlogits));
KILN_CUDA_OP("SoftmaxCrossEntropy",
             void softmax_cross_entropy_count(const Tensor& targets, std::int64_t classes,
                                              std::int64_t ignore_index, Tensor& counted));
KILN_CUDA_OP("SoftmaxCrossEntropy",
             void softmax_cross_entropy_fused_rows(
                 const Tensor& logits, const Tensor& targets, std::int64_t first_row,
                 double smoothing, std::int64_t ignore_index, const double* scale_source,
                 std::int64_t scale_divisor, const Tensor& counted, Tensor& row_lse,
                 Tensor& row_loss, Tensor& row_flags, Tensor& dlogits));
KILN_CUDA_OP("SoftmaxCrossEntropy",
             void softmax_cross_entropy_finish(const Tensor& row_loss, const Tensor& row_flags,
                                               Tensor& loss, Tensor& counted, Tensor& correct,
                                               Tensor& invalid));
}  // namespace cuda

}  // namespace kiln
