#pragma once
// The optimizer as the training loop sees it: the experiment's optimizer, LR schedule, gradient
// clipping and mixed-precision policy (master weights, loss scaling) behind one step() call.
// Found-inf decisions are global: the flag is all-reduced over the ranks before anyone decides,
// so every rank skips the same steps.

#include <map>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "configs/checkpoint.pb.h"
#include "configs/kiln.pb.h"
#include "core/safetensors.h"
#include "layers/layer.h"
#include "optim/sharded_optimizer.h"

namespace kiln::train {

struct StepOutcome {
  bool skipped = false;    // inf/NaN in the gradients: parameters unchanged
  bool found_inf = false;  // inf/NaN seen on some rank (skipped, or fatal without a scaler)
  double grad_norm = -1;   // global L2 norm before clipping, or -1 when not computed
  double loss_scale = 1;
  double lr = 0;
};

// The precision an experiment asks for: what layers run at and what parameters are stored in.
struct PrecisionChoice {
  PrecisionPolicy policy;
  DType parameter_dtype = DType::F32;
};
PrecisionChoice precision_for(const config::Experiment& experiment, Device device);

class StepOptimizer {
 public:
  // `parameters` are on their device in the parameter dtype, gradients in their final place
  // (data parallelism's buckets). `fp32_init` holds the fp32 initial values by parameter name
  // (O2's master weights start from them rather than from the rounded half copy; each is
  // released once its master holds it, before the moments are allocated).
  // `shards`: ZeRO's ranks (optim/sharded_optimizer.h): the optimizer then holds fp32 masters
  // and moments only for this rank's ranges, reads their reduced gradient shards, combines norms
  // across ranks and gathers the updated weights after each step. Null: whole parameters.
  StepOptimizer(const std::vector<Parameter*>& parameters, NamedTensors fp32_init,
                const config::Experiment& experiment, std::int64_t total_steps,
                optim::ShardGroup* shards = nullptr);
  ~StepOptimizer();

  std::uint64_t weights_version() const;  // for Context::weights_version (O1 weight casts)
  // Schedules the LR for optimizer step `step` (0-based), checks the gradients (all ranks agree
  // through `comm` when given), clips, updates, adjusts the loss scale.
  StepOutcome step(std::int64_t step, Communicator* comm);

  // Device-resident steps (train.cuda_graphs, optim/step_state.h): from now on the loss scale, the
  // skip decision, the clip coefficient, the step counts and the learning rate (a table of the
  // schedule) live where the parameters are, and step_resident() enqueues a whole step without
  // reading anything on the host, so it can be captured into a CUDA graph. `next_step` is the
  // 0-based step the next call updates for, `skipped_so_far` the steps skipped before it (a
  // resumed run's). Not for ZeRO (its norms are combined on the host).
  void make_resident(std::int64_t next_step, std::int64_t skipped_so_far);
  bool resident() const;
  // Where the loss scale the next backward multiplies by lives (Context::loss_scale_source).
  const double* loss_scale_source() const;
  void step_resident(Communicator* comm);
  // Waits for the device and returns the last resident step's outcome, with the total of skipped
  // steps in *skipped_steps; refreshes scaler_state() and the optimizer's step count. Throws
  // kiln::Error for inf/NaN gradients without a loss scaler or an overflow at the minimum scale.
  StepOutcome report(std::int64_t* skipped_steps);

  NamedTensors state();  // for checkpoints
  // Sharded (ZeRO) checkpoints: state() holds this rank's pieces; the metadata says which
  // ("zero_world_size", "zero_rank", and "piece:<parameter>" = "<offset> <numel>").
  bool sharded() const;
  std::map<std::string, std::string> shard_metadata() const;
  // Restores from optimizer files of any sharding (one whole file, or every rank's shard file of a
  // run on any number of ranks): each state tensor's range is cut from the pieces that cover it.
  // `what` names the checkpoint in errors.
  void load_state(const std::vector<const SafetensorsFile*>& files, const std::string& what);
  // The parameters whose pieces this rank updates (the whole ones without sharding).
  std::vector<Parameter*> updated_parameters();
  config::LossScalerState scaler_state() const;
  void load_scaler_state(const config::LossScalerState& state);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::train
