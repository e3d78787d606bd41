#pragma once
// Mixed precision after Apex's opt levels, with a half type FP16 or BF16:
//   O0  fp32 weights, activations and GEMMs.
//   O1  fp32 weights; GEMM/conv inputs and activations in half (layers compute norms, softmax
//       and losses in fp32 internally; O1 casts weights once per weights_version).
//   O2  half weights and activations except fp32_in_half parameters (norms), which stay fp32;
//       the optimizer owns fp32 MASTER weights (no fp32 master gradients: it reads the scaled
//       half gradients and unscales them on the fly), updates the masters and writes the half
//       weights from them in the same pass. Between steps that is, with AdamW, 16 bytes per
//       half parameter: half weights 2, half grads 2, master 4, Adam moments 8.
//   O3  everything half, no masters: the speed baseline, not for real training.
// FP16 gets a dynamic loss scaler by default (torch.amp.GradScaler semantics); BF16 none.
//
// One step of MixedPrecisionOptimizer (the loss was multiplied by scale() before backward):
//   1. one fused multi-tensor pass over every gradient: unscale (in place in O1/O3; in O2 nothing
//      is written), set the found-inf flag on inf/NaN, per-chunk sums of squares of the unscaled
//      values; a second tiny kernel turns the sums into the global gradient norm;
//   2. the found-inf hook (data parallelism all-reduces the flag: every rank then skips alike);
//   3. ONE device-to-host read of {found_inf, grad_norm}: the only host sync of the step;
//   4. skip (scaler backs off) or clip + optimizer (+ half weights refreshed) + scaler update. In
//      O2 the optimizer gets the pass's float 1/scale (Optimizer::step's grad_unscale) and
//      multiplies each gradient element by it as it reads it: the same float arithmetic the pass
//      would have stored, so the update is bit for bit the one from unscaled fp32 gradients.
//      The model's gradients therefore stay scaled in O2 (fp32_in_half ones included).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/parameter.h"
#include "core/precision.h"
#include "optim/optimizer.h"
#include "optim/step_state.h"

namespace kiln::optim {

enum class OptLevel { O0, O1, O2, O3 };
enum class HalfType { FP16, BF16 };
enum class LossScaleMode {
  Auto,     // dynamic for FP16 at O1..O3, none otherwise
  Dynamic,  // GradScaler: back off on overflow, grow after growth_interval clean steps
  Static,   // a fixed scale (init_scale); overflowing steps are still skipped
  None,     // no scaling, no skipping
};

const char* opt_level_name(OptLevel level);             // "O0"
OptLevel opt_level_from_name(const std::string& name);  // "O0".."O3"; InputError otherwise
const char* half_type_name(HalfType half);              // "fp16", "bf16"
HalfType half_type_from_name(const std::string& name);
const char* loss_scale_mode_name(LossScaleMode mode);  // "auto", "dynamic", "static", "none"
LossScaleMode loss_scale_mode_from_name(const std::string& name);

struct LossScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;
  // The scale never backs off below this; an overflow at this scale is an error (the gradients
  // are inf/NaN whatever the scale: divergence or bad data). 0 disables the check.
  double min_scale = 1.0;
  // Growth stops here (a dynamic scale never exceeds it): a scale that grows without bound turns
  // small gradients into inf in the scaled loss's first GEMM. >= init_scale for a dynamic scaler.
  double max_scale = 16777216.0;  // 2^24
};

struct AmpOptions {
  OptLevel level = OptLevel::O0;
  HalfType half = HalfType::FP16;
  LossScaleMode loss_scale = LossScaleMode::Auto;
  LossScalerOptions scaler;
};

DType half_dtype(HalfType half);  // F16 or BF16
// The forward/backward precision of a level (Context::precision).
PrecisionPolicy precision_policy(const AmpOptions& options);
// The dtype for Layer::to(device, dtype): F32 for O0/O1, the half type for O2/O3.
DType parameter_dtype(const AmpOptions& options);
bool uses_master_weights(const AmpOptions& options);  // O2
bool uses_loss_scaling(const AmpOptions& options);    // resolves Auto
// InputError for combinations that cannot work (loss scaling at O0 asks for nothing harmful and
// is allowed; a bad scaler option is not).
void validate(const AmpOptions& options);

// torch.amp.GradScaler's state machine, on the host (the skip decision reads the flag anyway).
class LossScaler {
 public:
  struct State {
    double scale = 1.0;
    std::int64_t growth_tracker = 0;  // consecutive clean steps since the last change
  };

