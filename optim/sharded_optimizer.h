#pragma once
// ZeRO's optimizer: the mixed-precision optimizer of the ranges of the parameters this rank
// updates. Under ZeRO (stage 1 or 2) each rank holds fp32 masters and moments only for its shard
// of every gradient bucket; norms of whole tensors are this rank's partial sums added up over the
// ranks, and after an update every rank's new values reach every rank (ZeRO-3: the ranges are the
// only copy of the weights between uses, updated in place). Without a shard group the
// ranges are the whole parameters: the one-rank case of the same class, so checkpoints of any
// sharding load into any other (docs/data_parallel.md, "ZeRO").
//
// optim/ knows no communicator: the ranks' collectives are handed in as a ShardGroup (train/
// implements it over data parallelism's buckets; ZeRO-3's parameter gather fits in there too).

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/parameter.h"
#include "core/safetensors.h"
#include "optim/amp/amp.h"

namespace kiln::optim {

// One contiguous range of one parameter's flattened elements that this rank updates.
struct ParameterRange {
  Parameter* parameter = nullptr;
  std::int64_t offset = 0;
  std::int64_t numel = 0;
  Tensor grad;  // (numel,): the reduced gradient of the range
  // (numel,): where the range's weights live when it is not a range of Parameter::value (ZeRO-3
  // keeps only this rank's shard of every weight); undefined otherwise.
  Tensor value;
};

// The ranks that share the parameters, as a sharded optimizer needs them.
class ShardGroup {
 public:
  virtual ~ShardGroup() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;
  virtual Device device() const = 0;
  // This rank's ranges, in the same order on every step.
  virtual std::vector<ParameterRange> ranges() const = 0;
  // Collective: every element replaced by its sum over the ranks.
  virtual void sum(std::vector<double>& values) = 0;
  // Collective: every rank's updated ranges of Parameter::value reach every rank.
  virtual void gather_parameters() = 0;
};

class ShardedOptimizer {
 public:
  // `parameters`: the model's, in its order; `fp32_init` their fp32 initial values by name (O2's
  // masters start from them rather than from the half rounding; released once the masters hold
  // them, before the moments are allocated). `group` null: whole parameters.
  ShardedOptimizer(const std::vector<Parameter*>& parameters, NamedTensors fp32_init,
                   const OptimizerOptions& optimizer, const AmpOptions& amp, ShardGroup* group);
  ~ShardedOptimizer();

  MixedPrecisionOptimizer& optimizer() { return optimizer_; }
  const MixedPrecisionOptimizer& optimizer() const { return optimizer_; }
  bool sharded() const { return group_ != nullptr; }

  // One host-mode step; the whole updated weights are on every rank when it returns.
  StepResult step();

  NamedTensors state();  // for checkpoints
  // Which pieces state() holds: "zero_world_size", "zero_rank" and "piece:<parameter>" =
  // "<offset> <numel>"; empty without a group.
  std::map<std::string, std::string> shard_metadata() const;
  // Restores from optimizer files of any sharding (one whole file, or every rank's shard file of a
  // run on any number of ranks): each state tensor's range is cut from the pieces that cover it.
  // `what` names the checkpoint in errors (InputError).
  void load_state(const std::vector<const SafetensorsFile*>& files, const std::string& what);
  // The parameters whose ranges this rank updates (the whole ones without a group).
  std::vector<Parameter*> updated_parameters();

 private:
  // A range as a parameter of its own: its value a view into the model's weight, its gradient the
  // range's reduced gradient, so the optimizer and the mixed-precision pass run on it unchanged.
  struct Pieces {
    std::vector<std::unique_ptr<Parameter>> parameters;
    std::vector<std::size_t> model_index;  // per piece: its parameter's index in the model's list
    std::vector<std::int64_t> element_offsets;  // per piece: where it starts in its parameter
  };
  static Pieces make_pieces(const std::vector<Parameter*>& parameters, const ShardGroup& group);
  std::vector<Parameter*> piece_list() const;
  // O2's masters from `fp32_init` (this rank's range of each), which `done` releases.
  MasterSource masters_from(NamedTensors& fp32_init);
  void install_norm_hooks();

  ShardGroup* group_;
  std::vector<Parameter*> model_parameters_;
  Pieces pieces_;
  bool masters_from_init_ = false;  // set while optimizer_ is built
  MixedPrecisionOptimizer optimizer_;
  // Per parameter name: {offset, numel} of the range this rank holds, and the whole length.
  std::map<std::string, std::pair<std::int64_t, std::int64_t>> range_;
  std::map<std::string, std::int64_t> full_numel_;
};

}  // namespace kiln::optim
