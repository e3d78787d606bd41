#pragma once
// The optimizer's home in host memory (train.offload OPTIMIZER, docs/memory.md "Offload"): a host
// twin of every parameter, its working weights and its gradient in pinned memory, for an
// optimizer that runs on the CPU backend. Its masters and moments are then host tensors, and the
// device keeps only the model's weights and gradients. Each step the gradients come down, the host
// optimizer updates the twins' weights, and the weights go back up before the next forward.

#include <memory>
#include <vector>

#include "core/parameter.h"
#include "optim/sharded_optimizer.h"

namespace kiln::optim {

class HostOffload {
 public:
  // `parameters`: the model's, on their device; their current weights are copied to the twins.
  explicit HostOffload(const std::vector<Parameter*>& parameters);
  ~HostOffload();
  HostOffload(const HostOffload&) = delete;
  HostOffload& operator=(const HostOffload&) = delete;

  // The host twins (same names, shapes, dtypes and flags), in the model's order.
  std::vector<Parameter*> parameters();
  // Every gradient into its twin; returns when the host can read them.
  void gradients_to_host();
  // Every twin's weights into the model's, in stream order before whatever is enqueued next.
  void weights_to_device();
  // The model's weights into the twins (after something wrote the model's: a restored checkpoint).
  void weights_to_host();

 private:
  std::vector<Parameter*> model_;
  std::vector<std::unique_ptr<Parameter>> twins_;
  std::shared_ptr<void> block_;  // one pinned allocation for every twin tensor
  std::size_t bytes_ = 0;
};

// The same for ZeRO (train.offload_update HOST_CORES on several ranks): host twins of this rank's
// ranges only, so each rank's host optimizer holds its shard of the masters and moments. A shard
// group over another: the same ranks and sums, the ranges' weights and gradients on the host; its
// gather_parameters() copies the updated twins into the device's ranges, then gathers there.
class HostShardGroup final : public ShardGroup {
 public:
  explicit HostShardGroup(ShardGroup& device_group);
  ~HostShardGroup() override;

  int size() const override { return device_group_.size(); }
  int rank() const override { return device_group_.rank(); }
  Device device() const override { return Device::cpu(); }
  std::vector<ParameterRange> ranges() const override { return twins_; }
  void sum(std::vector<double>& values) override { device_group_.sum(values); }
  void gather_parameters() override;

  // Every range's reduced gradient into its twin; returns when the host can read them.
  void gradients_to_host();
  // The device's ranges of the weights into the twins (after a checkpoint was restored).
  void weights_to_host();

 private:
  ShardGroup& device_group_;
  std::vector<ParameterRange> device_ranges_;
  std::vector<ParameterRange> twins_;
  std::shared_ptr<void> block_;  // one pinned allocation for every twin tensor
};

}  // namespace kiln::optim
