#include "layers/activations.h"

#include "core/cpu/element.h"
#include "layers/cuda/activations_cuda.h"

namespace kiln {

const char* activation_name(Activation a) {
  switch (a) {
    case Activation::None:
      return "none";
    case Activation::ReLU:
      return "relu";
    case Activation::GELU:
      return "gelu_tanh";
    case Activation::GELUErf:
      return "gelu_erf";
  }
  return "?";
}

namespace {

Activation gelu_activation(GeluForm form) {
  return form == GeluForm::Erf ? Activation::GELUErf : Activation::GELU;
}

// Host elementwise passes over contiguous tensors; f64 computes in f64, the rest in f32.
void cpu_activation_forward(Activation act, const Tensor& x, Tensor& y) {
  KILN_DISPATCH_FLOATING(x.dtype(), TX, {
    KILN_DISPATCH_FLOATING(y.dtype(), TY, {
      const TX* in = x.data<TX>();
      TY* out = y.data<TY>();
      using C = typename cpu::Compute<TX>::type;
      for (std::int64_t i = 0, n = x.numel(); i < n; ++i) {
        out[i] = cpu::store<TY>(activation_apply<C>(act, static_cast<C>(cpu::load(in[i]))));
      }
    });
  });
}

void cpu_activation_backward(Activation act, const Tensor& x, const Tensor& dy, Tensor& dx) {
  KILN_DISPATCH_FLOATING(x.dtype(), TX, {
    KILN_DISPATCH_FLOATING(dy.dtype(), TD, {
      const TX* in = x.data<TX>();
      const TD* g = dy.data<TD>();
      TD* out = dx.data<TD>();
      using C = typename cpu::Compute<TX>::type;
      for (std::int64_t i = 0, n = x.numel(); i < n; ++i) {
        C grad = activation_grad<C>(act, static_cast<C>(cpu::load(in[i])));
        out[i] = cpu::store<TD>(static_cast<C>(cpu::load(g[i])) * grad);
      }
    });
  });
}

}  // namespace

Tensor GELU::forward_impl(Context& ctx, const Tensor& x) {  // (...) -> (...)
  saved_input_ = x.contiguous();
  Tensor y = Tensor::empty(x.shape(), ctx.run.precision.activation, x.device());
  if (x.device().is_cuda()) {
    cuda::activation_forward(gelu_activation(form_), saved_input_, y);
  } else {
    cpu_activation_forward(gelu_activation(form_), saved_input_, y);
  }
  return y;
}

Tensor GELU::backward_impl(Context& ctx, const Tensor& dy) {
  (void)ctx;
  KILN_CHECK(saved_input_.defined(), "GELU " + name() + ": backward without forward");
  KILN_CHECK(dy.shape() == saved_input_.shape(),
             "GELU " + name() + ": dy " + dy.str() + " for input " + saved_input_.str());
  Tensor g = dy.contiguous();
  Tensor dx = Tensor::empty(g.shape(), g.dtype(), g.device());
  if (g.device().is_cuda()) {
    cuda::activation_backward(gelu_activation(form_), saved_input_, g, dx);
  } else {
    cpu_activation_backward(gelu_activation(form_), saved_input_, g, dx);
  }
  return dx;
}

}  // namespace kiln
