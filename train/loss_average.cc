#include "train/loss_average.h"

#include <algorithm>
#include <string>

#include "core/check.h"

namespace kiln::train {

StepTokenAverage::StepTokenAverage(Device device)
    : rows_(Tensor::from_vector(std::vector<float>{1.0f, 1.0f}, {2}).to(device)) {}

void StepTokenAverage::begin_step(const std::vector<data::Batch>& batches, Communicator* comm) {
  std::int64_t counted = 0;
  for (const data::Batch& b : batches) {
    KILN_CHECK(b.counted_targets >= 0,
               "train.loss_average STEP_TOKENS needs integer targets (a batch of floating ones)");
    counted += b.counted_targets;
  }
  const int ranks = comm != nullptr ? comm->size() : 1;
  if (ranks > 1) counted = comm->all_reduce_host(counted, HostReduceOp::Sum);
  // A step with no counted target has no gradient: any positive share keeps it finite.
  const double shares = static_cast<double>(ranks) * static_cast<double>(batches.size());
  const double total = static_cast<double>(std::max<std::int64_t>(counted, 1));
  rows_.copy_from(Tensor::from_vector(
      std::vector<float>{static_cast<float>(total / shares), static_cast<float>(shares / total)},
      {2}));
}

std::unique_ptr<StepTokenAverage> make_step_token_average(const config::Experiment& experiment,
                                                          const data::Dataset& dataset,
                                                          Device device) {
  const config::TrainConfig::LossAverage how = experiment.train().loss_average();
  const bool tokens = how == config::TrainConfig::STEP_TOKENS ||
                      (how == config::TrainConfig::LOSS_AVERAGE_AUTO && dataset.masks_targets());
  if (!tokens) return nullptr;
  if (dataset.spec().target_dtype != DType::I64) {
    throw config::ConfigError(
        "train.loss_average = STEP_TOKENS averages over counted integer targets; " +
        dataset.describe() + " has floating targets: set train.loss_average: MICRO_BATCHES");
  }
  return std::make_unique<StepTokenAverage>(device);
}

}  // namespace kiln::train
