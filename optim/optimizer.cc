// Optimizer bookkeeping (groups, state, dispatch to the CPU loops or the CUDA multi-tensor
// kernels) and global-norm clipping. The update arithmetic is in optim/update_rules.h.

#include "optim/optimizer.h"

#include <fnmatch.h>

#include <algorithm>
#include <cmath>

#include "core/enum_names.h"
#include "core/stream.h"

namespace kiln::optim {
namespace {

bool glob_match(const std::string& pattern, const std::string& name) {
  return fnmatch(pattern.c_str(), name.c_str(), 0) == 0;
}

DType state_dtype(const Tensor& value, MomentsDtype moments) {
  if (moments == MomentsDtype::BF16) return DType::BF16;
  return value.dtype() == DType::F64 ? DType::F64 : DType::F32;
}

// FNV-1a: each parameter's own stream of rounding bits, the same in every process and piece.
std::uint64_t name_key(const std::string& name) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return h;
}

void check_tensor(const OptimizedTensor& t, Device device) {
  KILN_CHECK(t.value.defined() && t.grad.defined(),
             "optimizer: '" + t.name + "' has no value or grad");
  KILN_CHECK(t.value.shape() == t.grad.shape(), "optimizer: '" + t.name + "' value " +
                                                    shape_str(t.value.shape()) + " but grad " +
                                                    shape_str(t.grad.shape()));
  KILN_CHECK(t.value.is_contiguous() && t.grad.is_contiguous(),
             "optimizer: '" + t.name + "' must be contiguous");
  KILN_CHECK(is_floating(t.value.dtype()) && is_floating(t.grad.dtype()),
             "optimizer: '" + t.name + "' is not floating point");
  KILN_CHECK(t.value.device() == device && t.grad.device() == device,
             "optimizer: '" + t.name + "' is on " + t.value.device().str() + ", others on " +
                 device.str());
  if (device.is_cuda()) {
    KILN_CHECK(t.value.dtype() != DType::F64 && t.grad.dtype() != DType::F64,
               "optimizer: f64 weights are CPU-only ('" + t.name + "')");
  }
  if (t.model_copy.defined()) {
    KILN_CHECK(t.model_copy.shape() == t.value.shape() && t.model_copy.is_contiguous() &&
                   t.model_copy.device() == device,
               "optimizer: model copy of '" + t.name + "' must match its value");
  }
}

std::vector<detail::TensorEntry> grad_entries(const std::vector<Tensor>& grads) {
  std::vector<detail::TensorEntry> entries;
  for (const Tensor& g : grads) {
    KILN_CHECK(g.is_contiguous() && is_floating(g.dtype()),
               "global_norm: " + g.str() + " must be contiguous floating");
    detail::TensorEntry e;
    e.value = g.data();
    e.grad = g.data();
    e.numel = g.numel();
    e.value_dtype = static_cast<std::int32_t>(g.dtype());
    e.grad_dtype = e.value_dtype;
    entries.push_back(e);
  }
  return entries;
}

// The global norm of tensors * unscale: the unscale pass without writing, so that it sees the
// values the update rules compute from a scaled gradient.
double unscaled_global_norm(const std::vector<Tensor>& tensors, float unscale) {
  if (tensors.empty()) return 0.0;
  Device device = tensors.front().device();
  auto list = grad_entries(tensors);
  if (device.is_cpu()) {
    bool found_inf = false;
    return std::sqrt(detail::cpu_unscale_check_sumsq(list, unscale, false, &found_inf));
  }
  detail::MultiTensorTable table;
  table.set(std::move(list), device);
  Tensor stats = Tensor::zeros({2}, DType::F32, device);  // found_inf, norm
  void* stream = current_stream(device);
  detail::cuda_unscale_check_sumsq(table, unscale, false, static_cast<float*>(stats.data()),
                                   stream);
  detail::cuda_partials_norm(table, static_cast<float*>(stats.data()) + 1, stream);
  return stats.to_vector<float>()[1];
}

}  // namespace

namespace {
#define KILN_OPTIMIZER_NAME_(kind, Rule) {OptimizerKind::kind, Rule::kName},
constexpr EnumName<OptimizerKind> kOptimizerKindNames[] = {KILN_OPTIMIZERS(KILN_OPTIMIZER_NAME_)};
#undef KILN_OPTIMIZER_NAME_
}  // namespace

const char* optimizer_kind_name(OptimizerKind kind) {
  return enum_name(kOptimizerKindNames, kind);
}

OptimizerKind optimizer_kind_from_name(const std::string& name) {
  return parse_enum(kOptimizerKindNames, name, "optimizer");
}

std::pair<double, double> resolve_group(const std::string& name, bool no_weight_decay,
                                        const OptimizerOptions& options) {
  double lr_multiplier = 1.0, weight_decay = options.weight_decay;
  for (const ParamGroupRule& rule : options.groups) {
    if (glob_match(rule.pattern, name)) {
      lr_multiplier = rule.lr_multiplier;
      if (rule.weight_decay >= 0) weight_decay = rule.weight_decay;
      break;
    }
  }
  if (no_weight_decay && options.exclude_flagged_from_decay) weight_decay = 0.0;
  return {lr_multiplier, weight_decay};
}

