// Mixed precision: opt levels, the loss scaler and the optimizer wrapper that owns fp32 masters.

#include "optim/amp/amp.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "core/enum_names.h"
#include "core/stream.h"

namespace kiln::optim {

namespace {
constexpr EnumName<OptLevel> kOptLevelNames[] = {
    {OptLevel::O0, "O0"}, {OptLevel::O1, "O1"}, {OptLevel::O2, "O2"}, {OptLevel::O3, "O3"}};
constexpr EnumName<LossScaleMode> kLossScaleModeNames[] = {{LossScaleMode::Auto, "auto"},
                                                           {LossScaleMode::Dynamic, "dynamic"},
                                                           {LossScaleMode::Static, "static"},
                                                           {LossScaleMode::None, "none"}};
}  // namespace

const char* opt_level_name(OptLevel level) {
  return enum_name(kOptLevelNames, level);
}

OptLevel opt_level_from_name(const std::string& name) {
  return parse_enum(kOptLevelNames, name, "opt level");
}

const char* half_type_name(HalfType half) {
  return half == HalfType::BF16 ? "bf16" : "fp16";
}

HalfType half_type_from_name(const std::string& name) {
  if (name == "fp16" || name == "FP16" || name == "f16") return HalfType::FP16;
  if (name == "bf16" || name == "BF16") return HalfType::BF16;
  throw InputError("unknown half type '" + name + "' (known: fp16, bf16)");
}

const char* loss_scale_mode_name(LossScaleMode mode) {
  return enum_name(kLossScaleModeNames, mode);
}

LossScaleMode loss_scale_mode_from_name(const std::string& name) {
  return parse_enum(kLossScaleModeNames, name, "loss scale mode");
}

DType half_dtype(HalfType half) {
  return half == HalfType::BF16 ? DType::BF16 : DType::F16;
}

PrecisionPolicy precision_policy(const AmpOptions& options) {
  PrecisionPolicy policy;
  if (options.level != OptLevel::O0) {
    policy.activation = half_dtype(options.half);
    policy.matmul = half_dtype(options.half);
  }
  return policy;
}

DType parameter_dtype(const AmpOptions& options) {
  return options.level == OptLevel::O2 || options.level == OptLevel::O3 ? half_dtype(options.half)
                                                                        : DType::F32;
}

bool uses_master_weights(const AmpOptions& options) {
  return options.level == OptLevel::O2;
}

bool uses_loss_scaling(const AmpOptions& options) {
  switch (options.loss_scale) {
    case LossScaleMode::Auto:
      return options.level != OptLevel::O0 && options.half == HalfType::FP16;
    case LossScaleMode::None:
      return false;
    default:
      return true;
  }
}

static LossScaleMode resolved_mode(const AmpOptions& options) {
  if (options.loss_scale == LossScaleMode::Auto) {
    return uses_loss_scaling(options) ? LossScaleMode::Dynamic : LossScaleMode::None;
  }
  return options.loss_scale;
}

void validate(const AmpOptions& options) {
  const LossScalerOptions& s = options.scaler;
  auto fail = [](const std::string& what) { throw InputError("amp loss scaler: " + what); };
  if (!(s.init_scale > 0) || !std::isfinite(s.init_scale)) fail("init_scale must be > 0");
  if (!(s.growth_factor > 1)) fail("growth_factor must be > 1");
  if (!(s.backoff_factor > 0 && s.backoff_factor < 1)) fail("backoff_factor must be in (0, 1)");
  if (s.growth_interval < 1) fail("growth_interval must be >= 1");
  if (!(s.min_scale >= 0) || s.min_scale > s.init_scale) {
    fail("min_scale must be in [0, init_scale]");
  }
  // A static scale is init_scale and never grows: the cap concerns dynamic scaling only.
  if (resolved_mode(options) == LossScaleMode::Dynamic &&
      (!(s.max_scale >= s.init_scale) || !std::isfinite(s.max_scale))) {
    fail("max_scale must be finite and >= init_scale");
  }
}

LossScaler::LossScaler(const LossScalerOptions& options, LossScaleMode mode)
    : options_(options), mode_(mode == LossScaleMode::Auto ? LossScaleMode::Dynamic : mode) {
  state_.scale = options.init_scale;
}

// LossScaler::update's error, shared with resident mode (which knows the step: 0 = unknown).
static std::string overflow_message(double min_scale, std::int64_t step) {
  std::ostringstream msg;
  msg << "loss scale overflow at the minimum scale " << min_scale;
  if (step > 0) msg << " at step " << step;
  msg << ": the gradients are inf/NaN whatever the scale (the model diverged or the data "
         "holds inf/NaN); lower optim.lr, check the input data, or train in bf16 or O0";
  return msg.str();
}

bool LossScaler::update(bool found_inf) {
  if (!enabled()) return false;
  if (scaler_transition(state_.scale, state_.growth_tracker, found_inf, rule())) {
    throw Error(overflow_message(options_.min_scale, 0));
  }
  return found_inf;
}

ScalerRule LossScaler::rule() const {
  ScalerRule r;
  r.enabled = enabled() ? 1 : 0;
  r.dynamic = dynamic() ? 1 : 0;
  r.growth_factor = options_.growth_factor;
  r.backoff_factor = options_.backoff_factor;
  r.min_scale = options_.min_scale;
  r.max_scale = options_.max_scale;
  r.growth_interval = options_.growth_interval;
  return r;
}

void LossScaler::load_state(const State& state) {
  if (!(state.scale > 0) || !std::isfinite(state.scale) || state.growth_tracker < 0) {
    throw InputError("loss scaler state: scale " + std::to_string(state.scale) +
                     ", growth tracker " + std::to_string(state.growth_tracker) + " is invalid");
  }
  state_ = state;
}

MixedPrecisionOptimizer::MixedPrecisionOptimizer(const std::vector<Parameter*>& params,
                                                 const OptimizerOptions& optim,
                                                 const AmpOptions& amp, Device device,
                                                 const std::vector<std::int64_t>& element_offsets,
                                                 const MasterSource& masters)
    : amp_((validate(amp), amp)), scaler_(amp.scaler, resolved_mode(amp)), params_(params) {
  device_ = params_.empty() ? device : params_.front()->value.device();
  masters_.resize(params_.size());
  std::vector<OptimizedTensor> tensors;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = *params_[i];
    OptimizedTensor t;
    t.name = p.name;
    t.no_weight_decay = p.no_weight_decay;
    if (!element_offsets.empty()) t.element_offset = element_offsets.at(i);
    std::tie(t.lr_multiplier, t.weight_decay) = resolve_group(p.name, p.no_weight_decay, optim);
    if (uses_master_weights(amp) && is_half(p.value.dtype())) {
      masters_[i] =
          optim.state_memory == StateMemory::kPinnedHost
              ? Tensor::zeros_in_host_memory(p.value.shape(), DType::F32, p.value.device())
              : Tensor::empty(p.value.shape(), DType::F32, p.value.device());
      if (!masters.fill || !masters.fill(i, masters_[i])) masters_[i].copy_from(p.value);
      // No fp32 master gradient: the optimizer reads the scaled half gradient and unscales it.
      t.value = masters_[i];
      t.grad = p.grad;
      t.model_copy = p.value;
      master_state_.emplace_back(p.name + ".master", &masters_[i]);
    } else {
      t.value = p.value;
      t.grad = p.grad;
    }
    tensors.push_back(std::move(t));
  }
  if (masters.done) masters.done();
  optimizer_ = make_optimizer(std::move(tensors), optim);
  stats_ = Tensor::zeros({2}, DType::F32, device_);
  found_inf_ = stats_.slice(0, 0, 1);
  published_scale_ = Tensor::zeros({1}, DType::F64, device_);
  publish_scale();
}

