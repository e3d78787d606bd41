#pragma once
// What an optimizer is asked to do: its kind, its hyper-parameters, the parameter groups. Plain
// settings, read by the rules (optim/rules/*.h) when they build a step.

#include <string>
#include <vector>

namespace kiln::optim {

// Every optimizer, one line each: X(kind, rule type). The kind's config name is the rule's kName;
// the rule type is the whole update (optim/rules/*.h, included by optim/rules/all.h). Adding an
// optimizer is its rule, its line here and its value in configs/kiln.proto's OptimizerConfig.Kind.
#define KILN_OPTIMIZERS(X) \
  X(SGD, SgdRule)          \
  X(AdamW, AdamWRule)      \
  X(LAMB, LambRule)

#define KILN_OPTIMIZER_KIND_(kind, Rule) kind,
enum class OptimizerKind { KILN_OPTIMIZERS(KILN_OPTIMIZER_KIND_) };
#undef KILN_OPTIMIZER_KIND_
const char* optimizer_kind_name(OptimizerKind kind);              // "sgd", "adamw", "lamb"
OptimizerKind optimizer_kind_from_name(const std::string& name);  // InputError lists the known

// A rule giving the parameters whose name matches `pattern` (glob: * and ?, matched against the
// full dotted name) their own learning-rate multiplier and weight decay. The first match wins.
struct ParamGroupRule {
  std::string pattern;
  double lr_multiplier = 1.0;
  double weight_decay = -1.0;  // < 0: the optimizer's weight_decay
};

// The dtype of the optimizer's state (moments, momentum buffers): fp32 (f64 beside f64 weights on
// the CPU), or bf16 rounded stochastically at every store (half the bytes; llm.c, llm.q).
enum class MomentsDtype { FP32, BF16 };
enum class StateMemory { kDevice, kPinnedHost };

struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::AdamW;
  double lr = 1e-3;  // the base rate; set_lr() changes it (schedules)
  double weight_decay = 0.0;
  // SGD
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;
  // AdamW and LAMB
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  bool amsgrad = false;         // AdamW
  bool bias_correction = true;  // LAMB (AdamW always corrects)
  // Clipping by the global L2 norm of all gradients, 0 = off. SGD/AdamW: grads *= min(1,
  // max / (norm + 1e-6)) (torch.nn.utils.clip_grad_norm_); LAMB: grads /= max(1, norm / max)
  // (Apex FusedLAMB).
  double max_grad_norm = 0.0;
  MomentsDtype moments_dtype = MomentsDtype::FP32;
  // Where the state (moments, O2's masters) lives: beside the weights, or in pinned host memory
  // the device's kernels read and write over the bus (train.offload DEVICE_KERNELS).
  StateMemory state_memory = StateMemory::kDevice;
  std::vector<ParamGroupRule> groups;
  // Parameters flagged no_weight_decay (biases, norm weights) get weight decay 0 whatever the
  // group says, and LAMB leaves them out of the trust ratio.
  bool exclude_flagged_from_decay = true;
};

}  // namespace kiln::optim
