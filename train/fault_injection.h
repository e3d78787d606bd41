#pragma once
// Faults injected on purpose for the reliability tests (docs/reliability.md), chosen by the
// environment: KILN_FAULT_KIND (kill | exit3 | hang | slow-step | inf-grad | inf-grad-always |
// nan-input), KILN_FAULT_STEP (the optimizer step, default 0) and KILN_FAULT_RANK (default 0).
// Without KILN_FAULT_KIND nothing happens.

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "layers/layer.h"

namespace kiln::train {

class FaultInjection {
 public:
  static FaultInjection from_environment(int rank);

  // Before step `step` starts: kill, exit3 and hang act here; slow-step sleeps 2 s in every step
  // from `step` on (a step longer than a test's grace period).
  void before_step(std::int64_t step) const;
  // nan-input: the step's floating-point inputs become NaN (returns a copy; else `inputs`).
  Tensor inputs(std::int64_t step, const Tensor& inputs) const;
  // inf-grad (at `step`) and inf-grad-always (from `step` on): an inf in the first gradient.
  void gradients(std::int64_t step, const std::vector<Parameter*>& parameters) const;
  // Whether inputs() or gradients() change anything at `step` (such a step runs eagerly, not
  // as a captured CUDA graph, which would not see them).
  bool acts_on(std::int64_t step) const;

 private:
  bool here(std::int64_t step, const char* kind) const;
  std::string kind_;
  std::int64_t step_ = -1;
  bool this_rank_ = false;
};

}  // namespace kiln::train
