#include "layers/softmax_cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "core/cpu/element.h"
#include "core/ops.h"
#include "layers/cuda/softmax_cross_entropy_cuda.h"

namespace kiln {
namespace {

// One row of logits on the CPU, in double: its log-sum-exp, the sum of its values and its first
// maximum.
struct RowStats {
  double lse = 0, sum_x = 0;
  std::int64_t argmax = 0;
};

template <typename T>
RowStats row_stats(const T* row, std::int64_t classes) {
  RowStats r;
  double max = -std::numeric_limits<double>::infinity();
  for (std::int64_t c = 0; c < classes; ++c) {
    double v = cpu::load(row[c]);
    if (v > max) {
      max = v;
      r.argmax = c;
    }
    r.sum_x += v;
  }
  double sum_exp = 0;
  for (std::int64_t c = 0; c < classes; ++c) sum_exp += std::exp(cpu::load(row[c]) - max);
  r.lse = max + std::log(sum_exp);
  return r;
}

// One row's gradient, factor * (softmax - (1 - eps) onehot - eps / C), zero for an ignored row;
// dx may be x (each element is read before it is written).
template <typename T>
void row_gradient(const T* x, T* dx, std::int64_t classes, double lse, std::int64_t target,
                  bool ignored, double eps, double factor) {
  for (std::int64_t c = 0; c < classes; ++c) {
    double g = 0;
    if (!ignored) {
      double p = std::exp(static_cast<double>(cpu::load(x[c])) - lse);
      g = factor * (p - (c == target ? 1.0 - eps : 0.0) - eps / static_cast<double>(classes));
    }
    dx[c] = cpu::store<T>(g);
  }
}

// A counted row's loss: (1 - eps) * nll + eps * (lse - mean of the row).
double row_loss(const RowStats& st, double target_logit, std::int64_t classes, double eps) {
  const double nll = st.lse - target_logit;
  const double smooth = st.lse - st.sum_x / static_cast<double>(classes);
  return (1.0 - eps) * nll + eps * smooth;
}

// The gradient's scale on the CPU: the loss scale in memory over the divisor (none: 1).
double cpu_gradient_scale(const StepScalars& step) {
  // Without a loss scale in memory the scale is 1 (the same division, so the same bits).
  if (step.loss_scale == nullptr) return 1.0 / static_cast<double>(step.loss_scale_divisor);
  return *step.loss_scale / static_cast<double>(step.loss_scale_divisor);
}

}  // namespace

SoftmaxCrossEntropy::SoftmaxCrossEntropy(double label_smoothing, std::int64_t ignore_index)
    : label_smoothing_(label_smoothing), ignore_index_(ignore_index) {
  if (!(label_smoothing >= 0.0 && label_smoothing <= 1.0)) {
    throw InputError("SoftmaxCrossEntropy: label_smoothing " + std::to_string(label_smoothing) +
                     " is not in [0, 1]");
  }
}

void SoftmaxCrossEntropy::take_inputs(const Tensor& logits, const Tensor& targets) {
  KILN_CHECK(logits.dim() >= 2 && is_floating(logits.dtype()),
             "SoftmaxCrossEntropy: logits must be floating (N, C), got " + logits.str());
  std::int64_t classes = logits.size(-1),
               rows = logits.numel() / std::max<std::int64_t>(classes, 1);
  KILN_CHECK(targets.numel() == rows, "SoftmaxCrossEntropy: " + std::to_string(rows) +
                                          " rows of logits " + logits.str() + " but targets " +
                                          targets.str());
  Device device = logits.device();
  logits_shape_ = logits.shape();
  // (N, C); rows may be padded (a row stride above C, GPT-2's LM head), columns are unit-stride.
  logits_ = logits.reshape({rows, classes});
  if (classes > 1 && logits_.stride(1) != 1) logits_ = logits_.contiguous();
  targets_ = targets.to(device, DType::I64).contiguous().view({rows});  // (N)
  gradient_in_logits_ = false;
  if (device.is_cuda()) {
    row_lse_ = Tensor::empty({rows}, DType::F32, device);
    counted_ = Tensor::empty({}, DType::F32, device);
    correct_ = Tensor::empty({}, DType::F32, device);
    if (!invalid_.defined() || invalid_.device() != device) {
      invalid_ = Tensor::zeros({}, DType::I32, device);
    }
  }
}

Tensor SoftmaxCrossEntropy::forward_with_gradient(Context& ctx, const Tensor& logits,
                                                  const Tensor& targets) {
  take_inputs(logits, targets);
  const float* rows = ctx.step.loss_rows;
  if (logits_.device().is_cuda() && rows != nullptr) {
    check_scale_divisor(ctx.step);
    if (cuda::softmax_cross_entropy_fusable(logits_, logits_)) {
      // The fused pass's three parts (count, rows, finish) on one chunk: the rows' gradient over
      // the step's loss rows instead of the counted ones.
      Tensor whole = logits_, targets_of_rows = targets_;
      begin_rows(targets_of_rows, whole.size(1));
      forward_rows_with_gradient(ctx, whole, 0);
      Tensor loss = finish_rows();
      logits_ = whole;
      gradient_in_logits_ = true;
      return loss;
    }
  } else if (logits_.device().is_cuda()) {
    check_scale_divisor(ctx.step);
    Tensor loss = Tensor::empty({}, DType::F32, logits_.device());
    gradient_in_logits_ = cuda::softmax_cross_entropy_fused(
        logits_, targets_, label_smoothing_, ignore_index_, ctx.step.loss_scale,
        ctx.step.loss_scale_divisor, row_lse_, loss, counted_, correct_, invalid_, logits_);
    if (gradient_in_logits_) return loss;
  }
  return over_loss_rows(compute_loss(), rows);
}

Tensor SoftmaxCrossEntropy::loss_rows(const float* rows) const {
  if (rows == nullptr) return counted_;
  return Tensor::wrap(const_cast<float*>(rows), {}, DType::F32, counted_.device());
}

double SoftmaxCrossEntropy::cpu_loss_rows(const float* rows) const {
  return rows != nullptr ? static_cast<double>(*rows) : std::max(counted_.item(), 1.0);
}

Tensor SoftmaxCrossEntropy::over_loss_rows(const Tensor& loss, const float* rows) const {
  if (rows == nullptr) return loss;
  if (!loss.device().is_cuda()) {
    return Tensor::scalar(loss.item() * counted_.item() / static_cast<double>(*rows), DType::F32);
  }
  // On the device, where the rows live: loss * counted * (1 / rows).
  Tensor inverse = Tensor::wrap(const_cast<float*>(rows + 1), {}, DType::F32, loss.device());
  return ops::mul(ops::mul(loss, counted_), inverse);
}

Tensor SoftmaxCrossEntropy::forward(Context& ctx, const Tensor& logits, const Tensor& targets) {
  (void)ctx;
  take_inputs(logits, targets);
  return compute_loss();
}

void SoftmaxCrossEntropy::check_scale_divisor(const StepScalars& step) const {
  KILN_CHECK(step.loss_scale_divisor > 0, "SoftmaxCrossEntropy: loss_scale_divisor " +
                                              std::to_string(step.loss_scale_divisor) +
                                              " must be positive");
}

Tensor SoftmaxCrossEntropy::compute_loss() {
  const std::int64_t rows = logits_.size(0), classes = logits_.size(1);
  if (logits_.device().is_cuda()) {
    Tensor loss = Tensor::empty({}, DType::F32, logits_.device());
    cuda::softmax_cross_entropy_forward(logits_, targets_, label_smoothing_, ignore_index_,
                                        row_lse_, loss, counted_, correct_, invalid_);
    return loss;
  }
  row_lse_ = Tensor::empty({rows}, DType::F64);
  double* lse_out = row_lse_.data<double>();
  const std::int64_t* t = targets_.data<std::int64_t>();
  double total = 0, counted = 0, correct = 0;
  const std::int64_t ld = logits_.stride(0);
  KILN_DISPATCH_FLOATING(logits_.dtype(), T, {
    const T* x = logits_.data<T>();
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* row = x + r * ld;
      const RowStats st = row_stats(row, classes);
      lse_out[r] = st.lse;
      if (t[r] == ignore_index_) continue;
      check_target(t[r], r, classes);
      total += row_loss(st, cpu::load(row[t[r]]), classes, label_smoothing_);
      counted += 1;
      if (st.argmax == t[r]) correct += 1;
    }
  });
  counted_ = Tensor::scalar(counted, DType::F32);
  correct_ = Tensor::scalar(correct, DType::F32);
  return Tensor::scalar(total / std::max(counted, 1.0), DType::F32);
}