void MixedPrecisionOptimizer::publish_scale() {
  // Stream-ordered: the next backward, enqueued after this, reads the new scale.
  published_scale_.copy_from(Tensor::from_vector(std::vector<double>{scaler_.scale()}, {1}));
}

void MixedPrecisionOptimizer::load_scaler_state(const LossScaler::State& state) {
  scaler_.load_state(state);
  publish_scale();
}

MixedPrecisionOptimizer::~MixedPrecisionOptimizer() = default;

void MixedPrecisionOptimizer::zero_grad() {
  for (Parameter* p : params_) p->grad.zero();
  unscaled_ = false;
}

std::vector<detail::TensorEntry> MixedPrecisionOptimizer::unscale_entries() {
  std::vector<detail::TensorEntry> entries;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Parameter& p = *params_[i];
    KILN_CHECK(p.grad.is_contiguous(), "amp: gradient of '" + p.name + "' must be contiguous");
    detail::TensorEntry e;
    // In place: written only when the pass unscales (never in O2, see unscale_and_check()).
    e.grad = p.grad.data();
    e.grad_dtype = static_cast<std::int32_t>(p.grad.dtype());
    e.value = e.grad;
    e.value_dtype = e.grad_dtype;
    e.numel = p.grad.numel();
    entries.push_back(e);
  }
  return entries;
}

