#pragma once
// The per-element update rules of every optimizer, written once for the CPU loops and the CUDA
// multi-tensor kernels (host + device). Step scalars arrive in double and each tensor's scalars
// are derived in double, then rounded once to the compute type, in the order PyTorch's
// torch.optim rounds them; the element arithmetic then follows torch's operation order, so the
// CPU backend, the CUDA backend (built with --fmad=false) and torch agree to rounding.

#include <cmath>
#include <cstdint>

#include "core/host_device.h"
#include "optim/step_state.h"

namespace kiln::optim::detail {

// One tensor the multi-tensor passes visit. Plain data: the same bytes are read on the device.
struct TensorEntry {
  void* value = nullptr;   // the weights updated (fp32 masters in O2); in unscale: the output grads
  void* grad = nullptr;    // read only by the optimizers (half in O2); in unscale: the scaled input
  void* copy = nullptr;    // half model weights refreshed from `value` after the update (O2)
  void* state0 = nullptr;  // exp_avg or momentum_buffer (f32; f64 for f64 weights on CPU)
  void* state1 = nullptr;  // exp_avg_sq
  void* state2 = nullptr;  // max_exp_avg_sq (AMSGrad)
  std::int64_t numel = 0;
  double lr_multiplier = 1.0;
  double weight_decay = 0.0;
  std::int32_t value_dtype = 0;  // kiln::DType as an integer
  std::int32_t grad_dtype = 0;
  std::int32_t copy_dtype = 0;
  std::int32_t adapt = 1;  // LAMB: apply the trust ratio (0 for no_weight_decay parameters)
  std::int32_t first_chunk = 0;
  std::int32_t chunk_count = 0;
};

// A contiguous piece of one tensor handled by one CUDA block.
struct ChunkEntry {
  std::int32_t tensor = 0;
  std::int32_t unused = 0;
  std::int64_t start = 0;
  std::int64_t count = 0;
};

constexpr std::int64_t kChunkElements = 32768;

// Resident mode (optim/step_state.h): a step with `state` set takes its per-step scalars (lr, step
// count, clipping from the norm, grad_unscale when `unscale_from_state`) from the StepState when
// the kernel runs, and does nothing when the state says skip. nullptr: the by-value fields hold.
struct ResidentFields {
  const StepState* state = nullptr;
  double max_grad_norm = 0.0;  // the clipping setting the coefficient is computed from
  bool unscale_from_state = false;
};

// Every step carries `grad_unscale`: each gradient element is loaded, widened to the compute type
// and multiplied by it, the arithmetic of the unscale pass (multi_tensor.h), so that O2 reads the
// loss-scaled half gradients directly instead of keeping unscaled fp32 copies. It is a float
// (1/loss_scale, as the pass uses it), exact in either compute type; at 1 nothing is multiplied.

struct SgdStep {
  double lr = 0;
  double momentum = 0;
  double dampening = 0;
  bool nesterov = false;
  bool first_step = true;        // the momentum buffer starts as the gradient
  double grad_multiplier = 1.0;  // gradient clipping coefficient
  float grad_unscale = 1.0f;
  ResidentFields resident;
};

struct AdamWStep {
  double lr = 0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  std::int64_t step = 1;  // after incrementing, as torch
  bool amsgrad = false;
  double grad_multiplier = 1.0;
  float grad_unscale = 1.0f;
  ResidentFields resident;
};

struct LambStep {
  double lr = 0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-6;
  std::int64_t step = 1;
  bool bias_correction = true;
  double clip_divisor = 1.0;  // max(1, global_norm / max_grad_norm), Apex FusedLAMB
  float grad_unscale = 1.0f;
  ResidentFields resident;
};

template <typename C>
KILN_HOST_DEVICE inline C square_root(C x) {
#ifdef __CUDA_ARCH__
  return sqrt(x);
#else
  return std::sqrt(x);
#endif
}

template <typename C>
KILN_HOST_DEVICE inline bool finite(C x) {
#ifdef __CUDA_ARCH__
  return isfinite(x);
#else
  return std::isfinite(x);
#endif
}

KILN_HOST_DEVICE inline double power(double x, double y) {
#ifdef __CUDA_ARCH__
  return pow(x, y);
#else
  return std::pow(x, y);
#endif
}

// torch.nn.utils.clip_grad_norm_'s coefficient min(1, max / (norm + 1e-6)), computed in float as
// torch does; 1 for a non-finite norm or no clipping.
KILN_HOST_DEVICE inline double clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0 || !finite(norm)) return 1.0;
  float coef = static_cast<float>(max_norm) / (static_cast<float>(norm) + 1e-6f);
  return coef < 1.0f ? coef : 1.0;
}