std::vector<OptimizedTensor> make_optimized_tensors(const std::vector<Parameter*>& params,
                                                    const OptimizerOptions& options) {
  std::vector<OptimizedTensor> out;
  for (Parameter* p : params) {
    OptimizedTensor t;
    t.name = p->name;
    t.value = p->value;
    t.grad = p->grad;
    t.no_weight_decay = p->no_weight_decay;
    std::tie(t.lr_multiplier, t.weight_decay) = resolve_group(p->name, p->no_weight_decay, options);
    out.push_back(std::move(t));
  }
  return out;
}

Optimizer::Optimizer(std::vector<OptimizedTensor> tensors, const OptimizerOptions& options)
    : tensors_(std::move(tensors)), options_(options), lr_(options.lr) {
  if (options.lr < 0)
    throw InputError("optimizer lr must be >= 0, got " + std::to_string(options.lr));
  if (options.weight_decay < 0) {
    throw InputError("optimizer weight_decay must be >= 0, got " +
                     std::to_string(options.weight_decay));
  }
  if (options.max_grad_norm < 0) {
    throw InputError("optimizer max_grad_norm must be >= 0 (0 = no clipping), got " +
                     std::to_string(options.max_grad_norm));
  }
  if (!tensors_.empty()) device_ = tensors_.front().value.device();
  for (const OptimizedTensor& t : tensors_) check_tensor(t, device_);
  tensor_state_.resize(tensors_.size());
  step_count_ = Tensor::zeros({1}, DType::I64);
  state_.emplace_back("optimizer.step", std::make_unique<Tensor>(step_count_));
}

std::int64_t Optimizer::step_count() const {
  return step_count_.data<std::int64_t>()[0];
}

Tensor& Optimizer::add_state(std::size_t i, const std::string& key) {
  const OptimizedTensor& t = tensors_[i];
  const DType dtype = state_dtype(t.value, options_.moments_dtype);
  auto tensor =
      std::make_unique<Tensor>(options_.state_memory == StateMemory::kPinnedHost
                                   ? Tensor::zeros_in_host_memory(t.value.shape(), dtype, device_)
                                   : Tensor::zeros(t.value.shape(), dtype, device_));
  Tensor* raw = tensor.get();
  state_.emplace_back(t.name + "." + key, std::move(tensor));
  tensor_state_[i].emplace_back(key, raw);
  return *raw;
}

std::vector<std::pair<std::string, Tensor*>> Optimizer::state() {
  std::vector<std::pair<std::string, Tensor*>> out;
  for (auto& [name, tensor] : state_) out.emplace_back(name, tensor.get());
  return out;
}

std::vector<detail::TensorEntry> Optimizer::entries(const std::vector<std::string>& state_keys) {
  std::vector<detail::TensorEntry> out;
  out.reserve(tensors_.size());
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    const OptimizedTensor& t = tensors_[i];
    detail::TensorEntry e;
    e.value = t.value.data();
    e.grad = t.grad.data();
    if (t.model_copy.defined()) {
      e.copy = t.model_copy.data();
      e.copy_dtype = static_cast<std::int32_t>(t.model_copy.dtype());
    }
    void** slots[3] = {&e.state0, &e.state1, &e.state2};
    for (std::size_t k = 0; k < state_keys.size() && k < 3; ++k) {
      for (auto& [key, tensor] : tensor_state_[i]) {
        if (key == state_keys[k]) *slots[k] = tensor->data();
      }
    }
    e.numel = t.value.numel();
    e.lr_multiplier = t.lr_multiplier;
    e.weight_decay = t.weight_decay;
    e.value_dtype = static_cast<std::int32_t>(t.value.dtype());
    e.grad_dtype = static_cast<std::int32_t>(t.grad.dtype());
    e.adapt = t.no_weight_decay && options_.exclude_flagged_from_decay ? 0 : 1;
    e.state_dtype = static_cast<std::int32_t>(state_dtype(t.value, options_.moments_dtype));
    e.rng_key = name_key(t.name);
    e.element_offset = t.element_offset;
    out.push_back(e);
  }
  return out;
}

double Optimizer::step(double grad_norm, double grad_unscale) {
  // Rounded once: exact in float and double compute types alike (the unscale pass's factor).
  const float unscale = static_cast<float>(grad_unscale);
  if (!(unscale > 0.0f) || !std::isfinite(unscale)) {
    throw InputError("optimizer step: grad_unscale must be finite and > 0 in float, got " +
                     std::to_string(grad_unscale));
  }
  if (options_.max_grad_norm > 0 && grad_norm < 0) {
    std::vector<Tensor> grads;
    for (const OptimizedTensor& t : tensors_) grads.push_back(t.grad);
    grad_norm = unscaled_global_norm(grads, unscale);
  }
  apply(grad_norm, unscale);
  step_count_.data<std::int64_t>()[0] += 1;
  return options_.max_grad_norm > 0 ? grad_norm : -1.0;
}

