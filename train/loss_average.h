#pragma once
// train.loss_average STEP_TOKENS (docs/data.md, "Chat data"): a step's loss and gradient average
// over every counted target of the step (all its micro-batches on all ranks) instead of averaging
// each micro-batch's own mean. With loss masks a micro-batch may count 10 trained tokens and the
// next 1,000; averaging their means would weigh each of the 10 a hundred times more (the
// gradient-accumulation pitfall Hugging Face fixed with num_items_in_batch).
//
// Before a step's first micro-batch, the step's batches' counted targets (Batch::counted_targets,
// counted on the host as the loader assembled them) are summed over the ranks and shared out per
// micro-batch and rank; the loss reads that share where it would read its own counted rows
// (StepScalars::loss_rows). The loss scale's division by the micro-batches and the gradients'
// average over the ranks then leave every counted target of the step with weight 1 / count.

#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "configs/experiment.h"
#include "data/loader.h"

namespace kiln::train {

class StepTokenAverage {
 public:
  explicit StepTokenAverage(Device device);
  // Writes the step's rows per micro-batch and rank, stream-ordered before the step's kernels.
  // `comm` null or of one rank: this process's batches alone.
  void begin_step(const std::vector<data::Batch>& batches, Communicator* comm);
  const float* rows() const { return rows_.data<float>(); }  // F32 [rows, 1 / rows]

 private:
  Tensor rows_;  // F32 (2) on the device
};

// train.loss_average resolved: STEP_TOKENS, or AUTO on data that masks targets (null otherwise).
std::unique_ptr<StepTokenAverage> make_step_token_average(const config::Experiment& experiment,
                                                          const data::Dataset& dataset,
                                                          Device device);

}  // namespace kiln::train