void MixedPrecisionOptimizer::unscale_and_check() {
  // GradScaler's inverse scale: computed in double, used as a float. With masters (O2) nothing is
  // written: step() hands this float to the optimizer, which unscales every gradient as it reads.
  // Resident mode reads it from the state (on CUDA the kernel does, when it runs).
  float inv_scale = static_cast<float>(1.0 / scaler_.scale());
  if (resident_ && device_.is_cpu()) inv_scale = resident_state()->inv_scale;
  inv_scale_ = inv_scale;
  const bool write = inv_scale != 1.0f && !optimizer_unscales();
  auto entries = unscale_entries();
  if (device_.is_cpu()) {
    bool found_inf = false;
    double sumsq = detail::cpu_unscale_check_sumsq(entries, inv_scale, write, &found_inf);
    float* stats = stats_.data<float>();
    stats[0] = found_inf ? 1.0f : 0.0f;
    stats[1] = static_cast<float>(std::sqrt(sumsq));
    cpu_sumsq_ = sumsq;
  } else {
    void* stream = current_stream(device_);
    found_inf_.fill(0.0);
    unscale_table_.set(std::move(entries), device_);
    float* stats = static_cast<float*>(stats_.data());
    // The kernel skips the write itself when the factor it uses is 1.
    detail::cuda_unscale_check_sumsq(unscale_table_, inv_scale, !optimizer_unscales(), stats,
                                     stream, resident_ ? resident_state() : nullptr);
    detail::cuda_partials_norm(unscale_table_, stats + 1, stream);
  }
  unscaled_ = true;
}

StepResult MixedPrecisionOptimizer::step() {
  KILN_CHECK(!resident_, "amp: step() in resident mode (use step_resident() and report())");
  if (!unscaled_) unscale_and_check();
  if (hook_) hook_(found_inf_);
  // The one host sync of the step: the skip decision and the norm for clipping and logging.
  std::vector<float> stats = stats_.to_vector<float>();
  StepResult result;
  result.found_inf = stats[0] > 0.0f;
  result.grad_norm = stats[1];
  if (sumsq_hook_) {
    const double local = device_.is_cuda() ? static_cast<double>(stats[1]) * stats[1] : cpu_sumsq_;
    result.grad_norm = static_cast<float>(std::sqrt(sumsq_hook_(local)));
  }
  result.scale = scaler_.scale();
  unscaled_ = false;
  result.skipped = scaler_.update(result.found_inf);
  result.next_scale = scaler_.scale();
  if (result.next_scale != result.scale) publish_scale();
  if (result.skipped) return result;
  // The pass's factor: the scaler may have just changed its scale for the next step.
  optimizer_->step(result.grad_norm, optimizer_unscales() ? inv_scale_ : 1.0f);
  ++weights_version_;
  return result;
}

StepState* MixedPrecisionOptimizer::resident_state() {
  return static_cast<StepState*>(resident_state_.data());
}

const double* MixedPrecisionOptimizer::loss_scale_source() const {
  if (!resident_) return static_cast<const double*>(published_scale_.data());
  return &static_cast<const StepState*>(resident_state_.data())->loss_scale;
}

void MixedPrecisionOptimizer::make_resident(std::vector<double> lr_table,
                                            std::int64_t schedule_step) {
  KILN_CHECK(!sumsq_hook_ && !optimizer_->sharded(),
             "amp: resident mode needs the whole gradients and parameters (ZeRO-sharded "
             "optimizers stay in host mode)");
  if (lr_table.empty()) throw InputError("amp resident mode: the LR table is empty");
  const auto n = static_cast<std::int64_t>(lr_table.size());
  // Refilled in place when the size holds: a graph captured earlier keeps reading the table.
  Tensor table = Tensor::from_vector(lr_table, {n});
  if (lr_table_.defined() && lr_table_.numel() == n) {
    lr_table_.copy_from(table);
  } else {
    lr_table_ = table.to(device_);
  }
  lr_table_host_ = std::move(lr_table);
  if (!resident_state_.defined()) {
    resident_state_ =
        Tensor::zeros({static_cast<std::int64_t>(sizeof(StepState))}, DType::U8, device_);
    report_buffer_ = Tensor::zeros({static_cast<std::int64_t>(sizeof(StepState))}, DType::U8);
  }
  resident_ = true;
  upload_resident_state(schedule_step);
}

