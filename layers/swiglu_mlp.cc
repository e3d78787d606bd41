#include "layers/swiglu_mlp.h"

#include <cmath>

#include "core/cpu/element.h"
#include "core/ops.h"
#include "layers/activations.h"
#include "layers/cuda/swiglu_cuda.h"

namespace kiln {

namespace swiglu_ops {

void forward(const Tensor& g, const Tensor& u, Tensor& a) {
  if (g.device().is_cuda()) {
    DeviceGuard guard(g.device());
    cuda::swiglu_forward(g, u, a);
    return;
  }
  KILN_DISPATCH_FLOATING(g.dtype(), T, {
    using C = typename cpu::Compute<T>::type;
    const T* pg = g.data<T>();
    const T* pu = u.data<T>();
    T* pa = a.data<T>();
    for (std::int64_t i = 0; i < g.numel(); ++i) {
      C s, one_minus_s;
      const C x = cpu::load(pg[i]);
      sigmoid_pair(x, s, one_minus_s);
      pa[i] = cpu::store<T>(x * s * cpu::load(pu[i]));
    }
  });
}

void backward(const Tensor& da, const Tensor& g, const Tensor& u, Tensor& dg, Tensor& du) {
  if (g.device().is_cuda()) {
    DeviceGuard guard(g.device());
    cuda::swiglu_backward(da, g, u, dg, du);
    return;
  }
  KILN_DISPATCH_FLOATING(g.dtype(), T, {
    using C = typename cpu::Compute<T>::type;
    const T* pda = da.data<T>();
    const T* pg = g.data<T>();
    const T* pu = u.data<T>();
    T* pdg = dg.data<T>();
    T* pdu = du.data<T>();
    for (std::int64_t i = 0; i < g.numel(); ++i) {
      C s, one_minus_s;
      const C x = cpu::load(pg[i]), d = cpu::load(pda[i]);
      sigmoid_pair(x, s, one_minus_s);
      pdg[i] = cpu::store<T>(d * cpu::load(pu[i]) * s * (C(1) + x * one_minus_s));
      pdu[i] = cpu::store<T>(d * x * s);
    }
  });
}

}  // namespace swiglu_ops

SwiGluMlp::SwiGluMlp(std::int64_t hidden, std::int64_t intermediate)
    : hidden_(hidden), intermediate_(intermediate) {
  gate_ = &add_child("gate_proj", std::make_unique<Linear>(hidden, intermediate, false));
  up_ = &add_child("up_proj", std::make_unique<Linear>(hidden, intermediate, false));
  down_ = &add_child("down_proj", std::make_unique<Linear>(intermediate, hidden, false));
}

double SwiGluMlp::forward_flops(const Shape& input) const {
  return 3 * 2 * static_cast<double>(shape_numel(input) / hidden_) * hidden_ * intermediate_;
}

Tensor SwiGluMlp::forward_impl(Context& ctx, const Tensor& x) {
  KILN_CHECK(
      x.dim() >= 1 && x.size(-1) == hidden_,
      "SwiGluMlp " + name() + ": expected (..., " + std::to_string(hidden_) + "), got " + x.str());
  gate_out_ = gate_->forward(ctx, x).contiguous();
  up_out_ = up_->forward(ctx, x).contiguous();
  Tensor a = Tensor::empty(gate_out_.shape(), gate_out_.dtype(), gate_out_.device());
  swiglu_ops::forward(gate_out_, up_out_.to(gate_out_.dtype()), a);
  return down_->forward(ctx, a);
}

Tensor SwiGluMlp::backward_impl(Context& ctx, const Tensor& dy) {
  KILN_CHECK(gate_out_.defined(), "SwiGluMlp " + name() + ": backward before forward");
  Tensor da = down_->backward(ctx, dy).to(gate_out_.dtype()).contiguous();
  Tensor dg = Tensor::empty(gate_out_.shape(), gate_out_.dtype(), gate_out_.device());
  Tensor du = Tensor::empty(gate_out_.shape(), gate_out_.dtype(), gate_out_.device());
  swiglu_ops::backward(da, gate_out_, up_out_, dg, du);
  Tensor dx = gate_->backward(ctx, dg);
  Tensor dx_up = up_->backward(ctx, du);
  ops::add(dx, dx_up.to(dx.dtype()), dx);
  return dx;
}

}  // namespace kiln
