#pragma once
// The trainer's state, shared by its parts (trainer.cc: set-up, the step, train and evaluate;
// benchmark.cc). Not part of the public interface.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/data_parallel.h"
#include "configs/experiment.h"
#include "data/loader.h"
#include "layers/models/model.h"
#include "layers/softmax_cross_entropy.h"
#include "optim/amp/amp.h"
#include "train/checkpoint.h"
#include "train/fault_injection.h"
#include "train/metrics_sink.h"
#include "train/run_lock.h"
#include "train/step_graphs.h"
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
  config::BatchPlan plan;
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<DataParallel> dp;
  std::unique_ptr<StepOptimizer> optimizer;
  std::shared_ptr<data::Dataset> train_set, eval_set;
  std::unique_ptr<data::DataLoader> loader;
  SoftmaxCrossEntropy loss_fn;
  std::unique_ptr<CheckpointStore> store;
  std::unique_ptr<MetricsSink> metrics;
  FaultInjection faults;
  std::int64_t step = 0;        // optimizer steps completed
  std::int64_t micro_step = 0;  // forward/backward passes completed
  std::int64_t total_steps = 0;
  std::int64_t skipped = 0;
  double flops_per_sample = 0;      // forward + backward
  double peak_flops = 0;            // the GPU's dense half-precision peak, 0 if unknown
  std::size_t optimizer_bytes = 0;  // allocated by the optimizer's construction (this rank)
  // train.cuda_graphs: the optimizer's step state is resident (no host read in a step) and, on
  // CUDA, steady micro-steps replay captured graphs. Null when off.
  std::unique_ptr<StepGraphs> graphs;

  bool rank0() const { return world.rank == 0; }
  Context make_context(bool training) const;
  // One optimizer step: the micro-batches' forward and backward, the all-reduce, the update.
  StepOutcome run_step(Context& ctx, Tensor& loss_sum, std::int64_t* micro_count,
                       std::int64_t* sample_count);
  // One micro-batch's work, what a graph captures: zero the gradients (first), forward, loss,
  // backward, and on the last the all-reduce's end and the optimizer. Returns the optimizer's
  // outcome in host mode (last micro-batch), else an empty one.
  StepOutcome micro_step_work(Context& ctx, const Tensor& inputs, const Tensor& targets,
                              MicroPosition position, Tensor& loss_sum);
  // The micro-batch through its graph (captured at its second steady run) or eagerly.
  void graphed_micro_step(Context& ctx, const Tensor& inputs, const Tensor& targets,
                          MicroPosition position, Tensor& loss_sum);
  // Resident steps: waits for the device, returns the last step's outcome and updates `skipped`.
  StepOutcome resident_outcome();
  // Logs a reason a micro-step ran eagerly, once per reason.
  void say_eager(const std::string& reason);
};

}  // namespace kiln::train