Tensor SoftmaxCrossEntropy::backward(Context& ctx, bool reuse_logits) {
  KILN_CHECK(logits_.defined(), "SoftmaxCrossEntropy: backward without forward");
  const StepScalars& step = ctx.step;
  check_scale_divisor(step);
  if (gradient_in_logits_) {
    KILN_CHECK(reuse_logits,
               "SoftmaxCrossEntropy: the gradient of forward_with_gradient is in "
               "the logits; backward must reuse them");
    Tensor dlogits = logits_.reshape(logits_shape_);
    release_saved();
    return dlogits;
  }
  std::int64_t rows = logits_.size(0), classes = logits_.size(1);
  Tensor dlogits = reuse_logits ? logits_
                                : Tensor::empty({rows, classes}, logits_.dtype(),
                                                logits_.device());  // (N, C)
  if (logits_.device().is_cuda()) {
    // Without a loss scale in memory the scale is 1 (the same division, so the same bits).
    const double scale = 1.0 / static_cast<double>(step.loss_scale_divisor);
    cuda::softmax_cross_entropy_backward(logits_, targets_, label_smoothing_, ignore_index_,
                                         row_lse_, loss_rows(step.loss_rows), scale,
                                         step.loss_scale, step.loss_scale_divisor, dlogits);
    release_saved();
    return dlogits.reshape(logits_shape_);
  }
  const double* lse = row_lse_.data<double>();
  const std::int64_t* t = targets_.data<std::int64_t>();
  const double eps = label_smoothing_;
  const double factor = cpu_gradient_scale(step) / cpu_loss_rows(step.loss_rows);
  const std::int64_t ld = logits_.stride(0), ld_out = dlogits.stride(0);
  KILN_DISPATCH_FLOATING(logits_.dtype(), T, {
    const T* x = logits_.data<T>();
    T* dx = dlogits.data<T>();
    for (std::int64_t r = 0; r < rows; ++r) {
      row_gradient(x + r * ld, dx + r * ld_out, classes, lse[r], t[r], t[r] == ignore_index_, eps,
                   factor);
    }
  });
  release_saved();
  return dlogits.reshape(logits_shape_);
}

