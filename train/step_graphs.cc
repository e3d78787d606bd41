#include "train/step_graphs.h"

#include "core/allocator.h"

namespace kiln::train {

MicroPosition micro_position(int micro, int micro_batches) {
  if (micro_batches == 1) return MicroPosition::Only;
  if (micro == 0) return MicroPosition::First;
  return micro == micro_batches - 1 ? MicroPosition::Last : MicroPosition::Middle;
}

StepGraphs::StepGraphs(Device d) : device(d) {
  if (device.is_cuda()) stream = Stream::create(device);
}

StepGraphs::~StepGraphs() {
  // The graphs go first; then the pool's memory may serve other work again.
  graphs.clear();
  if (device.is_cuda()) {
    stream.synchronize();
    cuda_allocator(device.index).release_pool(&pool);
  }
}

bool StepGraphs::steady(const Tensor& batch_inputs, const Tensor& batch_targets) const {
  return inputs.defined() && batch_inputs.shape() == inputs.shape() &&
         batch_inputs.dtype() == inputs.dtype() && batch_targets.shape() == targets.shape() &&
         batch_targets.dtype() == targets.dtype();
}

ComputeStreamScope::ComputeStreamScope(StepGraphs* graphs) {
  if (graphs == nullptr || !graphs->device.is_cuda()) return;
  graphs_ = graphs;
  device_synchronize(graphs->device);
  guard_ = std::make_unique<StreamGuard>(graphs->device, graphs->stream.handle());
}

ComputeStreamScope::~ComputeStreamScope() {
  if (graphs_ == nullptr) return;
  try {
    graphs_->stream.synchronize();
  } catch (const std::exception&) {
    // Leaving by an exception already: the error that matters is that one.
  }
}

}  // namespace kiln::train
