#pragma once
// Optimizers: SGD (momentum, dampening, Nesterov, weight decay), AdamW (decoupled weight decay,
// bias correction, AMSGrad) and LAMB (trust ratio, Apex FusedLAMB clipping), with the semantics of
// torch.optim.SGD / torch.optim.AdamW and of the LAMB paper, on CPU and CUDA. Each is one rule type
// (optim/rules/*.h) listed in KILN_OPTIMIZERS (optim/optimizer_options.h); on CUDA a step is one
// multi-tensor launch over all parameters (LAMB: three), see optim/multi_tensor.h.
//
// The optimizer reads OptimizedTensor::grad and updates OptimizedTensor::value in place; state
// (moments, the step count) lives in named tensors so that checkpoints can save and restore it.
// Weights, gradients and state must be contiguous and on one device; state is f32 (f64 for f64
// weights on CPU) or bf16 (OptimizerOptions::moments_dtype). Half weights with fp32 state are
// allowed (O3); O2 passes fp32 masters with the model's (loss-scaled) half gradients, which step()
// unscales on the fly, and asks the optimizer to write the half copy (`model_copy`) in the same
// pass.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/parameter.h"
#include "core/tensor.h"
#include "optim/multi_tensor.h"
#include "optim/optimizer_options.h"

namespace kiln::optim {

// One tensor the optimizer updates.
struct OptimizedTensor {
  std::string name;   // the parameter's name: state is "<name>.exp_avg" etc.
  Tensor value;       // updated in place
  Tensor grad;        // same shape; read only (any floating dtype; half with f32 masters in O2)
  Tensor model_copy;  // optional: half weights written from the new value in the same pass (O2)
  bool no_weight_decay = false;
  double lr_multiplier = 1.0;  // resolved from the groups by make_optimized_tensors()
  double weight_decay = 0.0;
  std::int64_t element_offset = 0;  // a ZeRO piece: where it starts in the whole parameter
};

// Resolves groups and flags: one OptimizedTensor per parameter (value and grad shared).
std::vector<OptimizedTensor> make_optimized_tensors(const std::vector<Parameter*>& params,
                                                    const OptimizerOptions& options);
// The same resolution for one name and flag: {lr_multiplier, weight_decay}.
std::pair<double, double> resolve_group(const std::string& name, bool no_weight_decay,
                                        const OptimizerOptions& options);

class Optimizer {
 public:
  Optimizer(std::vector<OptimizedTensor> tensors, const OptimizerOptions& options);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  virtual const char* name() const = 0;  // "sgd"

  void set_lr(double lr) { lr_ = lr; }
  double lr() const { return lr_; }
  // Completed steps (skipped ones not counted); lives in the "optimizer.step" state tensor.
  std::int64_t step_count() const;

  // One update from the current gradients. `grad_unscale`, rounded once to float (> 0, finite),
  // multiplies every gradient element as it is read, before clipping, in the compute type (float;
  // double for f64) as the unscale pass does: O2 passes 1/loss_scale, so the loss-scaled half
  // gradients need no unscaled fp32 copy. The gradient tensors are left as they are.
  // `grad_norm` is the global L2 norm of the unscaled gradients when the caller already knows it
  // (the mixed-precision pass computes it); < 0: computed here if clipping needs it (one
  // device-to-host read). Returns the norm used, or -1 if none.
  double step(double grad_norm = -1.0, double grad_unscale = 1.0);

  // Resident mode (MixedPrecisionOptimizer::step_resident): enqueues one update whose lr, step
  // count, clipping (from state->grad_norm), skip and, with `unscale_from_state`, grad_unscale
  // (state->inv_scale) are read from `state` (memory of device()) when the kernels run. Nothing is
  // read back or counted on the host: load_step_count() takes the count the state holds.
  // Sharded optimizers (a tensor sumsq hook) are refused.
  void enqueue_resident_step(const StepState* state, bool unscale_from_state);
  void load_step_count(std::int64_t count);
  bool sharded() const { return static_cast<bool>(tensor_sumsq_hook_); }

