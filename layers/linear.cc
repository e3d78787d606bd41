#include "layers/linear.h"

#include <cmath>
#include <optional>
#include <utility>

#include "core/cpu/element.h"
#include "core/gemm_tally.h"
#include "core/ops.h"
#include "layers/cuda/activations_cuda.h"
#include "layers/cuda/linear_cuda.h"

namespace kiln {
namespace {

// z (M, out) += bias (out), then act in place; host, contiguous, z in f32 or f64.
template <typename C>
void cpu_bias_activation(Tensor& z, const Tensor& bias, Activation act, Tensor& y) {
  C* pz = z.data<C>();
  C* py = y.data<C>();
  std::int64_t rows = z.size(0), cols = z.size(1);
  const C* pb = bias.defined() ? bias.data<C>() : nullptr;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) {
      C v = pz[r * cols + c] + (pb ? pb[c] : C(0));
      pz[r * cols + c] = v;
      py[r * cols + c] = activation_apply<C>(act, v);
    }
  }
}

// dz = dy * act'(saved) elementwise (ReLU's saved is y, whose sign is z's).
template <typename C>
void cpu_activation_grad(const Tensor& dy, const Tensor& saved, Activation act, Tensor& dz) {
  const C* g = dy.data<C>();
  const C* s = saved.data<C>();
  C* out = dz.data<C>();
  for (std::int64_t i = 0, n = dy.numel(); i < n; ++i)
    out[i] = g[i] * activation_grad<C>(act, s[i]);
}

}  // namespace

Linear::Linear(std::int64_t in_features, std::int64_t out_features, bool bias,
               Activation activation)
    : in_features_(in_features), out_features_(out_features), activation_(activation) {
  if (in_features <= 0 || out_features <= 0) {
    throw InputError("Linear: features must be positive, got in=" + std::to_string(in_features) +
                     " out=" + std::to_string(out_features));
  }
  weight_ = &add_parameter("weight", {out_features, in_features});
  if (bias) bias_ = &add_parameter("bias", {out_features}, /*no_weight_decay=*/true);
  if (!ParameterShapesOnly::active()) reset_parameters(0);
}

Shape Linear::output_shape(const Shape& input) const {
  KILN_CHECK(!input.empty() && input.back() == in_features_,
             "Linear " + name() + ": input " + shape_str(input) + " does not end in " +
                 std::to_string(in_features_));
  Shape out = input;
  out.back() = out_features_;
  return out;
}

double Linear::forward_flops(const Shape& input) const {
  double rows = static_cast<double>(shape_numel(input)) / static_cast<double>(in_features_);
  return 2.0 * rows * static_cast<double>(in_features_) * static_cast<double>(out_features_);
}

void Linear::reset_parameters(std::uint64_t seed) {
  double bound = 1.0 / std::sqrt(static_cast<double>(in_features_));
  std::uint64_t base = seed * 0x9E3779B97F4A7C15ull + 0x1234567ull;
  ops::fill_uniform(weight_->value, -bound, bound, base);
  if (bias_) ops::fill_uniform(bias_->value, -bound, bound, base + 1);
  weight_cache_.clear();
  bias_cache_.clear();
}

void Linear::add_adapter(const LoraOptions& options) {
  KILN_CHECK(activation_ == Activation::None && adapter_ == nullptr,
             "Linear: a LoRA adapter needs a projection without activation and without one");
  adapter_ = &add_child("", std::make_unique<LowRankAdapter>(in_features_, out_features_, options));
}

void Linear::use_fp8(const Fp8Settings& settings) {
  if (!settings.enabled) return;
  fp8_ = std::make_unique<Fp8Projection>(
      add_buffer("fp8_scaling", Fp8Projection::state_shape(settings)), settings);
}

