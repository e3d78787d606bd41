#pragma once
// How a run's gradients become the ones the optimizer reads, chosen once at set-up: on one rank
// they are used where backward wrote them; on several, DataParallel reduces them (all-reduce,
// half, PowerSGD, or ZeRO's reduce-scatter), overlapped with backward. The step calls the same
// methods either way, so it holds no "is there data parallelism" branch.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/data_parallel.h"
#include "layers/layer.h"
#include "optim/sharded_optimizer.h"

namespace kiln::train {

class GradientSync {
 public:
  virtual ~GradientSync() = default;

  // The first micro-step of an optimizer step: gradients start from zero (ZeRO-2: lazily, as
  // backward reaches the layers that write them).
  virtual void zero_gradients() = 0;
  // Accumulation micro-steps keep their gradients local; the last one reduces.
  virtual void set_accumulating(bool accumulating) = 0;
  // After an accumulation micro-step's backward (ZeRO's accumulation in the shards reduces it).
  virtual void end_micro_step() = 0;
  // The reduction's hooks on a training context (backward calls them).
  virtual void install_hooks(Context& ctx) = 0;
  // Waits for the step's reductions: the optimizer's gradients are complete after it.
  virtual void finish() = 0;
  // A captured step failed half-way: the buckets start over.
  virtual void reset_step() = 0;
  // ZeRO: the optimizer reads this rank's reduced shards, not whole gradients.
  virtual bool sharded() const = 0;
  virtual int zero_stage() const = 0;
  // After a skipped step (inf/NaN): compression's error feedback restarts.
  virtual void skipped_step() = 0;
  // Every rank gets rank 0's buffers (batch-norm statistics) before they are saved or used.
  virtual void broadcast_buffers() = 0;
  // The reducer's own state (PowerSGD: this rank's error feedback and Q), for checkpoints;
  // empty when it keeps none.
  virtual NamedTensors state() const = 0;
  // A resumed run: the optimizer steps done, and the state saved (InputError naming `where`).
  virtual void set_finished_steps(std::int64_t steps) = 0;
  virtual void load_state(const NamedTensors& state, const std::string& where) = 0;
  // ZeRO: the ranks sharing the optimizer (their shard ranges, sums and the gather of updated
  // weights); null otherwise.
  virtual optim::ShardGroup* shard_group() = 0;
  // The reducer behind it (benchmark timing); null on one rank.
  virtual DataParallel* data_parallel() = 0;
  // ZeRO-3, collective: whole weights on every rank from gather_weights() until
  // release_weights() (checkpoints, evaluation, loading); `written`: what was written into them
  // meanwhile becomes each rank's shard. Elsewhere the weights are always whole: nothing to do.
  virtual void gather_weights() = 0;
  virtual void release_weights(bool written) = 0;
  // ZeRO-3: buckets of weights all-gathered since the start (DataParallel::value_gathers); 0
  // elsewhere.
  virtual std::uint64_t weight_gathers() const = 0;
};

// Whole weights while it lives (GradientSync::gather_weights).
class WholeWeights {
 public:
  WholeWeights(GradientSync& sync, bool written) : sync_(sync), written_(written) {
    sync_.gather_weights();
  }
  ~WholeWeights() { sync_.release_weights(written_); }
  WholeWeights(const WholeWeights&) = delete;
  WholeWeights& operator=(const WholeWeights&) = delete;

 private:
  GradientSync& sync_;
  bool written_;
};

// ZeRO-3's units: the layers whose forward and backward gather the weights they use (each child
// of the model, or of a Sequential child: a block, an embedding, a head), with those parameters,
// tied ones included.
struct WeightUnit {
  Layer* layer = nullptr;
  std::vector<Parameter*> parameters;
};
std::vector<WeightUnit> weight_units(Layer& model);

// One rank: zeroes the parameters' gradients, reduces nothing.
std::unique_ptr<GradientSync> make_local_gradients(std::vector<Parameter*> parameters);
// Several ranks: DataParallel's buckets and strategy. ZeRO-3 gathers each unit's weights as its
// layer's forward and backward begin and releases them as they end; the parameters of no unit
// (a model's own) stay gathered. `gather_once_per_step` (parallel.zero3_gather_once_per_step):
// a unit gathered in a step stays whole until the backward of the step's last micro-step ends.
std::unique_ptr<GradientSync> make_data_parallel_sync(std::unique_ptr<DataParallel> dp,
                                                      std::vector<WeightUnit> units = {},
                                                      bool gather_once_per_step = false);

}  // namespace kiln::train
