#pragma once
// SoftmaxCrossEntropy: PyTorch's F.cross_entropy(logits, targets, label_smoothing=eps,
// ignore_index=ignore, reduction="mean"), fused with the softmax, and its gradient.
//   logits (N, C) any floating dtype (or (B, T, C): every dimension but the last is a row),
//   targets (N) I64 (I32 is converted), on the logits' device (moved there otherwise).
//   loss = sum over non-ignored rows i of [(1 - eps) * (lse_i - x_i,t_i) + eps * (lse_i -
//          mean_c x_i,c)] / max(1, number of non-ignored rows)
// so a batch whose rows are all ignored has loss 0 (PyTorch gives NaN there) and a zero gradient.
// The math is fp32 for half and f32 logits, f64 for f64 on the CPU. Not a Layer: it has two
// inputs and a scalar output; backward(scale) WRITES dlogits = scale * dloss/dlogits in the
// logits' dtype and shape.
//
// The CUDA path never synchronises with the host: the loss, the non-ignored row count and the
// number of correct rows stay on the device. A target outside [0, C) that is not ignore_index
// throws InputError at once on the CPU; on CUDA it makes that batch's loss NaN (its row gets no
// gradient) and is counted in a sticky device counter, which check_targets() reads (a host
// sync) and reports as an InputError. The trainer calls check_targets() whenever it reads the
// loss on the host (logging), so a bad label surfaces at the next host read.

#include <cstdint>

#include "layers/layer.h"

namespace kiln {

class SoftmaxCrossEntropy {
 public:
  explicit SoftmaxCrossEntropy(double label_smoothing = 0.0, std::int64_t ignore_index = -100);

  // A one-element F32 tensor on the logits' device.
  Tensor forward(Context& ctx, const Tensor& logits, const Tensor& targets);
  // Training: forward, and on CUDA the gradient too, in the same pass over each row (the logits
  // are read once from memory instead of three times), written over the logits, which the caller
  // must be done with; backward(ctx, true) then returns it. Where the fused pass does not apply
  // (the CPU, f64, unaligned rows) this is forward, and backward computes the gradient.
  Tensor forward_with_gradient(Context& ctx, const Tensor& logits, const Tensor& targets);
  // dlogits = scale * dloss/dlogits for the last forward, in the logits' dtype and shape, where
  // scale = (*ctx.step.loss_scale) / ctx.step.loss_scale_divisor, read (in double) when the kernel
  // runs: a captured CUDA graph follows the dynamic loss scale without a host read (no loss scale
  // in memory: 1 / divisor). With `reuse_logits` it is written over the forward's logits
  // (elementwise, so in place is exact), for a caller done with them: one (N, C) buffer less,
  // 1.6 GiB for GPT-2 at 16 x 1024 tokens.
  Tensor backward(Context& ctx, bool reuse_logits = false);
  // The scale is no argument: it lives in the step's scalars (a number here would become `bool`).
  Tensor backward(Context& ctx, double scale, bool reuse_logits = false) = delete;

  // A batch whose logits come in chunks of rows (the language-model head's, train/lm_head_loss.h:
  // the (N, C) logits never exist whole). begin_rows takes the batch's targets (N) and classes and
  // counts the rows that count; forward_rows_with_gradient computes the loss terms of the chunk's
  // rows [first_row, first_row + n) and writes their gradient over the chunk's logits (n, C), as
  // backward would for the whole batch (the same scale, over the whole batch's counted rows);
  // finish_rows returns the batch's loss, equal to forward_with_gradient's on the whole logits.
  void begin_rows(const Tensor& targets, std::int64_t classes);
  void forward_rows_with_gradient(Context& ctx, const Tensor& logits, std::int64_t first_row);
  Tensor finish_rows();

  // From the last forward, F32 one-element tensors on the logits' device: rows (not ignored)
  // whose argmax (first maximum) equals the target, and rows not ignored.
  Tensor correct_count() const { return correct_; }
  Tensor counted_rows() const { return counted_; }
  // Throws InputError if any forward since the last check saw an out-of-range target (on CUDA
  // this reads the device counter: a host sync), and resets the counter.
  void check_targets();

  double label_smoothing() const { return label_smoothing_; }
  std::int64_t ignore_index() const { return ignore_index_; }

 private:
  double label_smoothing_;
  std::int64_t ignore_index_;
  // Drops what forward saved for backward once backward is done (the logits are a language
  // model's largest activation); the counts below stay for the metrics.
  void release_saved() {
    logits_ = Tensor();
    targets_ = Tensor();
    row_lse_ = Tensor();
  }
  void take_inputs(const Tensor& logits, const Tensor& targets);
  Tensor compute_loss();  // the loss of the inputs taken
  void check_scale_divisor(const StepScalars& step) const;
  // What the loss and its gradient divide by: `rows` (StepScalars::loss_rows) where it is set,
  // else the counted rows; as a tensor on the counted rows' device, and as a number on the CPU.
  Tensor loss_rows(const float* rows) const;
  double cpu_loss_rows(const float* rows) const;
  // A loss over the counted rows as the loss over `rows` (itself when null).
  Tensor over_loss_rows(const Tensor& loss, const float* rows) const;
  const float* loss_rows_ = nullptr;  // finish_rows' batch's, from its chunks' step
  // InputError for a target outside [0, classes) (the CPU checks at once).
  void check_target(std::int64_t target, std::int64_t row, std::int64_t classes) const;
  bool gradient_in_logits_ = false;  // forward_with_gradient's fused pass wrote it over logits_
  Tensor logits_;                    // (N, C), contiguous
  Shape logits_shape_;
  Tensor targets_;  // (N) I64
  Tensor row_lse_;  // (N) F32 (F64 on the CPU for f64 logits): log-sum-exp of each row
  Tensor counted_;  // () F32
  Tensor correct_;  // () F32
  Tensor invalid_;  // () I32, CUDA: out-of-range targets since the last check_targets()
  // Between begin_rows and finish_rows: each row's loss term (F32 on CUDA, F64 on the CPU) and
  // flags (1 counted, 2 counted and correct, 4 invalid target: CUDA), and the classes.
  Tensor row_loss_, row_flags_;
  std::int64_t rows_classes_ = 0;
};

}  // namespace kiln
