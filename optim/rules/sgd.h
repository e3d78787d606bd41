#pragma once
// SGD as torch.optim.SGD: momentum, dampening, Nesterov, weight decay added to the gradient.

#include <string>
#include <vector>

#include "core/check.h"
#include "optim/optimizer_options.h"
#include "optim/update_rules.h"

namespace kiln::optim {

struct SgdRule {
  static constexpr const char* kName = "sgd";
  static constexpr int kStates = 1;  // momentum_buffer
  static constexpr bool kTrustRatio = false;

  double lr = 0;
  double momentum = 0;
  double dampening = 0;
  bool nesterov = false;
  bool first_step = true;        // the momentum buffer starts as the gradient
  double grad_multiplier = 1.0;  // gradient clipping coefficient
  float grad_unscale = 1.0f;
  std::int64_t steps_done = 0;  // completed steps: the stream of bf16 state rounding
  detail::ResidentFields resident;

  static void check(const OptimizerOptions& o) {
    if (o.momentum < 0) throw InputError("sgd momentum must be >= 0");
    if (o.nesterov && (o.momentum <= 0 || o.dampening != 0)) {
      throw InputError("sgd nesterov needs momentum > 0 and dampening 0 (as torch.optim.SGD)");
    }
  }
  static std::vector<std::string> state_keys(const OptimizerOptions& o) {
    if (o.momentum == 0) return {};
    return {"momentum_buffer"};
  }
  static SgdRule from_options(const OptimizerOptions& o) {
    SgdRule r;
    r.momentum = o.momentum;
    r.dampening = o.dampening;
    r.nesterov = o.nesterov;
    return r;
  }
  // The per-step fields that follow the completed steps and the gradient norm (host and device).
  KILN_HOST_DEVICE void load_counts(std::int64_t completed_steps, double grad_norm,
                                    double max_grad_norm) {
    first_step = completed_steps == 0;
    steps_done = completed_steps;
    grad_multiplier = detail::clip_coefficient(grad_norm, max_grad_norm);
  }

  template <typename C>
  struct Scalars {
    C neg_lr, weight_decay, momentum, one_minus_dampening, grad_multiplier, grad_unscale;
    bool nesterov, first_step, use_momentum;
  };

  template <typename C>
  KILN_HOST_DEVICE Scalars<C> scalars(const detail::TensorEntry& e) const {
    Scalars<C> r;
    r.neg_lr = static_cast<C>(-(lr * e.lr_multiplier));
    r.weight_decay = static_cast<C>(e.weight_decay);
    r.momentum = static_cast<C>(momentum);
    r.one_minus_dampening = static_cast<C>(1.0 - dampening);
    r.grad_multiplier = static_cast<C>(grad_multiplier);
    r.grad_unscale = static_cast<C>(grad_unscale);
    r.nesterov = nesterov;
    r.first_step = first_step;
    r.use_momentum = momentum != 0.0;
    return r;
  }

  // One element: p the weight, g the gradient as stored, state[0] the momentum buffer.
  template <typename C>
  KILN_HOST_DEVICE static void element(C& p, C g, C* state, const Scalars<C>& s) {
    g = detail::unscale_grad(g, s.grad_unscale);
    if (s.grad_multiplier != C(1)) g = g * s.grad_multiplier;
    if (s.weight_decay != C(0)) g = g + s.weight_decay * p;  // grad.add(param, alpha=wd)
    if (s.use_momentum) {
      C& buf = state[0];
      buf = s.first_step ? g : buf * s.momentum + s.one_minus_dampening * g;
      g = s.nesterov ? g + s.momentum * buf : buf;
    }
    p = p + s.neg_lr * g;  // param.add_(grad, alpha=-lr)
  }
};

}  // namespace kiln::optim
