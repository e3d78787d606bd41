#include "layers/batchnorm.h"

#include <cmath>
#include <vector>

#include "core/ops.h"
#include "layers/conv2d.h"
#include "layers/cuda/batchnorm_cuda.h"
#include "layers/relu.h"

namespace kiln {

BatchNorm2d::BatchNorm2d(std::int64_t channels, double eps, double momentum)
    : channels_(channels), eps_(eps), momentum_(momentum) {
  if (channels <= 0 || !(eps > 0) || !(momentum >= 0 && momentum <= 1)) {
    throw InputError("BatchNorm2d: channels must be positive, eps positive, momentum in [0, 1]");
  }
  weight_ = &add_parameter("weight", {channels}, /*no_weight_decay=*/true, /*fp32_in_half=*/true);
  bias_ = &add_parameter("bias", {channels}, /*no_weight_decay=*/true, /*fp32_in_half=*/true);
  running_mean_ = &add_buffer("running_mean", {channels}, 0.0);
  running_var_ = &add_buffer("running_var", {channels}, 1.0);
  num_batches_tracked_ = &add_buffer("num_batches_tracked", {}, 0.0);
  if (!ParameterShapesOnly::active()) reset_parameters(0);
}

Shape BatchNorm2d::output_shape(const Shape& input) const {
  if (input.size() != 4 || input[1] != channels_) {
    throw InputError("BatchNorm2d " + name() + ": expected (N, " + std::to_string(channels_) +
                     ", H, W), got " + shape_str(input));
  }
  return input;
}

double BatchNorm2d::forward_flops(const Shape& input) const {
  return 4.0 * static_cast<double>(shape_numel(input));
}

void BatchNorm2d::reset_parameters(std::uint64_t seed) {
  (void)seed;
  weight_->value.fill(1.0);
  bias_->value.fill(0.0);
  running_mean_->value.fill(0.0);
  running_var_->value.fill(1.0);
  num_batches_tracked_->value.fill(0.0);
}

void BatchNorm2d::count_batch() {
  Tensor& nbt = num_batches_tracked_->value;
  if (!one_.defined() || one_.device() != nbt.device() || one_.dtype() != nbt.dtype()) {
    one_ = Tensor::full(nbt.shape(), 1.0, nbt.dtype(), nbt.device());
  }
  ops::axpy(1.0, one_, nbt);
}

namespace {

// Element (o, c, i) of a physical tensor is at (o * C + c) * inner + i: NCHW has outer = N and
// inner = H * W; NHWC has outer = N * H * W and inner = 1.
struct ChannelLayout {
  std::int64_t outer, channels, inner;
  std::int64_t count() const { return outer * inner; }
};

ChannelLayout layout_of(const Shape& logical, bool channels_last) {
  const std::int64_t plane = logical[2] * logical[3];
  return channels_last ? ChannelLayout{logical[0] * plane, logical[1], 1}
                       : ChannelLayout{logical[0], logical[1], plane};
}

Tensor f64_vector(const std::vector<double>& v) {
  return Tensor::from_vector(v, {static_cast<std::int64_t>(v.size())});
}

template <typename T>
void normalize_cpu(const T* x, const ChannelLayout& l, const std::vector<double>& mean,
                   const std::vector<double>& invstd, const std::vector<double>& w,
                   const std::vector<double>& b, T* y) {
  for (std::int64_t o = 0; o < l.outer; ++o)
    for (std::int64_t c = 0; c < l.channels; ++c) {
      const double scale = invstd[c] * w[c], shift = b[c] - mean[c] * scale;
      const std::int64_t base = (o * l.channels + c) * l.inner;
      for (std::int64_t i = 0; i < l.inner; ++i) {
        y[base + i] = static_cast<T>(static_cast<double>(x[base + i]) * scale + shift);
      }
    }
}

}  // namespace

Tensor BatchNorm2d::forward_impl(Context& ctx, const Tensor& x) {
  output_shape(x.shape());
  const bool cl = ctx.run.channels_last;
  const bool batch_stats = training();
  const ChannelLayout l = layout_of(x.shape(), cl);
  if (batch_stats && l.count() <= 1) {
    throw InputError("BatchNorm2d " + name() +
                     ": training needs more than one value per channel, got input " +
                     shape_str(x.shape()));
  }
  saved_channels_last_ = cl;
  saved_batch_stats_ = batch_stats;
  saved_input_dtype_ = x.dtype();
  Tensor& nbt = num_batches_tracked_->value;

  if (x.device().is_cuda()) {
    KILN_CHECK(x.dtype() != DType::F64, "BatchNorm2d on CUDA runs in f32, f16 or bf16");
    Tensor xp = to_physical(x, cl);
    Tensor yp = Tensor::empty(xp.shape(), xp.dtype(), xp.device());
    saved_mean_ = Tensor::empty({channels_}, DType::F32, x.device());
    saved_invstd_ = Tensor::empty({channels_}, DType::F32, x.device());
    if (batch_stats) {
      // A recomputed forward (activation recomputation) has counted this batch already.
      const bool update_running = !ctx.recomputing;
      batchnorm_cuda::forward_training(xp, weight_->value, bias_->value, cl, eps_, momentum_,
                                       update_running, running_mean_->value, running_var_->value,
                                       yp, saved_mean_, saved_invstd_, fused_relu_);
      if (update_running) count_batch();
    } else {
      saved_mean_ = running_mean_->value;
      batchnorm_cuda::forward_inference(xp, weight_->value, bias_->value, cl, eps_,
                                        running_mean_->value, running_var_->value, yp,
                                        saved_invstd_, fused_relu_);
    }
    saved_x_ = xp;
    return from_physical(yp, cl);
  }

  // CPU: halves compute in f32, statistics in f64.
  const DType cd = x.dtype() == DType::F64 ? DType::F64 : DType::F32;
  Tensor xp = to_physical(x, cl).to(cd);
  const std::int64_t n = l.count();
  std::vector<double> mean(channels_, 0.0), var(channels_, 0.0), invstd(channels_);
  if (batch_stats) {
    auto stats = [&](auto tag) {
      using T = decltype(tag);
      const T* px = xp.data<T>();
      for (std::int64_t o = 0; o < l.outer; ++o)
        for (std::int64_t c = 0; c < l.channels; ++c) {
          const T* row = px + (o * l.channels + c) * l.inner;
          double s = 0;
          for (std::int64_t i = 0; i < l.inner; ++i) s += row[i];
          mean[c] += s;
        }
      for (auto& m : mean) m /= static_cast<double>(n);
      for (std::int64_t o = 0; o < l.outer; ++o)
        for (std::int64_t c = 0; c < l.channels; ++c) {
          const T* row = px + (o * l.channels + c) * l.inner;
          double s = 0;
          for (std::int64_t i = 0; i < l.inner; ++i) s += (row[i] - mean[c]) * (row[i] - mean[c]);
          var[c] += s;
        }
      for (auto& v : var) v /= static_cast<double>(n);
    };
    if (cd == DType::F64)
      stats(double{});
    else
      stats(float{});
    if (!ctx.recomputing) {  // a recomputed forward has counted this batch already
      std::vector<double> rm = running_mean_->value.to_vector<double>();
      std::vector<double> rv = running_var_->value.to_vector<double>();
      const double unbiased = static_cast<double>(n) / static_cast<double>(n - 1);
      for (std::int64_t c = 0; c < channels_; ++c) {
        rm[c] = (1 - momentum_) * rm[c] + momentum_ * mean[c];
        rv[c] = (1 - momentum_) * rv[c] + momentum_ * var[c] * unbiased;
      }
      running_mean_->value.copy_from(f64_vector(rm));
      running_var_->value.copy_from(f64_vector(rv));
      nbt.fill(nbt.item() + 1);
    }
  } else {
    mean = running_mean_->value.to_vector<double>();
    var = running_var_->value.to_vector<double>();
  }
  for (std::int64_t c = 0; c < channels_; ++c) invstd[c] = 1.0 / std::sqrt(var[c] + eps_);
  std::vector<double> w = weight_->value.to_vector<double>(), b = bias_->value.to_vector<double>();
  Tensor yp = Tensor::empty(xp.shape(), cd);
  if (cd == DType::F64) {
    normalize_cpu(xp.data<double>(), l, mean, invstd, w, b, yp.data<double>());
  } else {
    normalize_cpu(xp.data<float>(), l, mean, invstd, w, b, yp.data<float>());
  }
  saved_x_ = xp;
  saved_mean_ = f64_vector(mean);
  saved_invstd_ = f64_vector(invstd);
  Tensor out = yp.to(x.dtype());
  if (fused_relu_) {
    relu_cpu::forward(out, out);  // the ReLU layer's rule on the stored value
    saved_y_ = out;
  }
  return from_physical(out, cl);
}

Tensor BatchNorm2d::backward_impl(Context& ctx, const Tensor& dy) {
  (void)ctx;
  KILN_CHECK(saved_x_.defined(), "BatchNorm2d " + name() + ": backward without forward");
  const bool cl = saved_channels_last_;
  if (dy.device().is_cuda()) {
    Tensor dyp = to_physical(dy, cl).to(saved_x_.dtype());
    Tensor dxp = Tensor::empty(saved_x_.shape(), saved_x_.dtype(), dy.device());
    batchnorm_cuda::backward(saved_x_, dyp, weight_->value, bias_->value, saved_mean_,
                             saved_invstd_, cl, saved_batch_stats_, fused_relu_, dxp, weight_->grad,
                             bias_->grad);
    return from_physical(dxp, cl);
  }
  const DType cd = saved_x_.dtype();
  Tensor dyp = to_physical(dy, cl);
  if (fused_relu_) {
    // The ReLU's backward on dy in its own dtype, as the ReLU layer does.
    KILN_CHECK(saved_y_.defined(), "BatchNorm2d " + name() + ": backward without forward");
    Tensor g = dyp.to(saved_y_.dtype());
    dyp = Tensor::empty(g.shape(), g.dtype());
    relu_cpu::backward(saved_y_, g, dyp);
  }
  dyp = dyp.to(cd);
  const Shape logical = from_physical(saved_x_, cl).shape();
  const ChannelLayout l = layout_of(logical, cl);
  const double n = static_cast<double>(l.count());
  std::vector<double> mean = saved_mean_.to_vector<double>(),
                      invstd = saved_invstd_.to_vector<double>(),
                      w = weight_->value.to_vector<double>();
  std::vector<double> sum_dy(channels_, 0.0), sum_dy_xhat(channels_, 0.0);
  Tensor dxp = Tensor::empty(saved_x_.shape(), cd);
  auto run = [&](auto tag) {
    using T = decltype(tag);
    const T* px = saved_x_.data<T>();
    const T* pd = dyp.data<T>();
    T* pdx = dxp.data<T>();
    for (std::int64_t o = 0; o < l.outer; ++o)
      for (std::int64_t c = 0; c < l.channels; ++c) {
        const std::int64_t base = (o * l.channels + c) * l.inner;
        double s = 0, sx = 0;
        for (std::int64_t i = 0; i < l.inner; ++i) {
          s += pd[base + i];
          sx += pd[base + i] * (px[base + i] - mean[c]);
        }
        sum_dy[c] += s;
        sum_dy_xhat[c] += sx * invstd[c];
      }
    for (std::int64_t o = 0; o < l.outer; ++o)
      for (std::int64_t c = 0; c < l.channels; ++c) {
        const std::int64_t base = (o * l.channels + c) * l.inner;
        const double k = w[c] * invstd[c];
        const double mean_dy = saved_batch_stats_ ? sum_dy[c] / n : 0.0;
        const double mean_dy_xhat = saved_batch_stats_ ? sum_dy_xhat[c] / n : 0.0;
        for (std::int64_t i = 0; i < l.inner; ++i) {
          const double xhat = (px[base + i] - mean[c]) * invstd[c];
          pdx[base + i] = static_cast<T>(k * (pd[base + i] - mean_dy - xhat * mean_dy_xhat));
        }
      }
  };
  if (cd == DType::F64)
    run(double{});
  else
    run(float{});
  ops::axpy(1.0, f64_vector(sum_dy_xhat).to(weight_->grad.dtype()), weight_->grad);
  ops::axpy(1.0, f64_vector(sum_dy).to(bias_->grad.dtype()), bias_->grad);
  return from_physical(dxp.to(saved_input_dtype_), cl);
}

}  // namespace kiln