Tensor Linear::forward_impl(Context& ctx, const Tensor& x) {  // (N..., in) -> (N..., out)
  Shape out_shape = output_shape(x.shape());
  KILN_CHECK(x.device() == weight_->value.device(), "Linear " + name() + ": input on " +
                                                        x.device().str() + " but weights on " +
                                                        weight_->value.device().str());
  input_shape_ = x.shape();
  dy_is_preactivation_ = false;
  std::int64_t rows = x.numel() / in_features_;
  DType out_dtype = ctx.run.precision.activation;
  output_dtype_ = out_dtype;
  Tensor residual;
  std::swap(residual, pending_residual_);
  if (residual.defined()) {
    KILN_CHECK(residual.numel() == rows * out_features_, "Linear " + name() + ": residual " +
                                                             residual.str() + " for output " +
                                                             shape_str(out_shape));
    residual = residual.to(x.device(), out_dtype).contiguous().view({rows, out_features_});
  }
  if (x.device().is_cuda()) {
    DType mm = ctx.run.precision.matmul;
    saved_input_ = x.to(mm).contiguous().view({rows, in_features_});         // (M, in)
    Tensor y = Tensor::empty({rows, out_features_}, out_dtype, x.device());  // (M, out)
    Tensor bias = bias_ ? bias_as(ctx, out_dtype) : Tensor();
    const Tensor& w = weight_as(ctx, mm);
    std::optional<cuda::Fp8Forward> fp8;
    if (fp8_ && fp8_->begin_forward(ctx, rows, in_features_, out_features_)) {
      DeviceGuard guard(x.device());
      fp8 = cuda::fp8_forward_operands(*fp8_, saved_input_, w, ctx.recomputing);
    }
    cuda::linear_forward(saved_input_, w, bias, activation_, y, saved_activation_, saved_ld_,
                         residual, fp8 ? &*fp8 : nullptr);
    if (adapter_ != nullptr) {
      adapter_->add_to_next_output(y);
      adapter_->forward(ctx, saved_input_);
    }
    return y.view(out_shape);
  }
  // CPU: f64 when asked for, f32 otherwise (halves convert).
  DType compute = (out_dtype == DType::F64 || x.dtype() == DType::F64) ? DType::F64 : DType::F32;
  saved_input_ = x.to(compute).contiguous().view({rows, in_features_});  // (M, in)
  Tensor w = weight_->value.to(compute).contiguous();                    // (out, in)
  Tensor z = Tensor::empty({rows, out_features_}, compute);              // (M, out)
  if (fp8_ && fp8_->begin_forward(ctx, rows, in_features_, out_features_)) {
    // The CPU twin: the GEMM of the FP8 casts' values (saved_input_ stays x itself).
    const bool record = !ctx.recomputing;
    Fp8GemmScope fp8_gemm;  // counted as FP8 (core/gemm_tally.h)
    Tensor wq = fp8_->emulate(Fp8Projection::Weight, w, record);
    ops::gemm(false, true, 1.0, fp8_->emulate(Fp8Projection::Input, saved_input_, record), wq, 0.0,
              z);
  } else {
    ops::gemm(false, true, 1.0, saved_input_, w, 0.0, z);
  }
  saved_activation_ = Tensor();
  saved_ld_ = out_features_;
  Tensor y = z;
  if (bias_ || activation_ != Activation::None) {
    Tensor b = bias_ ? bias_->value.to(compute).contiguous() : Tensor();
    y = activation_ == Activation::None ? z : Tensor::empty(z.shape(), compute);
    if (compute == DType::F64)
      cpu_bias_activation<double>(z, b, activation_, y);
    else
      cpu_bias_activation<float>(z, b, activation_, y);
  }
  if (activation_ == Activation::ReLU) saved_activation_ = y;
  if (activation_ == Activation::GELU || activation_ == Activation::GELUErf) saved_activation_ = z;
  y = y.to(out_dtype);
  if (residual.defined()) {
    Tensor sum = Tensor::empty(y.shape(), out_dtype);
    ops::add(y, residual, sum);  // rounded to the output dtype, then added, as the block did
    y = sum;
  }
  if (adapter_ != nullptr) {
    adapter_->add_to_next_output(y);
    adapter_->forward(ctx, saved_input_);
  }
  return y.view(out_shape);
}

bool Linear::can_take_preactivation_grad() const {
  return activation_ == Activation::GELU && saved_activation_.defined() &&
         saved_activation_.device().is_cuda() && is_half(saved_input_.dtype()) &&
         saved_activation_.dtype() == saved_input_.dtype();
}

bool Linear::can_recompute_output() const {
  return (activation_ == Activation::GELU || activation_ == Activation::GELUErf) &&
         saved_activation_.defined() && saved_activation_.device().is_cuda() &&
         saved_ld_ == out_features_ && saved_activation_.dtype() == saved_input_.dtype() &&
         output_dtype_ == saved_input_.dtype();
}