  LossScaler(const LossScalerOptions& options, LossScaleMode mode);  // mode: Dynamic/Static/None
  bool enabled() const { return mode_ != LossScaleMode::None; }
  bool dynamic() const { return mode_ == LossScaleMode::Dynamic; }
  double scale() const { return enabled() ? state_.scale : 1.0; }
  std::int64_t growth_tracker() const { return state_.growth_tracker; }
  // Records one step's outcome; returns true when the optimizer step must be skipped. Throws
  // kiln::Error when a dynamic scale overflows at min_scale.
  bool update(bool found_inf);
  State state() const { return state_; }
  void load_state(const State& state);
  const LossScalerOptions& options() const { return options_; }
  ScalerRule rule() const;  // the options and mode as the resident step reads them

 private:
  LossScalerOptions options_;
  LossScaleMode mode_;
  State state_;
};

struct StepResult {
  bool skipped = false;     // inf/NaN in the gradients with loss scaling on: nothing was updated
  bool found_inf = false;   // inf/NaN seen (also reported without a scaler, which does not skip)
  double grad_norm = 0.0;   // global L2 norm of the unscaled gradients, before clipping
  double scale = 1.0;       // the loss scale this step's gradients carried
  double next_scale = 1.0;  // the scale for the next step's loss
};

// What resident mode's report() reads back: the last finished step's outcome (as StepResult)
// and the running counts.
struct ResidentReport {
  bool skipped = false;
  bool found_inf = false;
  double grad_norm = 0.0;          // the last step's, before clipping
  double loss_scale = 1.0;         // the scale the last step's gradients carried
  double next_loss_scale = 1.0;    // the scale for the next step's loss
  double lr = 0.0;                 // the last step's base LR
  std::int64_t skipped_steps = 0;  // since make_resident()
  std::int64_t optimizer_steps = 0;
  std::int64_t schedule_step = 0;  // the next step's 0-based index
};

// Where O2's fp32 masters start instead of their half parameters' values: `fill(i, master)` right
// after master i is allocated (false: from the half value), then `done()` before the optimizer's
// own state (moments) is allocated, so that the caller can release the source first: the fp32
// initial weights then never sit beside the whole state (30 GB less at 7B with offload).
struct MasterSource {
  std::function<bool(std::size_t index, Tensor& master)> fill;
  std::function<void()> done;
};

class MixedPrecisionOptimizer {
 public:
  // `params` are the model's parameters, already converted with Layer::to(device,
  // parameter_dtype(amp)); in O2 the fp32 masters are copied from them here. The optimizer keeps
  // each parameter's `grad` tensor as it is now: rebind gradients (DataParallel buckets) first.
  // `device` places the step's flags when `params` is empty (a ZeRO rank whose shard of a tiny
  // model is only padding); otherwise the parameters' device is used. `element_offsets`: where
  // each of `params` starts in its whole parameter when they are ZeRO pieces (empty: all 0).
  MixedPrecisionOptimizer(const std::vector<Parameter*>& params, const OptimizerOptions& optim,
                          const AmpOptions& amp, Device device = Device::cpu(),
                          const std::vector<std::int64_t>& element_offsets = {},
                          const MasterSource& masters = {});
  ~MixedPrecisionOptimizer();
  MixedPrecisionOptimizer(const MixedPrecisionOptimizer&) = delete;
  MixedPrecisionOptimizer& operator=(const MixedPrecisionOptimizer&) = delete;

  // Multiply the loss by this before backward (1 without loss scaling).
  double scale() const { return scaler_.scale(); }
  void set_lr(double lr) { optimizer_->set_lr(lr); }
  double lr() const { return optimizer_->lr(); }
  // Zeroes the model's gradients (call before the first micro-batch of a step).
  void zero_grad();

  // Phase 1 on its own (step() runs it if it was not called): the fused unscale + inf/NaN check
  // + norm pass. After it, found_inf_flag() holds the local verdict.
  void unscale_and_check();
  // F32 (1) on the parameters' device, > 0 when some gradient is inf/NaN. Data parallelism sums
  // or maxes it across ranks between unscale_and_check() and step() (or in the hook).
  Tensor& found_inf_flag() { return found_inf_; }
  // Called inside step() after the unscale pass with the flag, e.g. an all-reduce (MAX or SUM).
  void set_found_inf_hook(std::function<void(Tensor& found_inf)> hook) { hook_ = std::move(hook); }
  // Sharded optimizers (ZeRO) see part of the gradients: the hook turns this rank's sum of squares
  // into the global one (an all-reduce), from which the norm for clipping and logging is taken.
  void set_sumsq_hook(std::function<double(double local_sumsq)> hook) {
    sumsq_hook_ = std::move(hook);
  }

