#include "layers/layernorm.h"

#include <cmath>
#include <utility>

#include "core/cpu/element.h"
#include "core/ops.h"
#include "layers/cuda/layernorm_cuda.h"

namespace kiln {

LayerNorm::LayerNorm(std::int64_t normalized_size, double eps)
    : LayerNorm(normalized_size, eps, /*centered=*/true) {}

LayerNorm::LayerNorm(std::int64_t normalized_size, double eps, bool centered)
    : size_(normalized_size), eps_(eps), centered_(centered) {
  KILN_CHECK(normalized_size > 0, "LayerNorm: normalized size must be positive");
  weight_ = &add_parameter("weight", {size_}, /*no_weight_decay=*/true, /*fp32_in_half=*/true);
  if (centered_) bias_ = &add_parameter("bias", {size_}, true, true);
  if (!ParameterShapesOnly::active()) LayerNorm::reset_parameters(0);
}

void LayerNorm::reset_parameters(std::uint64_t) {
  weight_->value.fill(1.0);
  if (bias_) bias_->value.fill(0.0);
}

namespace {

// Statistics type: f64 for f64 activations, fp32 otherwise.
DType stats_dtype(DType x) {
  return x == DType::F64 ? DType::F64 : DType::F32;
}

// b == nullptr: RMSNorm (the mean held at 0, no bias).
template <typename T, typename C>
void forward_rows(const T* x, const C* w, const C* b, double eps, std::int64_t rows,
                  std::int64_t cols, T* y, C* mean_out, C* rstd_out) {
  using cpu::load;
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    C sum = 0;
    if (b != nullptr)
      for (std::int64_t c = 0; c < cols; ++c) sum += load(xr[c]);
    C mean = sum / static_cast<C>(cols);
    C var = 0;
    for (std::int64_t c = 0; c < cols; ++c) {
      C d = load(xr[c]) - mean;
      var += d * d;
    }
    var /= static_cast<C>(cols);
    C rstd = static_cast<C>(1) / std::sqrt(var + static_cast<C>(eps));
    for (std::int64_t c = 0; c < cols; ++c)
      y[r * cols + c] = cpu::store<T>((load(xr[c]) - mean) * rstd * w[c] + (b ? b[c] : C(0)));
    mean_out[r] = mean;
    rstd_out[r] = rstd;
  }
}

// centered false: RMSNorm (mean is 0, no mean(g) term).
template <typename T, typename C>
void backward_rows(const T* dy, const T* x, const C* w, const C* mean, const C* rstd,
                   const T* residual_grad, bool centered, std::int64_t rows, std::int64_t cols,
                   T* dx, C* dw, C* db) {
  using cpu::load;
  for (std::int64_t c = 0; c < cols; ++c) dw[c] = db[c] = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    const T* dyr = dy + r * cols;
    // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w.
    C sum_g = 0, sum_g_xhat = 0;
    for (std::int64_t c = 0; c < cols; ++c) {
      C xhat = (load(xr[c]) - mean[r]) * rstd[r];
      C g = load(dyr[c]) * w[c];
      sum_g += g;
      sum_g_xhat += g * xhat;
      dw[c] += load(dyr[c]) * xhat;
      db[c] += load(dyr[c]);
    }
    C mean_g = centered ? sum_g / static_cast<C>(cols) : C(0);
    C mean_g_xhat = sum_g_xhat / static_cast<C>(cols);
    for (std::int64_t c = 0; c < cols; ++c) {
      C xhat = (load(xr[c]) - mean[r]) * rstd[r];
      C g = load(dyr[c]) * w[c];
      C v = rstd[r] * (g - mean_g - xhat * mean_g_xhat);
      if (residual_grad) v += load(residual_grad[r * cols + c]);
      dx[r * cols + c] = cpu::store<T>(v);
    }
  }
}

}  // namespace

