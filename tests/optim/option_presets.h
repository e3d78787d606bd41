#pragma once
// The optimizer settings several optimizer tests start from: each kind with weight decay (and
// SGD with momentum) on, at a learning rate that moves a small model visibly in a few steps.

#include "optim/optimizer.h"

namespace kiln::optim::presets {

inline OptimizerOptions sgd_momentum_options() {
  OptimizerOptions o;
  o.kind = OptimizerKind::SGD;
  o.lr = 0.05;
  o.momentum = 0.9;
  o.weight_decay = 0.01;
  return o;
}

inline OptimizerOptions adamw_options() {
  OptimizerOptions o;
  o.kind = OptimizerKind::AdamW;
  o.lr = 1e-3;
  o.weight_decay = 0.01;
  return o;
}

inline OptimizerOptions lamb_options() {
  OptimizerOptions o;
  o.kind = OptimizerKind::LAMB;
  o.lr = 2e-3;
  o.eps = 1e-6;
  o.weight_decay = 0.01;
  return o;
}

}  // namespace kiln::optim::presets