  // Named state tensors for checkpoints: "optimizer.step" (i64, CPU) and per tensor
  // "<name>.momentum_buffer" | "<name>.exp_avg", "<name>.exp_avg_sq", "<name>.max_exp_avg_sq".
  // Restoring = copy_from() into these tensors.
  std::vector<std::pair<std::string, Tensor*>> state();

  const std::vector<OptimizedTensor>& tensors() const { return tensors_; }
  // LAMB's trust ratio needs the norms of whole parameters. A sharded optimizer (ZeRO) holds
  // pieces of them: the hook gets {param_sumsq, update_sumsq} per tensor, in tensor order, and
  // replaces each with the sum over the parameter's pieces on every rank (an all-reduce).
  void set_tensor_sumsq_hook(std::function<void(std::vector<double>& sums)> hook) {
    tensor_sumsq_hook_ = std::move(hook);
  }
  const OptimizerOptions& options() const { return options_; }
  Device device() const { return device_; }

 protected:
  // Applies one update; `grad_norm` is known (>= 0) when max_grad_norm > 0; `grad_unscale` goes
  // into the step's scalars (update_rules.h), which `resident()` overrides in resident mode.
  virtual void apply(double grad_norm, float grad_unscale) = 0;
  // The step's resident fields: the state is set only inside enqueue_resident_step().
  detail::ResidentFields resident() const { return resident_; }
  // Allocates a zeroed state tensor shaped like tensor i and registers it under "<name>.<key>".
  Tensor& add_state(std::size_t i, const std::string& key);
  // The descriptor list; `state_keys` names which state tensors go to state0..2.
  std::vector<detail::TensorEntry> entries(const std::vector<std::string>& state_keys);
  // A trust-ratio rule (LAMB) on a sharded optimizer: the per-tensor sums go through
  // tensor_sumsq_hook_ between the two phases.
  void apply_sharded_trust_ratio(const LambRule& rule, std::vector<detail::TensorEntry> list);

  std::vector<OptimizedTensor> tensors_;
  OptimizerOptions options_;
  Device device_;
  double lr_;
  detail::MultiTensorTable table_;
  std::function<void(std::vector<double>&)> tensor_sumsq_hook_;

 private:
  detail::ResidentFields resident_;
  std::vector<std::pair<std::string, std::unique_ptr<Tensor>>> state_;
  std::vector<std::vector<std::pair<std::string, Tensor*>>> tensor_state_;  // per tensor: key
  Tensor step_count_;                                                       // I64 (1) on CPU
};

// The optimizer of one rule (optim/rules/*.h): its state tensors are the rule's state_keys, and a
// step is the rule's update on the CPU or in one multi-tensor launch (LAMB: its stages).
// make_optimizer() picks the rule of options.kind from KILN_OPTIMIZERS.
template <typename Rule>
class RuleOptimizer : public Optimizer {
 public:
  RuleOptimizer(std::vector<OptimizedTensor> tensors, const OptimizerOptions& options);
  const char* name() const override { return Rule::kName; }

 protected:
  void apply(double grad_norm, float grad_unscale) override;

 private:
  std::vector<std::string> state_keys_;
};

std::unique_ptr<Optimizer> make_optimizer(std::vector<OptimizedTensor> tensors,
                                          const OptimizerOptions& options);
std::unique_ptr<Optimizer> make_optimizer(const std::vector<Parameter*>& params,
                                          const OptimizerOptions& options);

// The global L2 norm over every tensor (one multi-tensor pass on CUDA, partial sums in double
// combined in a fixed order: deterministic). One device-to-host read.
double global_norm(const std::vector<Tensor>& tensors);
// torch.nn.utils.clip_grad_norm_: grads *= min(1, max_norm / (norm + 1e-6)); returns the norm
// before clipping. A non-finite norm leaves the gradients as they are.
double clip_grad_norm(const std::vector<Tensor>& grads, double max_norm);
double clip_grad_norm(const std::vector<Parameter*>& params, double max_norm);

}  // namespace kiln::optim