Tensor LayerNorm::forward_impl(Context& ctx, const Tensor& x) {
  (void)ctx;
  KILN_CHECK(x.dim() >= 1 && x.size(-1) == size_, "LayerNorm " + name() + ": expected (..., " +
                                                      std::to_string(size_) + "), got " + x.str());
  KILN_CHECK(is_floating(x.dtype()),
             "LayerNorm " + name() + ": floating input expected, got " + x.str());
  std::int64_t rows = x.numel() / size_;
  DType sd = stats_dtype(x.dtype());
  Tensor xc = x.contiguous().view({rows, size_});
  Tensor delta;
  std::swap(delta, pending_delta_);
  residual_sum_ = Tensor();
  if (delta.defined()) {
    KILN_CHECK(delta.numel() == x.numel(), "LayerNorm " + name() + ": residual delta " +
                                               delta.str() + " does not match the input " +
                                               x.str());
    delta = delta.to(x.device(), x.dtype()).contiguous().view({rows, size_});
    residual_sum_ = Tensor::empty({rows, size_}, x.dtype(), x.device());
  }
  Tensor w = weight_->value.to(x.device(), sd);
  Tensor b = bias_ ? bias_->value.to(x.device(), sd) : Tensor();
  Tensor y = Tensor::empty({rows, size_}, x.dtype(), x.device());
  saved_mean_ = Tensor::empty({rows}, sd, x.device());
  saved_rstd_ = Tensor::empty({rows}, sd, x.device());
  if (x.device().is_cuda()) {
    DeviceGuard guard(x.device());
    cuda::layernorm_forward(xc, delta, w, b, eps_, y, residual_sum_, saved_mean_, saved_rstd_);
  } else {
    if (delta.defined()) {
      ops::add(xc, delta, residual_sum_);  // rounded to x's dtype, then normalised
      xc = residual_sum_;
    }
    KILN_DISPATCH_FLOATING(x.dtype(), T, {
      using C = typename cpu::Compute<T>::type;
      forward_rows<T, C>(xc.data<T>(), w.data<C>(), b.defined() ? b.data<C>() : nullptr, eps_, rows,
                         size_, y.data<T>(), saved_mean_.data<C>(), saved_rstd_.data<C>());
    });
  }
  saved_x_ = delta.defined() ? residual_sum_ : xc;
  if (residual_sum_.defined()) residual_sum_ = residual_sum_.view(x.shape());
  return y.view(x.shape());
}

void LayerNorm::accumulate_parameter_grads(const Tensor& dw, const Tensor& db) {
  if (weight_->frozen) return;  // frozen with the model (LoRA): the pass computed them anyway
  ops::accumulate(weight_->grad, dw);
  if (bias_) ops::accumulate(bias_->grad, db);
}

Tensor LayerNorm::backward_impl(Context& ctx, const Tensor& dy) {
  (void)ctx;
  KILN_CHECK(saved_x_.defined(), "LayerNorm " + name() + ": backward before forward");
  KILN_CHECK(dy.numel() == saved_x_.numel(), "LayerNorm " + name() + ": dy " + dy.str() +
                                                 " does not match the input " + saved_x_.str());
  std::int64_t rows = saved_x_.size(0);
  DType sd = saved_mean_.dtype();
  Tensor dyc = dy.to(saved_x_.dtype()).contiguous().view({rows, size_});
  Tensor residual_grad;
  std::swap(residual_grad, pending_residual_grad_);
  if (residual_grad.defined()) {
    KILN_CHECK(residual_grad.numel() == dy.numel(), "LayerNorm " + name() + ": residual gradient " +
                                                        residual_grad.str() +
                                                        " does not match dy " + dy.str());
    residual_grad =
        residual_grad.to(dy.device(), saved_x_.dtype()).contiguous().view({rows, size_});
  }
  Tensor w = weight_->value.to(dy.device(), sd);
  Tensor dx = Tensor::empty({rows, size_}, saved_x_.dtype(), dy.device());
  if (dy.device().is_cuda()) {
    DeviceGuard guard(dy.device());
    // Straight into the parameters' gradients when they have the statistics' type.
    auto direct = [&](const Tensor& grad) {
      return grad.dtype() == sd && grad.is_contiguous() && grad.device() == dy.device();
    };
    if (!weight_->frozen && direct(weight_->grad) && (!bias_ || direct(bias_->grad))) {
      Tensor no_bias;
      cuda::layernorm_backward(dyc, saved_x_, w, saved_mean_, saved_rstd_, residual_grad, dx,
                               weight_->grad, bias_ ? bias_->grad : no_bias, /*accumulate=*/true);
      return dx.view(dy.shape());
    }
    Tensor dw = Tensor::empty({size_}, sd, dy.device());
    Tensor db = bias_ ? Tensor::empty({size_}, sd, dy.device()) : Tensor();
    cuda::layernorm_backward(dyc, saved_x_, w, saved_mean_, saved_rstd_, residual_grad, dx, dw, db,
                             /*accumulate=*/false);
    accumulate_parameter_grads(dw, db);
    return dx.view(dy.shape());
  }
  Tensor dw = Tensor::empty({size_}, sd, dy.device()), db = Tensor::empty({size_}, sd, dy.device());
  KILN_DISPATCH_FLOATING(saved_x_.dtype(), T, {
    using C = typename cpu::Compute<T>::type;
    backward_rows<T, C>(dyc.data<T>(), saved_x_.data<T>(), w.data<C>(), saved_mean_.data<C>(),
                        saved_rstd_.data<C>(),
                        residual_grad.defined() ? residual_grad.data<T>() : nullptr, centered_,
                        rows, size_, dx.data<T>(), dw.data<C>(), db.data<C>());
  });
  accumulate_parameter_grads(dw, db);
  return dx.view(dy.shape());
}

}  // namespace kiln
