#include "layers/softmax_cross_entropy.h"

#include <cmath>
#include <limits>

#include "core/cpu/element.h"
#include "layers/cuda/softmax_cross_entropy_cuda.h"

namespace kiln {

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
  if (logits_.device().is_cuda()) {
    check_scale_divisor(ctx.step);
    Tensor loss = Tensor::empty({}, DType::F32, logits_.device());
    gradient_in_logits_ = cuda::softmax_cross_entropy_fused(
        logits_, targets_, label_smoothing_, ignore_index_, ctx.step.loss_scale,
        ctx.step.loss_scale_divisor, row_lse_, loss, counted_, correct_, invalid_, logits_);
    if (gradient_in_logits_) return loss;
  }
  return compute_loss();
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
  double eps = label_smoothing_;
  const std::int64_t ld = logits_.stride(0);
  KILN_DISPATCH_FLOATING(logits_.dtype(), T, {
    const T* x = logits_.data<T>();
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* row = x + r * ld;
      double max = -std::numeric_limits<double>::infinity(), sum_x = 0;
      std::int64_t argmax = 0;
      for (std::int64_t c = 0; c < classes; ++c) {
        double v = cpu::load(row[c]);
        if (v > max) {
          max = v;
          argmax = c;
        }
        sum_x += v;
      }
      double sum_exp = 0;
      for (std::int64_t c = 0; c < classes; ++c) sum_exp += std::exp(cpu::load(row[c]) - max);
      double lse = max + std::log(sum_exp);
      lse_out[r] = lse;
      if (t[r] == ignore_index_) continue;
      if (t[r] < 0 || t[r] >= classes) {
        throw InputError("SoftmaxCrossEntropy: target " + std::to_string(t[r]) + " of row " +
                         std::to_string(r) + " is outside [0, " + std::to_string(classes) +
                         ") and is not ignore_index " + std::to_string(ignore_index_));
      }
      double nll = lse - static_cast<double>(cpu::load(row[t[r]]));
      double smooth = lse - sum_x / static_cast<double>(classes);
      total += (1.0 - eps) * nll + eps * smooth;
      counted += 1;
      if (argmax == t[r]) correct += 1;
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
  // Without a loss scale in memory the scale is 1 (the same division, so the same bits).
  double scale = 1.0 / static_cast<double>(step.loss_scale_divisor);
  std::int64_t rows = logits_.size(0), classes = logits_.size(1);
  Tensor dlogits = reuse_logits ? logits_
                                : Tensor::empty({rows, classes}, logits_.dtype(),
                                                logits_.device());  // (N, C)
  if (logits_.device().is_cuda()) {
    cuda::softmax_cross_entropy_backward(logits_, targets_, label_smoothing_, ignore_index_,
                                         row_lse_, counted_, scale, step.loss_scale,
                                         step.loss_scale_divisor, dlogits);
    release_saved();
    return dlogits.reshape(logits_shape_);
  }
  const double* lse = row_lse_.data<double>();
  const std::int64_t* t = targets_.data<std::int64_t>();
  double eps = label_smoothing_;
  if (step.loss_scale != nullptr) {
    scale = *step.loss_scale / static_cast<double>(step.loss_scale_divisor);
  }
  double factor = scale / std::max(counted_.item(), 1.0);
  const std::int64_t ld = logits_.stride(0), ld_out = dlogits.stride(0);
  KILN_DISPATCH_FLOATING(logits_.dtype(), T, {
    const T* x = logits_.data<T>();
    T* dx = dlogits.data<T>();
    for (std::int64_t r = 0; r < rows; ++r) {
      bool ignored = t[r] == ignore_index_;
      for (std::int64_t c = 0; c < classes; ++c) {
        double g = 0;
        if (!ignored) {
          double p = std::exp(static_cast<double>(cpu::load(x[r * ld + c])) - lse[r]);
          g = factor * (p - (c == t[r] ? 1.0 - eps : 0.0) - eps / static_cast<double>(classes));
        }
        dx[r * ld_out + c] = cpu::store<T>(g);
      }
    }
  });
  release_saved();
  return dlogits.reshape(logits_shape_);
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
