#pragma once
// The trainer's parts, shared by trainer.cc (the loop and the step), trainer_setup.cc (building
// them from the experiment) and benchmark.cc. Not part of the public interface.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "configs/experiment.h"
#include "data/loader.h"
#include "layers/models/model.h"
#include "layers/softmax_cross_entropy.h"
#include "train/checkpointer.h"
#include "train/evaluator.h"
#include "train/fault_injection.h"
#include "train/fp8_amax_reduction.h"
#include "train/gradient_sync.h"
#include "train/graphed_step.h"
#include "train/loss_average.h"
#include "train/loss_stage.h"
#include "train/metrics_sink.h"
#include "train/run_lock.h"
#include "train/step_optimizer.h"
#include "train/trainer.h"

namespace kiln::train {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct Trainer::State {
  config::Experiment e;
  World world;
  TrainerOptions options;
  // Held (rank 0, kiln train) until the trainer ends, before anything is written.
  std::vector<std::unique_ptr<RunLock>> directory_locks;
  Device device;
  Model model;
  std::vector<Parameter*> parameters;  // model.net->parameters(), listed once, not every step
  PrecisionChoice precision;
  bool channels_last_layout = false;  // NHWC activations (run_setup.h channels_last)
  config::BatchPlan plan;
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<GradientSync> sync;
  // Several ranks with FP8 delayed scaling: the amax histories merged after each backward.
  std::unique_ptr<Fp8AmaxReduction> fp8_amax;
  std::unique_ptr<StepOptimizer> optimizer;
  std::unique_ptr<data::DataLoader> loader;
  SoftmaxCrossEntropy loss_fn;
  std::unique_ptr<LossStage> loss_stage;  // forward, loss and backward of a micro-batch
  // train.loss_average STEP_TOKENS: the loss over the step's counted targets (null: each
  // micro-batch's own)
  std::unique_ptr<StepTokenAverage> token_average;
  std::unique_ptr<MetricsSink> metrics;
  std::unique_ptr<Checkpointer> checkpointer;
  std::unique_ptr<Evaluator> evaluator;
  std::unique_ptr<GraphedStep> graphs;  // every micro-step goes through it, in every StepMode
  FaultInjection faults;
  StepCounters counters;
  std::int64_t total_steps = 0;
  double flops_per_sample = 0;      // forward + backward
  double peak_flops = 0;            // the GPU's dense half-precision peak, 0 if unknown
  double tokens_per_sample = 0;     // token models (I64 inputs): the sequence length; else 0
  std::size_t optimizer_bytes = 0;  // allocated by the optimizer's construction (this rank)

  bool rank0() const { return world.rank == 0; }
  Context make_context(bool training) const;
  // One optimizer step: the micro-batches' forward and backward, the all-reduce, the update.
  StepOutcome run_step(Context& ctx, Tensor& loss_sum, std::int64_t* micro_count,
                       std::int64_t* sample_count);
  // A step's data could not be read: saves the steps since the last checkpoint where it can
  // (one rank) and returns `error` with what was kept and how to go on.
  std::string keep_work_before_data_error(const std::string& error,
                                          const data::LoaderState& position);
  // One micro-batch's work, what a graph captures: zero the gradients (first), forward, loss,
  // backward, and on the last the reduction's end and the optimizer. Returns the optimizer's
  // outcome in Eager mode (last micro-batch), else an empty one.
  StepOutcome micro_step_work(Context& ctx, const Tensor& inputs, const Tensor& targets,
                              MicroPosition position, Tensor& loss_sum);
  // Resident steps: waits for the device and returns the last step's outcome.
  StepOutcome resident_outcome() { return optimizer->report(&counters.skipped); }
};

}  // namespace kiln::train
