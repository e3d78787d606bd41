#include "train/fault_injection.h"

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <thread>

namespace kiln::train {

FaultInjection FaultInjection::from_environment(int rank) {
  FaultInjection fault;
  const char* kind = std::getenv("KILN_FAULT_KIND");
  if (kind == nullptr) return fault;
  fault.kind_ = kind;
  const char* step = std::getenv("KILN_FAULT_STEP");
  fault.step_ = step ? std::atoll(step) : 0;
  const char* fault_rank = std::getenv("KILN_FAULT_RANK");
  fault.this_rank_ = (fault_rank ? std::atoi(fault_rank) : 0) == rank;
  return fault;
}

bool FaultInjection::here(std::int64_t step, const char* kind) const {
  return this_rank_ && step == step_ && kind_ == kind;
}

void FaultInjection::before_step(std::int64_t step) const {
  if (!this_rank_) return;
  if (kind_ == "slow-step" && step >= step_) {
    std::this_thread::sleep_for(std::chrono::seconds(2));
    return;
  }
  if (step != step_) return;
  std::fflush(stdout);
  if (kind_ == "kill") std::raise(SIGKILL);
  if (kind_ == "exit3") std::_Exit(3);
  if (kind_ == "hang") std::raise(SIGSTOP);
}

Tensor FaultInjection::inputs(std::int64_t step, const Tensor& inputs) const {
  if (!here(step, "nan-input") || !is_floating(inputs.dtype())) return inputs;
  Tensor poisoned = inputs.clone();
  poisoned.fill(std::nan(""));
  return poisoned;
}

bool FaultInjection::acts_on(std::int64_t step) const {
  return here(step, "nan-input") || here(step, "inf-grad") ||
         (this_rank_ && kind_ == "inf-grad-always" && step >= step_);
}

void FaultInjection::gradients(std::int64_t step, const std::vector<Parameter*>& parameters) const {
  const bool once = here(step, "inf-grad");
  const bool always = this_rank_ && kind_ == "inf-grad-always" && step >= step_;
  if (!(once || always) || parameters.empty()) return;
  Tensor grad = parameters.front()->grad;
  grad.slice(0, 0, 1).fill(std::numeric_limits<double>::infinity());
}

}  // namespace kiln::train
