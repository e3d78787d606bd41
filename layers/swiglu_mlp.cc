#include "layers/swiglu_mlp.h"

#include <cmath>

#include "core/cpu/element.h"
#include "core/ops.h"
#include "layers/activations.h"
#include "layers/attention.h"
#include "layers/cuda/swiglu_cuda.h"

namespace kiln {

namespace swiglu_ops {

void forward(const Tensor& gate_up, Tensor& a) {
  if (gate_up.device().is_cuda()) {
    DeviceGuard guard(gate_up.device());
    cuda::swiglu_forward(gate_up, a);
    return;
  }
  const std::int64_t rows = a.size(0), inner = a.size(1);
  KILN_DISPATCH_FLOATING(a.dtype(), T, {
    using C = typename cpu::Compute<T>::type;
    const T* pgu = gate_up.data<T>();
    T* pa = a.data<T>();
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t j = 0; j < inner; ++j) {
        C s, one_minus_s;
        const C g = cpu::load(pgu[r * 2 * inner + j]),
                u = cpu::load(pgu[r * 2 * inner + inner + j]);
        sigmoid_pair(g, s, one_minus_s);
        pa[r * inner + j] = cpu::store<T>(g * s * u);
      }
  });
}

void backward(const Tensor& da, const Tensor& gate_up, Tensor& dgate_up) {
  if (gate_up.device().is_cuda()) {
    DeviceGuard guard(gate_up.device());
    cuda::swiglu_backward(da, gate_up, dgate_up);
    return;
  }
  const std::int64_t rows = da.size(0), inner = da.size(1);
  KILN_DISPATCH_FLOATING(da.dtype(), T, {
    using C = typename cpu::Compute<T>::type;
    const T* pda = da.data<T>();
    const T* pgu = gate_up.data<T>();
    T* pd = dgate_up.data<T>();
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t j = 0; j < inner; ++j) {
        C s, one_minus_s;
        const C g = cpu::load(pgu[r * 2 * inner + j]),
                u = cpu::load(pgu[r * 2 * inner + inner + j]);
        const C d = cpu::load(pda[r * inner + j]);
        sigmoid_pair(g, s, one_minus_s);
        pd[r * 2 * inner + j] = cpu::store<T>(d * u * s * (C(1) + g * one_minus_s));
        pd[r * 2 * inner + inner + j] = cpu::store<T>(d * g * s);
      }
  });
}

}  // namespace swiglu_ops

SwiGluMlp::SwiGluMlp(std::int64_t hidden, std::int64_t intermediate, const LoraOptions& lora)
    : hidden_(hidden), intermediate_(intermediate) {
  gate_ = &add_parameter("gate_proj.weight", {intermediate, hidden});
  up_ = &add_parameter("up_proj.weight", {intermediate, hidden});
  down_ = &add_child("down_proj", std::make_unique<Linear>(intermediate, hidden, false));
  if (!ParameterShapesOnly::active()) SwiGluMlp::reset_parameters(0);
  const char* names[2] = {"gate_proj", "up_proj"};
  for (int i = 0; i < 2; ++i)
    if (lora.targets_module(names[i]))
      adapters_[i] =
          &add_child(names[i], std::make_unique<LowRankAdapter>(hidden, intermediate, lora));
  if (lora.targets_module("down_proj")) down_->add_adapter(lora);
}

void SwiGluMlp::use_fp8(const Fp8Settings& settings) {
  if (!settings.enabled) return;
  fp8_gate_up_ = std::make_unique<Fp8Projection>(
      add_buffer("fp8_gate_up_scaling", Fp8Projection::state_shape(settings)), settings);
  down_->use_fp8(settings);
}

void SwiGluMlp::reset_parameters(std::uint64_t seed) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(hidden_));
  ops::fill_uniform(gate_->value, -bound, bound, seed * 1000003ull + 1);
  ops::fill_uniform(up_->value, -bound, bound, seed * 1000003ull + 2);
  down_->reset_parameters(seed * 1000003ull + 3);
}

double SwiGluMlp::forward_flops(const Shape& input) const {
  return 3 * 2 * static_cast<double>(shape_numel(input) / hidden_) * hidden_ * intermediate_;
}

Tensor SwiGluMlp::forward_impl(Context& ctx, const Tensor& x) {
  KILN_CHECK(x.dim() >= 1 && x.size(-1) == hidden_ && is_floating(x.dtype()),
             "SwiGluMlp " + name() + ": expected floating (..., " + std::to_string(hidden_) +
                 "), got " + x.str());
  const std::int64_t n = x.numel() / hidden_;
  activation_ = x.dtype();
  const DType mm = transformer_ops::matmul_dtype(ctx, activation_);
  x_mm_ = x.contiguous().view({n, hidden_}).to(mm);
  gate_up_ = Tensor::empty({n, 2 * intermediate_}, activation_, x.device());
  project_forward(fp8_gate_up_.get(), ctx, x_mm_, stack_rows({&gate_->value, &up_->value}, mm),
                  gate_up_);
  for (std::int64_t i = 0; i < 2; ++i) {
    if (adapters_[i] == nullptr) continue;
    adapters_[i]->add_to_next_output(gate_up_.slice(1, i * intermediate_, (i + 1) * intermediate_));
    adapters_[i]->forward(ctx, x_mm_);
  }
  Tensor a = Tensor::empty({n, intermediate_}, activation_, x.device());
  swiglu_ops::forward(gate_up_, a);
  Shape inner = x.shape();
  inner.back() = intermediate_;
  return down_->forward(ctx, a.view(inner));
}

Tensor SwiGluMlp::backward_impl(Context& ctx, const Tensor& dy) {
  KILN_CHECK(gate_up_.defined(), "SwiGluMlp " + name() + ": backward before forward");
  const std::int64_t n = gate_up_.size(0);
  const Device dev = gate_up_.device();
  const DType mm = x_mm_.dtype();
  Tensor da = down_->backward(ctx, dy).to(activation_).contiguous().view({n, intermediate_});
  Tensor dgate_up = Tensor::empty({n, 2 * intermediate_}, activation_, dev);
  swiglu_ops::backward(da, gate_up_, dgate_up);
  Tensor d_mm = dgate_up.to(mm);
  Tensor dw;  // gate and up are frozen together (LoRA's base)
  if (!gate_->frozen) dw = Tensor::zeros({2 * intermediate_, hidden_}, gate_->grad.dtype(), dev);
  Tensor dx = Tensor::empty({n, hidden_}, activation_, dev);
  project_backward(fp8_gate_up_.get(), x_mm_, stack_rows({&gate_->value, &up_->value}, mm), d_mm,
                   dw, dx);
  if (dw.defined()) {
    ops::accumulate(gate_->grad, dw.slice(0, 0, intermediate_));
    ops::accumulate(up_->grad, dw.slice(0, intermediate_, 2 * intermediate_));
  }
  for (std::int64_t i = 0; i < 2; ++i) {
    if (adapters_[i] == nullptr) continue;
    adapters_[i]->add_to_next_dx(dx);
    adapters_[i]->backward(ctx, d_mm.slice(1, i * intermediate_, (i + 1) * intermediate_));
  }
  Shape shape = dy.shape();
  shape.back() = hidden_;
  return dx.view(shape);
}

}  // namespace kiln