void SoftmaxCrossEntropy::check_target(std::int64_t target, std::int64_t row,
                                       std::int64_t classes) const {
  if (target < 0 || target >= classes) {
    throw InputError("SoftmaxCrossEntropy: target " + std::to_string(target) + " of row " +
                     std::to_string(row) + " is outside [0, " + std::to_string(classes) +
                     ") and is not ignore_index " + std::to_string(ignore_index_));
  }
}

void SoftmaxCrossEntropy::begin_rows(const Tensor& targets, std::int64_t classes) {
  release_saved();
  gradient_in_logits_ = false;
  const Device device = targets.device();
  targets_ = targets.to(device, DType::I64).contiguous().view({targets.numel()});
  rows_classes_ = classes;
  const std::int64_t rows = targets_.numel();
  if (device.is_cuda()) {
    row_lse_ = Tensor::empty({rows}, DType::F32, device);
    row_loss_ = Tensor::empty({rows}, DType::F32, device);
    row_flags_ = Tensor::empty({rows}, DType::I32, device);
    counted_ = Tensor::empty({}, DType::F32, device);
    correct_ = Tensor::empty({}, DType::F32, device);
    if (!invalid_.defined() || invalid_.device() != device) {
      invalid_ = Tensor::zeros({}, DType::I32, device);
    }
    cuda::softmax_cross_entropy_count(targets_, classes, ignore_index_, counted_);
    return;
  }
  const std::int64_t* t = targets_.data<std::int64_t>();
  double counted = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    if (t[r] == ignore_index_) continue;
    check_target(t[r], r, classes);
    counted += 1;
  }
  counted_ = Tensor::scalar(counted, DType::F32);
  row_loss_ = Tensor::zeros({rows}, DType::F64);
  row_flags_ = Tensor::zeros({rows}, DType::I32);
}