  // Host mode: one device-to-host read of {found_inf, grad_norm} per step (the default).
  StepResult step();

  // Resident mode (docs/optim.md, "Device-resident step state"): the step state lives in a
  // StepState in the parameters' device memory (host memory on the CPU), initialised here from the
  // host state (scaler, Optimizer::step_count(), lr_table[schedule_step]). lr_table holds the base
  // LR of every step (the last entry holds for later steps). Call again, or
  // upload_resident_state(), after loading a checkpoint. Sharded optimizers (ZeRO) are refused.
  void make_resident(std::vector<double> lr_table, std::int64_t schedule_step);
  void upload_resident_state(std::int64_t schedule_step);
  bool resident() const { return resident_; }
  // Where the current loss scale lives (device memory on CUDA; the step state in resident mode,
  // a copy the host writes when the scale changes in host mode): the loss backward reads it at
  // run time (Context::step.loss_scale). Resident mode moves it: ask again after make_resident().
  const double* loss_scale_source() const;
  // Enqueues a whole step on the current stream with no host read and, after the first call, no
  // allocation or upload: capturable into a CUDA graph. Skipped steps are decided on the device.
  void step_resident();
  // One device-to-host copy of the state (waits for the stream): refreshes the host scaler state,
  // Optimizer::step_count() and lr(), and returns the last step's outcome. Throws kiln::Error when
  // a dynamic scale overflowed at min_scale or, without a scaler, a step had inf/NaN gradients.
  ResidentReport report();

  // Optimizer state for checkpoints: the optimizer's (see Optimizer::state()) and in O2
  // "<name>.master" (fp32 master weights). After restoring them call refresh_model_weights().
  std::vector<std::pair<std::string, Tensor*>> state();
  // Writes the half model weights from the fp32 masters (O2; nothing otherwise).
  void refresh_model_weights();
  LossScaler& scaler() { return scaler_; }
  // A checkpoint's scaler state; also where loss_scale_source() points in host mode.
  void load_scaler_state(const LossScaler::State& state);
  Optimizer& optimizer() { return *optimizer_; }
  const AmpOptions& amp_options() const { return amp_; }
  PrecisionPolicy precision() const { return precision_policy(amp_); }
  // Bumped after every applied update: copy into Context::weights_version (O1 weight casts).
  std::uint64_t weights_version() const { return weights_version_; }

 private:
  AmpOptions amp_;
  LossScaler scaler_;
  std::vector<Parameter*> params_;
  std::vector<Tensor> masters_;  // O2: fp32 copies of half parameters (undefined otherwise)
  std::unique_ptr<Optimizer> optimizer_;
  std::vector<std::pair<std::string, Tensor*>> master_state_;
  Device device_;
  Tensor stats_;            // F32 (2): found_inf, grad_norm
  Tensor published_scale_;  // F64 (1) on device_: the host mode's loss scale, for the kernels
  Tensor found_inf_;        // view of stats_[0]
  detail::MultiTensorTable unscale_table_;
  std::function<void(Tensor&)> hook_;
  std::function<double(double)> sumsq_hook_;
  double cpu_sumsq_ = 0.0;  // the CPU pass's exact sum of squares (CUDA keeps only the norm)
  bool unscaled_ = false;
  float inv_scale_ = 1.0f;  // the factor of the last unscale pass
  std::uint64_t weights_version_ = 0;

  // Resident mode: StepState bytes on device_, the LR table (F64) there, a host copy for report().
  bool resident_ = false;
  Tensor resident_state_;
  Tensor lr_table_;
  std::vector<double> lr_table_host_;
  Tensor report_buffer_;

  std::vector<detail::TensorEntry> unscale_entries();
  StepState* resident_state();
  void publish_scale();
  // O2 with masters: the gradients stay scaled and the optimizer unscales them as it reads them.
  bool optimizer_unscales() const { return !master_state_.empty(); }
};

// Gradient accumulation contract (documented in docs/optim.md): zero_grad() before the first
// micro-batch, each micro-batch's loss multiplied by loss_factor() (and by the loss scale),
// layers accumulate parameter gradients (+=), step() after the last micro-batch.
struct GradientAccumulation {
  explicit GradientAccumulation(int micro_batches);
  int micro_batches;
  // What each micro-batch's loss gradient is multiplied by: the loss scale over the micro-batches.
  double loss_factor(double loss_scale = 1.0) const { return loss_scale / micro_batches; }
  bool is_first(int micro_batch) const { return micro_batch == 0; }
  bool is_last(int micro_batch) const { return micro_batch == micro_batches - 1; }
};

}  // namespace kiln::optim
