#pragma once
// AdamW as torch.optim.AdamW (single-tensor path): decoupled weight decay, bias correction,
// AMSGrad.

#include <string>
#include <vector>

#include "optim/optimizer_options.h"
#include "optim/rules/betas.h"
#include "optim/update_rules.h"

namespace kiln::optim {

struct AdamWRule {
  static constexpr const char* kName = "adamw";
  static constexpr int kStates = 3;  // exp_avg, exp_avg_sq, max_exp_avg_sq
  static constexpr bool kTrustRatio = false;

  double lr = 0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  std::int64_t step = 1;  // after incrementing, as torch
  bool amsgrad = false;
  double grad_multiplier = 1.0;
  float grad_unscale = 1.0f;
  std::int64_t steps_done = 0;  // completed steps: the stream of bf16 state rounding
  detail::ResidentFields resident;

  static void check(const OptimizerOptions& o) { check_betas(o, kName); }
  static std::vector<std::string> state_keys(const OptimizerOptions& o) {
    if (o.amsgrad) return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
    return {"exp_avg", "exp_avg_sq"};
  }
  static AdamWRule from_options(const OptimizerOptions& o) {
    AdamWRule r = with_betas<AdamWRule>(o);
    r.amsgrad = o.amsgrad;
    return r;
  }
  KILN_HOST_DEVICE void load_counts(std::int64_t completed_steps, double grad_norm,
                                    double max_grad_norm) {
    step = completed_steps + 1;
    steps_done = completed_steps;
    grad_multiplier = detail::clip_coefficient(grad_norm, max_grad_norm);
  }

  template <typename C>
  struct Scalars {
    C decay_factor, one_minus_beta1, beta2, one_minus_beta2, bias_correction2_sqrt, eps,
        neg_step_size, grad_multiplier, grad_unscale;
    bool amsgrad;
  };

  template <typename C>
  KILN_HOST_DEVICE Scalars<C> scalars(const detail::TensorEntry& e) const {
    double tensor_lr = lr * e.lr_multiplier;
    double bias_correction1 = 1.0 - detail::power(beta1, static_cast<double>(step));
    double bias_correction2 = 1.0 - detail::power(beta2, static_cast<double>(step));
    Scalars<C> r;
    r.decay_factor = static_cast<C>(1.0 - tensor_lr * e.weight_decay);
    r.one_minus_beta1 = static_cast<C>(1.0 - beta1);
    r.beta2 = static_cast<C>(beta2);
    r.one_minus_beta2 = static_cast<C>(1.0 - beta2);
    r.bias_correction2_sqrt = static_cast<C>(detail::square_root(bias_correction2));
    r.eps = static_cast<C>(eps);
    r.neg_step_size = static_cast<C>(-(tensor_lr / bias_correction1));
    r.grad_multiplier = static_cast<C>(grad_multiplier);
    r.grad_unscale = static_cast<C>(grad_unscale);
    r.amsgrad = amsgrad;
    return r;
  }

  // One element: state = {exp_avg, exp_avg_sq, max_exp_avg_sq (AMSGrad only)}.
  template <typename C>
  KILN_HOST_DEVICE static void element(C& p, C g, C* state, const Scalars<C>& s) {
    C& m = state[0];
    C& v = state[1];
    g = detail::unscale_grad(g, s.grad_unscale);
    if (s.grad_multiplier != C(1)) g = g * s.grad_multiplier;
    p = p * s.decay_factor;                           // param.mul_(1 - lr * wd)
    m = detail::lerp_torch(m, g, s.one_minus_beta1);  // exp_avg.lerp_(grad, 1 - beta1)
    v = v * s.beta2;                                  // exp_avg_sq.mul_(beta2)
    v = v + s.one_minus_beta2 * g * g;                // .addcmul_(grad, grad, value=1 - beta2)
    C second = v;
    if (s.amsgrad) {
      if (v > state[2]) state[2] = v;
      second = state[2];
    }
    C denom = detail::square_root(second) / s.bias_correction2_sqrt + s.eps;
    p = p + s.neg_step_size * m / denom;  // param.addcdiv_(exp_avg, denom, value=-step_size)
  }
};

}  // namespace kiln::optim
