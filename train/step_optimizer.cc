#include "train/step_optimizer.h"

#include "optim/amp/amp.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"

namespace kiln::train {
namespace {

optim::AmpOptions amp_options(const config::Experiment& e) {
  const config::PrecisionConfig& p = e.precision();
  optim::AmpOptions a;
  a.level = static_cast<optim::OptLevel>(static_cast<int>(p.opt_level()));
  a.half =
      p.half() == config::PrecisionConfig::BF16 ? optim::HalfType::BF16 : optim::HalfType::FP16;
  const config::LossScaleConfig& ls = p.loss_scale();
  if (ls.has_dynamic()) {
    a.loss_scale = ls.dynamic() ? optim::LossScaleMode::Dynamic
                                : (ls.has_static_scale() && ls.static_scale() != 1.0
                                       ? optim::LossScaleMode::Static
                                       : optim::LossScaleMode::None);
  }
  // fp32 gradients need no scaling: O0 runs without a scaler whatever the half type says.
  if (a.level == optim::OptLevel::O0) a.loss_scale = optim::LossScaleMode::None;
  a.scaler.init_scale =
      a.loss_scale == optim::LossScaleMode::Static ? ls.static_scale() : ls.init_scale();
  a.scaler.growth_factor = ls.growth_factor();
  a.scaler.backoff_factor = ls.backoff_factor();
  a.scaler.growth_interval = ls.growth_interval();
  a.scaler.min_scale = ls.min_scale();
  a.scaler.max_scale = ls.max_scale();
  return a;
}

optim::OptimizerOptions optimizer_options(const config::Experiment& e) {
  const config::OptimizerConfig& c = e.optimizer();
  optim::OptimizerOptions o;
  switch (c.kind()) {
    case config::OptimizerConfig::SGD:
      o.kind = optim::OptimizerKind::SGD;
      break;
    case config::OptimizerConfig::LAMB:
      o.kind = optim::OptimizerKind::LAMB;
      break;
    default:
      o.kind = optim::OptimizerKind::AdamW;
      break;
  }
  o.lr = c.lr();
  o.weight_decay = c.weight_decay();
  o.momentum = c.momentum();
  o.nesterov = c.nesterov();
  if (c.betas_size() == 2) {
    o.beta1 = c.betas(0);
    o.beta2 = c.betas(1);
  }
  o.eps = c.eps();
  o.amsgrad = c.amsgrad();
  o.bias_correction = c.bias_correction();
  o.max_grad_norm = c.max_grad_norm();
  o.exclude_flagged_from_decay = c.no_weight_decay_for_bias_and_norm();
  for (const config::ParamGroup& g : c.param_groups()) {
    optim::ParamGroupRule rule;
    rule.pattern = g.name_pattern();
    rule.lr_multiplier = g.has_lr_multiplier() ? g.lr_multiplier() : 1.0;
    rule.weight_decay = g.has_weight_decay() ? g.weight_decay() : -1.0;
    o.groups.push_back(rule);
  }
  return o;
}

optim::ScheduleOptions schedule_options(const config::Experiment& e, std::int64_t total_steps) {
  const config::ScheduleConfig& c = e.schedule();
  optim::ScheduleOptions o;
  switch (c.kind()) {
    case config::ScheduleConfig::WARMUP_COSINE:
      o.kind = optim::ScheduleKind::Cosine;
      break;
    case config::ScheduleConfig::WARMUP_LINEAR:
      o.kind = optim::ScheduleKind::Linear;
      break;
    case config::ScheduleConfig::WARMUP_POLY:
      o.kind = optim::ScheduleKind::Polynomial;
      break;
    case config::ScheduleConfig::STEP:
      o.kind = optim::ScheduleKind::Step;
      break;
    default:
      o.kind = optim::ScheduleKind::Constant;
      break;
  }
  o.base_lr = e.optimizer().lr();
  o.min_lr = c.min_lr();
  o.warmup_steps = c.warmup_steps();
  o.total_steps = total_steps;
  o.power = c.power();
  o.gamma = c.gamma();
  o.step_size = c.step_size();
  return o;
}

}  // namespace

PrecisionChoice precision_for(const config::Experiment& experiment, Device device) {
  (void)device;
  optim::AmpOptions a = amp_options(experiment);
  return {optim::precision_policy(a), optim::parameter_dtype(a)};
}

struct StepOptimizer::Impl {
  Impl(const std::vector<Parameter*>& parameters, const config::Experiment& e, std::int64_t total)
      : optimizer(parameters, optimizer_options(e), amp_options(e)),
        schedule(schedule_options(e, total)) {}
  optim::MixedPrecisionOptimizer optimizer;
  optim::LrSchedule schedule;
};

StepOptimizer::StepOptimizer(const std::vector<Parameter*>& parameters,
                             const NamedTensors& fp32_init, const config::Experiment& experiment,
                             std::int64_t total_steps)
    : impl_(std::make_unique<Impl>(parameters, experiment, total_steps)) {
  // O2 masters start from the exact fp32 initial values, not from their half rounding.
  std::map<std::string, const Tensor*> init;
  for (const auto& [name, t] : fp32_init) init[name] = &t;
  bool any = false;
  for (auto& [name, tensor] : impl_->optimizer.state()) {
    const std::string suffix = ".master";
    if (name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      auto it = init.find(name.substr(0, name.size() - suffix.size()));
      if (it != init.end()) {
        tensor->copy_from(*it->second);
        any = true;
      }
    }
  }
  if (any) impl_->optimizer.refresh_model_weights();
}

StepOptimizer::~StepOptimizer() = default;

double StepOptimizer::loss_scale() const {
  return impl_->optimizer.scale();
}
std::uint64_t StepOptimizer::weights_version() const {
  return impl_->optimizer.weights_version();
}
double StepOptimizer::lr_at(std::int64_t step) const {
  return impl_->schedule.lr_at(step);
}

StepOutcome StepOptimizer::step(std::int64_t step, Communicator* comm) {
  double lr = impl_->schedule.lr_at(step);
  impl_->optimizer.set_lr(lr);
  if (comm != nullptr && comm->size() > 1) {
    impl_->optimizer.set_found_inf_hook(
        [comm](Tensor& flag) { comm->all_reduce(flag, ReduceOp::Sum); });
  }
  optim::StepResult r = impl_->optimizer.step();
  StepOutcome o;
  o.skipped = r.skipped;
  o.found_inf = r.found_inf;
  o.grad_norm = r.grad_norm;
  o.loss_scale = impl_->optimizer.scaler().enabled() ? r.scale : 1.0;
  o.lr = lr;
  return o;
}

NamedTensors StepOptimizer::state() {
  NamedTensors out;
  for (auto& [name, tensor] : impl_->optimizer.state()) out.emplace_back(name, *tensor);
  return out;
}

void StepOptimizer::load_state(const std::map<std::string, Tensor>& tensors) {
  for (auto& [name, tensor] : impl_->optimizer.state()) {
    auto it = tensors.find(name);
    if (it == tensors.end()) {
      throw InputError("optimizer.safetensors: no state '" + name +
                       "' (a checkpoint of another optimizer or precision)");
    }
    if (it->second.shape() != tensor->shape()) {
      throw InputError("optimizer.safetensors: state '" + name + "' has shape " +
                       shape_str(it->second.shape()) + ", expected " + shape_str(tensor->shape()));
    }
    tensor->copy_from(it->second);
  }
  impl_->optimizer.refresh_model_weights();
}

config::LossScalerState StepOptimizer::scaler_state() const {
  config::LossScalerState s;
  auto st = impl_->optimizer.scaler().state();
  s.set_scale(st.scale);
  s.set_growth_tracker(st.growth_tracker);
  return s;
}

void StepOptimizer::load_scaler_state(const config::LossScalerState& state) {
  optim::LossScaler::State st;
  st.scale = state.scale();
  st.growth_tracker = state.growth_tracker();
  impl_->optimizer.scaler().load_state(st);
}

}  // namespace kiln::train