void SoftmaxCrossEntropy::forward_rows_with_gradient(Context& ctx, const Tensor& logits,
                                                     std::int64_t first_row) {
  KILN_CHECK(row_loss_.defined(), "SoftmaxCrossEntropy: rows before begin_rows");
  const std::int64_t classes = rows_classes_;
  KILN_CHECK(logits.dim() == 2 && logits.size(1) == classes && logits.stride(1) == 1 &&
                 first_row >= 0 && first_row + logits.size(0) <= targets_.numel(),
             "SoftmaxCrossEntropy: rows " + logits.str() + " from row " +
                 std::to_string(first_row) + " do not fit the batch's " +
                 std::to_string(targets_.numel()) + " rows of " + std::to_string(classes));
  check_scale_divisor(ctx.step);
  Tensor x = logits;
  if (x.device().is_cuda()) {
    cuda::softmax_cross_entropy_fused_rows(x, targets_, first_row, label_smoothing_, ignore_index_,
                                           ctx.step.loss_scale, ctx.step.loss_scale_divisor,
                                           loss_rows(ctx.step.loss_rows), row_lse_, row_loss_,
                                           row_flags_, x);
    loss_rows_ = ctx.step.loss_rows;
    return;
  }
  const std::int64_t* t = targets_.data<std::int64_t>() + first_row;
  double* loss = row_loss_.data<double>() + first_row;
  std::int32_t* flags = row_flags_.data<std::int32_t>() + first_row;
  const double factor = cpu_gradient_scale(ctx.step) / cpu_loss_rows(ctx.step.loss_rows);
  loss_rows_ = ctx.step.loss_rows;
  const std::int64_t ld = x.stride(0);
  KILN_DISPATCH_FLOATING(x.dtype(), T, {
    T* data = x.data<T>();
    for (std::int64_t r = 0; r < x.size(0); ++r) {
      T* row = data + r * ld;
      const bool ignored = t[r] == ignore_index_;
      const RowStats st = row_stats(row, classes);
      if (!ignored) {
        loss[r] = row_loss(st, cpu::load(row[t[r]]), classes, label_smoothing_);
        flags[r] = st.argmax == t[r] ? 2 : 1;
      }
      row_gradient(row, row, classes, st.lse, t[r], ignored, label_smoothing_, factor);
    }
  });
}

Tensor SoftmaxCrossEntropy::finish_rows() {
  KILN_CHECK(row_loss_.defined(), "SoftmaxCrossEntropy: finish_rows before begin_rows");
  Tensor loss;
  if (row_loss_.device().is_cuda()) {
    loss = Tensor::empty({}, DType::F32, row_loss_.device());
    cuda::softmax_cross_entropy_finish(row_loss_, row_flags_, loss, counted_, correct_, invalid_);
  } else {
    // The sum in row order, as compute_loss forms it.
    const double* l = row_loss_.data<double>();
    const std::int32_t* f = row_flags_.data<std::int32_t>();
    double total = 0, correct = 0;
    for (std::int64_t r = 0; r < row_loss_.numel(); ++r) {
      if (f[r] == 0) continue;
      total += l[r];
      if (f[r] == 2) correct += 1;
    }
    correct_ = Tensor::scalar(correct, DType::F32);
    loss = Tensor::scalar(total / std::max(counted_.item(), 1.0), DType::F32);
  }
  row_loss_ = Tensor();
  row_flags_ = Tensor();
  release_saved();
  return over_loss_rows(loss, std::exchange(loss_rows_, nullptr));
}

void SoftmaxCrossEntropy::check_targets() {
  if (!invalid_.defined()) return;  // the CPU path throws in forward
  double bad = invalid_.item();
  if (bad > 0) {
    invalid_.zero();
    throw InputError("SoftmaxCrossEntropy: " + std::to_string(static_cast<long long>(bad)) +
                     " target(s) outside [0, classes) and not ignore_index " +
                     std::to_string(ignore_index_) + " since the last check (their loss is NaN)");
  }
}

}  // namespace kiln
