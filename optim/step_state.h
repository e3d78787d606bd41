#pragma once
// Device-resident step state (MixedPrecisionOptimizer's resident mode): every per-step scalar of an
// optimizer step (loss scale, learning rate, found-inf flag, norm, skip decision, step counts)
// lives in one StepState in the memory of the parameters' device, and the step's kernels READ it
// there instead of taking it by value. A whole step is then enqueued with no host read, so that it
// can be captured into a CUDA graph (kernel arguments are frozen at capture). On the CPU the state
// is host memory and the same functions run on the host.

#include <cstdint>

#include "core/cuda_op.h"
#include "core/host_device.h"

namespace kiln::optim {

// Plain data: the same bytes on the host and the device.
struct StepState {
  double loss_scale = 1.0;       // the scale the current step's loss is multiplied by
  double lr = 0.0;               // the current step's base learning rate
  double last_loss_scale = 1.0;  // the last finished step's, for logs
  double last_lr = 0.0;
  float inv_scale = 1.0f;  // float(1.0 / loss_scale): the unscale factor, as GradScaler
  float found_inf = 0.0f;  // this step's flag, after the found-inf hook
  float grad_norm = 0.0f;  // this step's global L2 norm of the unscaled gradients
  float last_grad_norm = 0.0f;
  std::int32_t skip = 0;  // this step's decision: the optimizer kernels return at once
  std::int32_t last_skipped = 0;
  std::int32_t last_found_inf = 0;
  std::int32_t unused = 0;
  std::int64_t growth_tracker = 0;
  std::int64_t optimizer_steps = 0;  // applied updates (Optimizer::step_count())
  std::int64_t schedule_step = 0;    // the trainer's 0-based step: lr = lr_table[min(it, n - 1)]
  std::int64_t skipped_steps = 0;    // total since make_resident()
  std::int64_t overflow_step = 0;    // 1-based step of a dynamic overflow at min_scale, 0 none
  std::int64_t nonfinite_step = 0;   // first 1-based step with inf/NaN and no scaler, 0 none
};

// LossScaler's options and mode, by value (constant for a run).
struct ScalerRule {
  std::int32_t enabled = 0;
  std::int32_t dynamic = 0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  double min_scale = 1.0;
  double max_scale = 16777216.0;
  std::int64_t growth_interval = 2000;
};

// torch.amp.GradScaler's state machine for one step, shared by LossScaler::update (host mode) and
// resident_advance. Returns true, leaving the state as it is, when a dynamic scale overflows at
// min_scale (the gradients are inf/NaN whatever the scale: the caller reports it).
KILN_HOST_DEVICE inline bool scaler_transition(double& scale, std::int64_t& growth_tracker,
                                               bool found_inf, const ScalerRule& scaler) {
  if (found_inf) {
    if (scaler.dynamic) {
      if (scaler.min_scale > 0 && scale <= scaler.min_scale) return true;
      const double backed_off = scale * scaler.backoff_factor;  // std::max(.., min_scale)
      scale = backed_off < scaler.min_scale ? scaler.min_scale : backed_off;
    }
    growth_tracker = 0;
  } else if (scaler.dynamic && ++growth_tracker >= scaler.growth_interval) {
    const double grown = scale * scaler.growth_factor;  // std::min(grown, max_scale)
    scale = scaler.max_scale < grown ? scaler.max_scale : grown;
    growth_tracker = 0;
  }
  return false;
}

// After the unscale pass and the found-inf hook: the step's verdict. Without a loss scaler an
// inf/NaN step is skipped too (the weights are never corrupted) and reported as an error.
KILN_HOST_DEVICE inline void resident_decide(StepState& s, float found_inf, float grad_norm,
                                             const ScalerRule& scaler) {
  const bool inf = found_inf > 0.0f;
  s.found_inf = inf ? 1.0f : 0.0f;
  s.grad_norm = grad_norm;
  s.skip = inf ? 1 : 0;
  if (inf && !scaler.enabled && s.nonfinite_step == 0) s.nonfinite_step = s.schedule_step + 1;
}

// After the optimizer: LossScaler::update's state machine (an overflow at min_scale is recorded,
// not thrown), the counts, the last step's outcome and the next step's LR and unscale factor.
KILN_HOST_DEVICE inline void resident_advance(StepState& s, const ScalerRule& scaler,
                                              const double* lr_table, std::int64_t lr_table_size) {
  const bool inf = s.found_inf > 0.0f;
  s.last_loss_scale = s.loss_scale;
  s.last_lr = s.lr;
  s.last_grad_norm = s.grad_norm;
  s.last_skipped = s.skip;
  s.last_found_inf = inf ? 1 : 0;
  if (scaler.enabled && scaler_transition(s.loss_scale, s.growth_tracker, inf, scaler) &&
      s.overflow_step == 0) {
    s.overflow_step = s.schedule_step + 1;
  }
  s.optimizer_steps += s.skip ? 0 : 1;
  s.skipped_steps += s.skip ? 1 : 0;
  s.schedule_step += 1;
  const std::int64_t last = lr_table_size - 1;
  s.lr = lr_table[s.schedule_step < last ? s.schedule_step : last];
  s.inv_scale = static_cast<float>(1.0 / s.loss_scale);
}

namespace detail {
// CUDA launchers (optim/step_state.cu): one thread each, on `stream`. `stats` is the F32 pair
// {found_inf, grad_norm} the unscale pass and the hook left.
KILN_CUDA_OP("A resident step", void cuda_resident_decide(StepState* state, const float* stats,
                                                          const ScalerRule& scaler, void* stream));
KILN_CUDA_OP("A resident step",
             void cuda_resident_advance(StepState* state, const ScalerRule& scaler,
                                        const double* lr_table, std::int64_t lr_table_size,
                                        void* stream));
}  // namespace detail

}  // namespace kiln::optim