Tensor Linear::recompute_output() const {
  KILN_CHECK(can_recompute_output(), "Linear " + name() + ": no output to recompute");
  Tensor z = saved_activation_.view({-1, out_features_});  // (M, out)
  Tensor y = Tensor::empty(z.shape(), z.dtype(), z.device());
  DeviceGuard guard(z.device());
  cuda::activation_forward(activation_, z, y);
  return y;
}

Tensor Linear::backward_impl(Context& ctx, const Tensor& dy) {
  KILN_CHECK(saved_input_.defined(), "Linear " + name() + ": backward without forward");
  std::int64_t rows = saved_input_.size(0);
  KILN_CHECK(dy.numel() == rows * out_features_ && dy.size(-1) == out_features_,
             "Linear " + name() + ": dy " + dy.str() + " for input " + shape_str(input_shape_));
  if (dy.device().is_cuda()) {
    Tensor g = dy.contiguous().view({rows, out_features_});                    // (M, out)
    Tensor dx = Tensor::empty({rows, in_features_}, dy.dtype(), dy.device());  // (M, in)
    // dy already went through this layer's activation when the consumer's epilogue applied it.
    const Activation act = dy_is_preactivation_ ? Activation::None : activation_;
    dy_is_preactivation_ = false;
    cuda::InputActivation input;
    const bool fuse_input = producer_ != nullptr && producer_->can_take_preactivation_grad();
    if (fuse_input) {
      input.act = producer_->activation_;
      input.saved = producer_->saved_activation_;
      input.saved_ld = producer_->saved_ld_;
    }
    Tensor no_grad;
    if (cuda::linear_backward(
            saved_input_, weight_as(ctx, saved_input_.dtype()), g, act, saved_activation_,
            saved_ld_, weight_->frozen ? no_grad : weight_->grad,
            bias_ && !bias_->frozen ? &bias_->grad : nullptr, dx, fuse_input ? &input : nullptr,
            fp8_ && fp8_->active() ? fp8_.get() : nullptr))
      producer_->dy_is_preactivation_ = true;
    if (adapter_ != nullptr) {
      adapter_->add_to_next_dx(dx);
      adapter_->backward(ctx, g);
    }
    return dx.view(input_shape_);
  }
  DType compute = saved_input_.dtype();
  Tensor g = dy.to(compute).contiguous().view({rows, out_features_});  // (M, out)
  Tensor dz = g;
  if (activation_ != Activation::None) {
    dz = Tensor::empty(g.shape(), compute);
    if (compute == DType::F64)
      cpu_activation_grad<double>(g, saved_activation_, activation_, dz);
    else
      cpu_activation_grad<float>(g, saved_activation_, activation_, dz);
  }
  if (bias_ && !bias_->frozen)
    ops::accumulate(bias_->grad, ops::reduce_cols(dz, ops::Reduction::Sum));
  Tensor w = weight_->value.to(compute).contiguous();
  Tensor x = saved_input_, dz_mm = dz;
  std::optional<Fp8GemmScope> fp8_gemms;
  if (fp8_ && fp8_->active()) {  // the CPU twin: the GEMMs of the FP8 casts' values
    fp8_gemms.emplace();
    dz_mm = fp8_->emulate(Fp8Projection::Gradient, dz, true);
    x = fp8_->emulate(Fp8Projection::Input, saved_input_, false);
    w = fp8_->emulate(Fp8Projection::Weight, w, false);
  }
  // weight.grad += dz^T x: straight into the grad when it has the compute dtype.
  if (!weight_->frozen) ops::gemm_accumulate(true, false, dz_mm, x, weight_->grad);
  Tensor dx = Tensor::empty({rows, in_features_}, compute);  // (M, in) = dz (M, out) W (out, in)
  ops::gemm(false, false, 1.0, dz_mm, w, 0.0, dx);
  fp8_gemms.reset();  // the adapter's GEMMs are not FP8
  if (adapter_ != nullptr) {
    adapter_->add_to_next_dx(dx);
    adapter_->backward(ctx, dz);
  }
  return dx.to(dy.dtype()).view(input_shape_);
}

}  // namespace kiln
