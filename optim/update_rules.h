#pragma once
// What every optimizer's rule (optim/rules/*.h) is built from: the tensor descriptors the
// multi-tensor passes visit, the resident-mode fields, and the host + device arithmetic helpers.
// Step scalars arrive in double and each tensor's scalars are derived in double, then rounded once
// to the compute type, in the order PyTorch's torch.optim rounds them; the element arithmetic then
// follows torch's operation order, so the CPU backend, the CUDA backend (built with --fmad=false)
// and torch agree to rounding.

#include <cmath>
#include <cstdint>

#include "core/dtype.h"
#include "core/host_device.h"
#include "core/random.h"
#include "optim/step_state.h"

namespace kiln::optim::detail {

// One tensor the multi-tensor passes visit. Plain data: the same bytes are read on the device.
struct TensorEntry {
  void* value = nullptr;   // the weights updated (fp32 masters in O2); in unscale: the output grads
  void* grad = nullptr;    // read only by the optimizers (half in O2); in unscale: the scaled input
  void* copy = nullptr;    // half model weights refreshed from `value` after the update (O2)
  void* state0 = nullptr;  // exp_avg or momentum_buffer (state_dtype)
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
  std::int32_t state_dtype = 0;     // of state0..2: F32 (F64 beside f64 weights on CPU) or BF16
  std::int32_t unused = 0;          // keeps the struct free of padding (the table compares bytes)
  std::uint64_t rng_key = 0;        // bf16 state: the parameter's own rounding stream (its name)
  std::int64_t element_offset = 0;  // where this tensor starts in its parameter (ZeRO pieces)
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

// A tensor's optimizer state as a rule's compute type C sees it: f32 (f64) as stored, or bf16
// widened on load and rounded stochastically on store. The random bits hash the parameter (its
// name), the element's index in the whole parameter and the step, so a ZeRO piece rounds as the
// whole parameter would, and the CPU as the GPU. One 32-bit hash serves slots 0 and 1 (its two
// halves; the rounding reads 16 bits), a second one AMSGrad's slot 2.
template <typename C>
struct StateView {
  void* slots[3];
  bool bf16;
  std::uint32_t seed;
  std::int64_t offset;

  KILN_HOST_DEVICE StateView(const TensorEntry& e, std::int64_t completed_steps)
      : slots{e.state0, e.state1, e.state2},
        bf16(e.state_dtype == static_cast<std::int32_t>(DType::BF16)),
        seed(mix32(static_cast<std::uint32_t>(e.rng_key) ^
                   mix32(static_cast<std::uint32_t>(e.rng_key >> 32) ^
                         mix32(static_cast<std::uint32_t>(completed_steps))))),
        offset(e.element_offset) {}

  KILN_HOST_DEVICE C load(int k, std::int64_t i) const {
    if (bf16)
      return static_cast<C>(bf16_bits_widen(static_cast<const std::uint16_t*>(slots[k])[i]));
    return static_cast<const C*>(slots[k])[i];
  }
  // The first N slots of element i (absent slots read 0).
  template <int N>
  KILN_HOST_DEVICE void load_all(std::int64_t i, C* out) const {
    for (int k = 0; k < N; ++k) out[k] = slots[k] != nullptr ? load(k, i) : C(0);
  }
  template <int N>
  KILN_HOST_DEVICE void store_all(std::int64_t i, const C* in) const {
    if (!bf16) {
      for (int k = 0; k < N; ++k) {
        if (slots[k] != nullptr) static_cast<C*>(slots[k])[i] = in[k];
      }
      return;
    }
    const std::uint64_t index = static_cast<std::uint64_t>(offset + i);
    const std::uint32_t h = mix32(static_cast<std::uint32_t>(index) ^
                                  mix32(seed ^ static_cast<std::uint32_t>(index >> 32)));
    const std::uint32_t words[3] = {h, h >> 16, N > 2 ? mix32(h ^ 0x9e3779b9u) : 0u};
    for (int k = 0; k < N; ++k) {
      if (slots[k] != nullptr) {
        static_cast<std::uint16_t*>(slots[k])[i] =
            bf16_bits_stochastic(static_cast<float>(in[k]), words[k]);
      }
    }
  }
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

// Resident mode: overwrites a rule's per-step fields from the state, exactly as the host fills
// them (Optimizer::apply_rule). Returns false when the step is skipped: do
// nothing. Every rule carries `grad_unscale`: each gradient element is loaded, widened to the
// compute type and multiplied by it, the arithmetic of the unscale pass (multi_tensor.h), so that
// O2 reads the loss-scaled half gradients directly. It is a float (1/loss_scale), exact in either
// compute type; at 1 nothing is multiplied.
template <typename Rule>
KILN_HOST_DEVICE inline bool load_resident(Rule& rule) {
  if (rule.resident.state == nullptr) return true;
  const StepState& st = *rule.resident.state;
  if (st.skip) return false;
  rule.lr = st.lr;
  rule.grad_unscale = rule.resident.unscale_from_state ? st.inv_scale : 1.0f;
  rule.load_counts(st.optimizer_steps, st.grad_norm, rule.resident.max_grad_norm);
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

}  // namespace kiln::optim::detail
