#include "layers/dropout.h"

#include "core/cpu/element.h"
#include "layers/cuda/dropout_cuda.h"

namespace kiln {
namespace {

// out = in * keep * scale; the same pass serves forward (x) and backward (dy).
void cpu_dropout_apply(const Tensor& in, Tensor& out, std::uint64_t key, std::uint64_t step,
                       double p, double scale) {
  KILN_DISPATCH_FLOATING(in.dtype(), TI, {
    KILN_DISPATCH_FLOATING(out.dtype(), TO, {
      const TI* src = in.data<TI>();
      TO* dst = out.data<TO>();
      using C = typename cpu::Compute<TI>::type;
      C s = static_cast<C>(scale);
      for (std::int64_t i = 0, n = in.numel(); i < n; ++i) {
        bool keep = dropout_keep(key, step, static_cast<std::uint64_t>(i), p);
        dst[i] = cpu::store<TO>(keep ? static_cast<C>(cpu::load(src[i])) * s : C(0));
      }
    });
  });
}

// The step is read at `step` (memory of in's device) as the pass runs.
void dropout_apply(const Tensor& in, Tensor& out, std::uint64_t key, const std::uint64_t* step,
                   double p, double scale) {
  if (in.device().is_cuda()) {
    cuda::dropout_apply(in, out, key, 0, step, p, scale);
  } else {
    cpu_dropout_apply(in, out, key, *step, p, scale);
  }
}

}  // namespace

Dropout::Dropout(double p) : p_(p) {
  if (!(p >= 0.0 && p <= 1.0)) {
    throw InputError("Dropout: probability " + std::to_string(p) + " is not in [0, 1]");
  }
}

Tensor Dropout::forward_impl(Context& ctx, const Tensor& x) {  // (...) -> (...)
  input_shape_ = x.shape();
  applied_ = ctx.training && training() && p_ > 0.0;
  if (!applied_) {
    return x.dtype() == ctx.run.precision.activation ? x : x.to(ctx.run.precision.activation);
  }
  key_ = mask_key(ctx);
  step_ = ctx.step.step;
  KILN_CHECK(step_ != nullptr,
             "Dropout " + name() + ": training without the step counter (Context::step.step)");
  Tensor in = x.contiguous();
  Tensor y = Tensor::empty(x.shape(), ctx.run.precision.activation, x.device());
  // p == 1 drops everything (PyTorch returns zeros rather than 0 * inf).
  double scale = p_ < 1.0 ? 1.0 / (1.0 - p_) : 0.0;
  dropout_apply(in, y, key_, step_, p_, scale);
  return y;
}

Tensor Dropout::backward_impl(Context& ctx, const Tensor& dy) {
  (void)ctx;
  KILN_CHECK(dy.shape() == input_shape_,
             "Dropout " + name() + ": dy " + dy.str() + " for input " + shape_str(input_shape_));
  if (!applied_) return dy;
  Tensor g = dy.contiguous();
  Tensor dx = Tensor::empty(g.shape(), g.dtype(), g.device());
  double scale = p_ < 1.0 ? 1.0 / (1.0 - p_) : 0.0;
  dropout_apply(g, dx, key_, step_, p_, scale);
  return dx;
}

}  // namespace kiln
