#pragma once
// The step's scalars as kernels read them: the micro-step counter (dropout's random stream) and
// the loss scale that the loss's backward multiplies by, in memory of the tensors' device (host
// memory on the CPU), read when a kernel runs. A device-resident or graphed run advances them on
// the device; a host-driven run (and a test) writes them: layers read them one way in every mode.

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace kiln {

struct StepScalars {
  const std::uint64_t* step = nullptr;  // the micro-step: dropout masks are keyed on it
  const double* loss_scale = nullptr;   // null: 1
  std::int64_t loss_scale_divisor = 1;  // micro-batches per step: each adds 1/divisor
  // The rows a micro-batch's loss averages over, in memory like the loss scale: F32 [rows,
  // 1 / rows]; null: its own counted rows. The step's counted targets over all its micro-batches
  // and ranks, shared out per micro-batch and rank (train.loss_average STEP_TOKENS), so that every
  // counted target weighs the same in the step's gradient however the masks fall.
  const float* loss_rows = nullptr;
};

// Step scalars the host writes (stream-ordered on the current stream, so a kernel enqueued before
// a write reads the value before it).
class HostWrittenScalars {
 public:
  explicit HostWrittenScalars(Device device, std::uint64_t step = 0, double loss_scale = 1.0)
      : step_(Tensor::from_vector(std::vector<std::int64_t>{static_cast<std::int64_t>(step)}, {1})
                  .to(device)),
        loss_scale_(Tensor::from_vector(std::vector<double>{loss_scale}, {1}).to(device)) {}
  void set_step(std::uint64_t step) {
    step_.copy_from(
        Tensor::from_vector(std::vector<std::int64_t>{static_cast<std::int64_t>(step)}, {1}));
  }
  void set_loss_scale(double scale) {
    loss_scale_.copy_from(Tensor::from_vector(std::vector<double>{scale}, {1}));
  }
  StepScalars scalars(std::int64_t loss_scale_divisor = 1) const {
    return {static_cast<const std::uint64_t*>(step_.data()),
            static_cast<const double*>(loss_scale_.data()), loss_scale_divisor};
  }

 private:
  Tensor step_;        // I64 (1)
  Tensor loss_scale_;  // F64 (1)
};

}  // namespace kiln
