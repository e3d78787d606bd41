#pragma once
// LAMB (You et al. 2019, as Apex FusedLAMB with decoupled weight decay): Adam moments, then each
// tensor's update scaled by its trust ratio ||w|| / ||update||. The ratio needs whole-tensor sums,
// so the passes run in stages (multi_tensor.h): moments and sums, ratios, the update.

#include <string>
#include <vector>

#include "optim/optimizer_options.h"
#include "optim/rules/betas.h"
#include "optim/update_rules.h"

namespace kiln::optim {

struct LambRule {
  static constexpr const char* kName = "lamb";
  static constexpr int kStates = 2;  // exp_avg, exp_avg_sq
  static constexpr bool kTrustRatio = true;

  double lr = 0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-6;
  std::int64_t step = 1;
  bool bias_correction = true;
  double clip_divisor = 1.0;  // max(1, global_norm / max_grad_norm), Apex FusedLAMB
  float grad_unscale = 1.0f;
  std::int64_t steps_done = 0;  // completed steps: the stream of bf16 state rounding
  detail::ResidentFields resident;

  static void check(const OptimizerOptions& o) { check_betas(o, kName); }
  static std::vector<std::string> state_keys(const OptimizerOptions&) {
    return {"exp_avg", "exp_avg_sq"};
  }
  static LambRule from_options(const OptimizerOptions& o) {
    LambRule r = with_betas<LambRule>(o);
    r.bias_correction = o.bias_correction;
    return r;
  }
  KILN_HOST_DEVICE void load_counts(std::int64_t completed_steps, double grad_norm,
                                    double max_grad_norm) {
    step = completed_steps + 1;
    steps_done = completed_steps;
    clip_divisor = detail::lamb_clip_divisor(grad_norm, max_grad_norm);
  }

  template <typename C>
  struct Scalars {
    C beta1, one_minus_beta1, beta2, one_minus_beta2, bias_correction1, bias_correction2, eps,
        weight_decay, lr, inv_clip_divisor, grad_unscale;
  };

  template <typename C>
  KILN_HOST_DEVICE Scalars<C> scalars(const detail::TensorEntry& e) const {
    Scalars<C> r;
    r.beta1 = static_cast<C>(beta1);
    r.one_minus_beta1 = static_cast<C>(1.0 - beta1);
    r.beta2 = static_cast<C>(beta2);
    r.one_minus_beta2 = static_cast<C>(1.0 - beta2);
    r.bias_correction1 = static_cast<C>(
        bias_correction ? 1.0 - detail::power(beta1, static_cast<double>(step)) : 1.0);
    r.bias_correction2 = static_cast<C>(
        bias_correction ? 1.0 - detail::power(beta2, static_cast<double>(step)) : 1.0);
    r.eps = static_cast<C>(eps);
    r.weight_decay = static_cast<C>(e.weight_decay);
    r.lr = static_cast<C>(lr * e.lr_multiplier);
    r.inv_clip_divisor = static_cast<C>(1.0 / clip_divisor);
    r.grad_unscale = static_cast<C>(grad_unscale);
    return r;
  }

  // Stage 1: moments from the (unscaled, clipped) gradient; the trust ratio follows from them.
  template <typename C>
  KILN_HOST_DEVICE static void moments(C g, C& m, C& v, const Scalars<C>& s) {
    g = detail::unscale_grad(g, s.grad_unscale) * s.inv_clip_divisor;
    m = s.beta1 * m + s.one_minus_beta1 * g;
    v = s.beta2 * v + s.one_minus_beta2 * g * g;
  }

  // The update direction; recomputed from (p, m, v) in the last stage so it is never stored.
  template <typename C>
  KILN_HOST_DEVICE static C update(C p, C m, C v, const Scalars<C>& s) {
    C m_hat = m / s.bias_correction1;
    C v_hat = v / s.bias_correction2;
    return m_hat / (detail::square_root(v_hat) + s.eps) + s.weight_decay * p;
  }

  // The trust ratio ||w|| / ||update||, 1 where either is 0 or the tensor is not adapted.
  template <typename C>
  KILN_HOST_DEVICE static C trust_ratio(double param_sumsq, double update_sumsq, bool adapt) {
    if (!adapt || param_sumsq <= 0.0 || update_sumsq <= 0.0) return C(1);
    return static_cast<C>(detail::square_root(param_sumsq) / detail::square_root(update_sumsq));
  }
};

}  // namespace kiln::optim