// Apex FusedLAMB's divisor max(1, norm / max), in double; 1 for a non-finite norm or no clipping.
KILN_HOST_DEVICE inline double lamb_clip_divisor(double norm, double max_norm) {
  return max_norm > 0 && finite(norm) && norm > max_norm ? norm / max_norm : 1.0;
}

// Resident mode: overwrites the step's per-step fields from the state, exactly as the host fills
// them (Sgd/AdamW/Lamb::apply). Returns false when the step is skipped: do nothing.
KILN_HOST_DEVICE inline bool load_resident(SgdStep& s) {
  if (s.resident.state == nullptr) return true;
  const StepState& st = *s.resident.state;
  if (st.skip) return false;
  s.lr = st.lr;
  s.first_step = st.optimizer_steps == 0;
  s.grad_multiplier = clip_coefficient(st.grad_norm, s.resident.max_grad_norm);
  s.grad_unscale = s.resident.unscale_from_state ? st.inv_scale : 1.0f;
  return true;
}

KILN_HOST_DEVICE inline bool load_resident(AdamWStep& s) {
  if (s.resident.state == nullptr) return true;
  const StepState& st = *s.resident.state;
  if (st.skip) return false;
  s.lr = st.lr;
  s.step = st.optimizer_steps + 1;
  s.grad_multiplier = clip_coefficient(st.grad_norm, s.resident.max_grad_norm);
  s.grad_unscale = s.resident.unscale_from_state ? st.inv_scale : 1.0f;
  return true;
}

KILN_HOST_DEVICE inline bool load_resident(LambStep& s) {
  if (s.resident.state == nullptr) return true;
  const StepState& st = *s.resident.state;
  if (st.skip) return false;
  s.lr = st.lr;
  s.step = st.optimizer_steps + 1;
  s.clip_divisor = lamb_clip_divisor(st.grad_norm, s.resident.max_grad_norm);
  s.grad_unscale = s.resident.unscale_from_state ? st.inv_scale : 1.0f;
  return true;
}

// The gradient as the optimizers see it: unscaled exactly as the unscale pass would have stored
// it in a float (or double) gradient.
template <typename C>
KILN_HOST_DEVICE inline C unscale_grad(C g, C grad_unscale) {
  return grad_unscale != C(1) ? g * grad_unscale : g;
}

// torch.lerp's formula (at::native lerp): exact at both ends.
template <typename C>
KILN_HOST_DEVICE inline C lerp_torch(C self, C end, C weight) {
  return (weight < C(0.5) && weight > C(-0.5)) ? self + weight * (end - self)
                                               : end - (end - self) * (C(1) - weight);
}

// ---- SGD (torch.optim.SGD) ----

template <typename C>
struct SgdScalars {
  C neg_lr, weight_decay, momentum, one_minus_dampening, grad_multiplier, grad_unscale;
  bool nesterov, first_step, use_momentum;
};

template <typename C>
KILN_HOST_DEVICE inline SgdScalars<C> sgd_scalars(const SgdStep& s, const TensorEntry& e) {
  SgdScalars<C> r;
  r.neg_lr = static_cast<C>(-(s.lr * e.lr_multiplier));
  r.weight_decay = static_cast<C>(e.weight_decay);
  r.momentum = static_cast<C>(s.momentum);
  r.one_minus_dampening = static_cast<C>(1.0 - s.dampening);
  r.grad_multiplier = static_cast<C>(s.grad_multiplier);
  r.grad_unscale = static_cast<C>(s.grad_unscale);
  r.nesterov = s.nesterov;
  r.first_step = s.first_step;
  r.use_momentum = s.momentum != 0.0;
  return r;
}

template <typename C>
KILN_HOST_DEVICE inline void sgd_element(C& p, C g, C* buf, const SgdScalars<C>& s) {
  g = unscale_grad(g, s.grad_unscale);
  if (s.grad_multiplier != C(1)) g = g * s.grad_multiplier;
  if (s.weight_decay != C(0)) g = g + s.weight_decay * p;  // grad.add(param, alpha=wd)
  if (s.use_momentum) {
    *buf = s.first_step ? g : *buf * s.momentum + s.one_minus_dampening * g;
    g = s.nesterov ? g + s.momentum * *buf : *buf;
  }
  p = p + s.neg_lr * g;  // param.add_(grad, alpha=-lr)
}

// ---- AdamW (torch.optim.AdamW, single-tensor path) ----

template <typename C>
struct AdamWScalars {
  C decay_factor, one_minus_beta1, beta2, one_minus_beta2, bias_correction2_sqrt, eps,
      neg_step_size, grad_multiplier, grad_unscale;
  bool amsgrad;
};

