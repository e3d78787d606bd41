#pragma once
// The optimizer's home in host memory (train.offload OPTIMIZER, docs/memory.md "Offload"): a host
// twin of every parameter, its working weights and its gradient in pinned memory, for an
// optimizer that runs on the CPU backend. Its masters and moments are then host tensors, and the
// device keeps only the model's weights and gradients. Each step the gradients come down, the host
// optimizer updates the twins' weights, and the weights go back up before the next forward.

#include <memory>
#include <vector>

#include "core/parameter.h"

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

}  // namespace kiln::optim