void MixedPrecisionOptimizer::upload_resident_state(std::int64_t schedule_step) {
  KILN_CHECK(resident_, "amp: upload_resident_state() before make_resident()");
  if (schedule_step < 0) {
    throw InputError("amp resident mode: schedule step " + std::to_string(schedule_step) +
                     " is negative");
  }
  const auto n = static_cast<std::int64_t>(lr_table_host_.size());
  StepState s;
  s.loss_scale = scaler_.scale();
  s.inv_scale = static_cast<float>(1.0 / s.loss_scale);
  s.lr = lr_table_host_[static_cast<std::size_t>(std::min(schedule_step, n - 1))];
  s.last_loss_scale = s.loss_scale;
  s.last_lr = s.lr;
  s.growth_tracker = scaler_.growth_tracker();
  s.optimizer_steps = optimizer_->step_count();
  s.schedule_step = schedule_step;
  std::memcpy(report_buffer_.data(), &s, sizeof(StepState));
  resident_state_.copy_from(report_buffer_);
  optimizer_->set_lr(s.lr);
  unscaled_ = false;
}

void MixedPrecisionOptimizer::step_resident() {
  KILN_CHECK(resident_, "amp: step_resident() before make_resident()");
  if (!unscaled_) unscale_and_check();
  if (hook_) hook_(found_inf_);
  StepState* state = resident_state();
  const ScalerRule rule = scaler_.rule();
  const auto n = static_cast<std::int64_t>(lr_table_host_.size());
  if (device_.is_cpu()) {
    const float* stats = stats_.data<float>();
    resident_decide(*state, stats[0], stats[1], rule);
  } else {
    detail::cuda_resident_decide(state, static_cast<const float*>(stats_.data()), rule,
                                 current_stream(device_));
  }
  optimizer_->enqueue_resident_step(state, optimizer_unscales());
  if (device_.is_cpu()) {
    resident_advance(*state, rule, lr_table_.data<double>(), n);
  } else {
    detail::cuda_resident_advance(state, rule, static_cast<const double*>(lr_table_.data()), n,
                                  current_stream(device_));
  }
  unscaled_ = false;
  // The host cannot know whether the device skipped: the weights may have changed.
  ++weights_version_;
}

ResidentReport MixedPrecisionOptimizer::report() {
  KILN_CHECK(resident_, "amp: report() before make_resident()");
  report_buffer_.copy_from(resident_state_);  // waits for the stream on CUDA
  StepState s;
  std::memcpy(&s, report_buffer_.data(), sizeof(StepState));
  if (scaler_.enabled()) scaler_.load_state({s.loss_scale, s.growth_tracker});
  optimizer_->load_step_count(s.optimizer_steps);
  optimizer_->set_lr(s.lr);
  if (s.overflow_step > 0)
    throw Error(overflow_message(scaler_.options().min_scale, s.overflow_step));
  if (s.nonfinite_step > 0) {
    throw Error("non-finite gradients (inf/NaN) at step " + std::to_string(s.nonfinite_step) +
                " with no loss scaler to skip the step (it was skipped: the weights are those "
                "of the step before); lower optim.lr, check the input data, or use a dynamic "
                "loss scale");
  }
  ResidentReport r;
  r.skipped = s.last_skipped != 0;
  r.found_inf = s.last_found_inf != 0;
  r.grad_norm = s.last_grad_norm;
  r.loss_scale = s.last_loss_scale;
  r.next_loss_scale = s.loss_scale;
  r.lr = s.last_lr;
  r.skipped_steps = s.skipped_steps;
  r.optimizer_steps = s.optimizer_steps;
  r.schedule_step = s.schedule_step;
  return r;
}

std::vector<std::pair<std::string, Tensor*>> MixedPrecisionOptimizer::state() {
  auto out = optimizer_->state();
  out.insert(out.end(), master_state_.begin(), master_state_.end());
  return out;
}

void MixedPrecisionOptimizer::refresh_model_weights() {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (masters_[i].defined()) params_[i]->value.copy_from(masters_[i]);
  }
  ++weights_version_;
}

GradientAccumulation::GradientAccumulation(int micro_batches_in) : micro_batches(micro_batches_in) {
  if (micro_batches < 1) {
    throw InputError("gradient accumulation needs >= 1 micro-batches, got " +
                     std::to_string(micro_batches));
  }
}

}  // namespace kiln::optim