void Optimizer::enqueue_resident_step(const StepState* state, bool unscale_from_state) {
  KILN_CHECK(!sharded(),
             "optimizer: resident steps need the whole parameters (ZeRO-sharded "
             "optimizers stay in host mode)");
  KILN_CHECK(state != nullptr, "optimizer: resident step without a state");
  resident_.state = state;
  resident_.max_grad_norm = options_.max_grad_norm;
  resident_.unscale_from_state = unscale_from_state;
  // The by-value arguments are placeholders: every kernel takes the scalars from the state.
  apply(0.0, 1.0f);
  resident_ = detail::ResidentFields{};
}

void Optimizer::load_step_count(std::int64_t count) {
  step_count_.data<std::int64_t>()[0] = count;
}

template <typename Rule>
RuleOptimizer<Rule>::RuleOptimizer(std::vector<OptimizedTensor> tensors,
                                   const OptimizerOptions& options)
    : Optimizer(std::move(tensors), options), state_keys_(Rule::state_keys(options)) {
  Rule::check(options);
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    for (const std::string& key : state_keys_) add_state(i, key);
  }
}

template <typename Rule>
void RuleOptimizer<Rule>::apply(double grad_norm, float grad_unscale) {
  Rule rule = Rule::from_options(options_);
  rule.lr = lr_;
  rule.grad_unscale = grad_unscale;
  rule.load_counts(step_count(), grad_norm, options_.max_grad_norm);
  rule.resident = resident();
  auto list = entries(state_keys_);
  if constexpr (Rule::kTrustRatio) {
    if (tensor_sumsq_hook_) {
      apply_sharded_trust_ratio(rule, std::move(list));
      return;
    }
  }
  if (device_.is_cpu()) {
    detail::cpu_step(list, rule);
    return;
  }
  table_.set(std::move(list), device_);
  detail::cuda_step(table_, rule, current_stream(device_));
}

void Optimizer::apply_sharded_trust_ratio(const LambRule& rule,
                                          std::vector<detail::TensorEntry> list) {
  if (device_.is_cpu()) {
    std::vector<double> sums = detail::cpu_lamb_moments_sumsq(list, rule);
    tensor_sumsq_hook_(sums);
    detail::cpu_lamb_apply(list, rule, sums);
    return;
  }
  const std::int64_t n = static_cast<std::int64_t>(list.size());
  table_.set(std::move(list), device_);
  void* stream = current_stream(device_);
  // The per-tensor sums go through the host (one read per step) to be combined across ranks.
  Tensor sums = Tensor::zeros({2 * std::max<std::int64_t>(n, 1)}, DType::F64, device_);
  detail::cuda_lamb_moments_sumsq(table_, rule, static_cast<double*>(sums.data()), stream);
  std::vector<double> host = sums.to_vector<double>();
  host.resize(static_cast<std::size_t>(2 * n));
  tensor_sumsq_hook_(host);
  if (n > 0) sums.slice(0, 0, 2 * n).copy_from(Tensor::from_vector(host, {2 * n}));
  detail::cuda_lamb_apply(table_, rule, static_cast<const double*>(sums.data()), stream);
}

std::unique_ptr<Optimizer> make_optimizer(std::vector<OptimizedTensor> tensors,
                                          const OptimizerOptions& options) {
#define KILN_OPTIMIZER_CASE_(kind, Rule) \
  case OptimizerKind::kind:              \
    return std::make_unique<RuleOptimizer<Rule>>(std::move(tensors), options);
  switch (options.kind) { KILN_OPTIMIZERS(KILN_OPTIMIZER_CASE_) }
#undef KILN_OPTIMIZER_CASE_
  throw InputError("unknown optimizer kind");
}

std::unique_ptr<Optimizer> make_optimizer(const std::vector<Parameter*>& params,
                                          const OptimizerOptions& options) {
  return make_optimizer(make_optimized_tensors(params, options), options);
}

double global_norm(const std::vector<Tensor>& tensors) {
  return unscaled_global_norm(tensors, 1.0f);
}

double clip_grad_norm(const std::vector<Tensor>& grads, double max_norm) {
  double norm = global_norm(grads);
  double coef = detail::clip_coefficient(norm, max_norm);
  if (coef < 1.0) {
    auto list = grad_entries(grads);
    Device device = grads.front().device();
    if (device.is_cpu()) {
      detail::cpu_scale_grads(list, coef);
    } else {
      detail::MultiTensorTable table;
      table.set(std::move(list), device);
      detail::cuda_scale_grads(table, static_cast<float>(coef), current_stream(device));
    }
  }
  return norm;
}

double clip_grad_norm(const std::vector<Parameter*>& params, double max_norm) {
  std::vector<Tensor> grads;
  for (Parameter* p : params) grads.push_back(p->grad);
  return clip_grad_norm(grads, max_norm);
}

}  // namespace kiln::optim