template <typename C>
KILN_HOST_DEVICE inline AdamWScalars<C> adamw_scalars(const AdamWStep& s, const TensorEntry& e) {
  double lr = s.lr * e.lr_multiplier;
  double bias_correction1 = 1.0 - power(s.beta1, static_cast<double>(s.step));
  double bias_correction2 = 1.0 - power(s.beta2, static_cast<double>(s.step));
  AdamWScalars<C> r;
  r.decay_factor = static_cast<C>(1.0 - lr * e.weight_decay);
  r.one_minus_beta1 = static_cast<C>(1.0 - s.beta1);
  r.beta2 = static_cast<C>(s.beta2);
  r.one_minus_beta2 = static_cast<C>(1.0 - s.beta2);
  r.bias_correction2_sqrt = static_cast<C>(square_root(bias_correction2));
  r.eps = static_cast<C>(s.eps);
  r.neg_step_size = static_cast<C>(-(lr / bias_correction1));
  r.grad_multiplier = static_cast<C>(s.grad_multiplier);
  r.grad_unscale = static_cast<C>(s.grad_unscale);
  r.amsgrad = s.amsgrad;
  return r;
}

template <typename C>
KILN_HOST_DEVICE inline void adamw_element(C& p, C g, C& m, C& v, C* v_max,
                                           const AdamWScalars<C>& s) {
  g = unscale_grad(g, s.grad_unscale);
  if (s.grad_multiplier != C(1)) g = g * s.grad_multiplier;
  p = p * s.decay_factor;                   // param.mul_(1 - lr * wd)
  m = lerp_torch(m, g, s.one_minus_beta1);  // exp_avg.lerp_(grad, 1 - beta1)
  v = v * s.beta2;                          // exp_avg_sq.mul_(beta2)
  v = v + s.one_minus_beta2 * g * g;        // .addcmul_(grad, grad, value=1 - beta2)
  C second = v;
  if (s.amsgrad) {
    if (v > *v_max) *v_max = v;
    second = *v_max;
  }
  C denom = square_root(second) / s.bias_correction2_sqrt + s.eps;
  p = p + s.neg_step_size * m / denom;  // param.addcdiv_(exp_avg, denom, value=-step_size)
}

// ---- LAMB (You et al. 2019, as Apex FusedLAMB with decoupled weight decay) ----

template <typename C>
struct LambScalars {
  C beta1, one_minus_beta1, beta2, one_minus_beta2, bias_correction1, bias_correction2, eps,
      weight_decay, lr, inv_clip_divisor, grad_unscale;
};

template <typename C>
KILN_HOST_DEVICE inline LambScalars<C> lamb_scalars(const LambStep& s, const TensorEntry& e) {
  LambScalars<C> r;
  r.beta1 = static_cast<C>(s.beta1);
  r.one_minus_beta1 = static_cast<C>(1.0 - s.beta1);
  r.beta2 = static_cast<C>(s.beta2);
  r.one_minus_beta2 = static_cast<C>(1.0 - s.beta2);
  r.bias_correction1 =
      static_cast<C>(s.bias_correction ? 1.0 - power(s.beta1, static_cast<double>(s.step)) : 1.0);
  r.bias_correction2 =
      static_cast<C>(s.bias_correction ? 1.0 - power(s.beta2, static_cast<double>(s.step)) : 1.0);
  r.eps = static_cast<C>(s.eps);
  r.weight_decay = static_cast<C>(e.weight_decay);
  r.lr = static_cast<C>(s.lr * e.lr_multiplier);
  r.inv_clip_divisor = static_cast<C>(1.0 / s.clip_divisor);
  r.grad_unscale = static_cast<C>(s.grad_unscale);
  return r;
}

// Stage 1: moments from the (unscaled, clipped) gradient; the trust ratio follows from them.
template <typename C>
KILN_HOST_DEVICE inline void lamb_moments(C g, C& m, C& v, const LambScalars<C>& s) {
  g = unscale_grad(g, s.grad_unscale) * s.inv_clip_divisor;
  m = s.beta1 * m + s.one_minus_beta1 * g;
  v = s.beta2 * v + s.one_minus_beta2 * g * g;
}

// The update direction; recomputed from (p, m, v) in stage 2 so it is never stored.
template <typename C>
KILN_HOST_DEVICE inline C lamb_update(C p, C m, C v, const LambScalars<C>& s) {
  C m_hat = m / s.bias_correction1;
  C v_hat = v / s.bias_correction2;
  return m_hat / (square_root(v_hat) + s.eps) + s.weight_decay * p;
}

// The trust ratio ||w|| / ||update||, 1 where either is 0 or the tensor is not adapted.
template <typename C>
KILN_HOST_DEVICE inline C lamb_trust_ratio(double param_sumsq, double update_sumsq, bool adapt) {
  if (!adapt || param_sumsq <= 0.0 || update_sumsq <= 0.0) return C(1);
  return static_cast<C>(square_root(param_sumsq) / square_root(update_sumsq));
}

}  // namespace kiln::optim::detail
