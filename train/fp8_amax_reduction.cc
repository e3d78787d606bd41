#include "train/fp8_amax_reduction.h"

#include <utility>

#include "core/check.h"

namespace kiln::train {

Fp8AmaxReduction::Fp8AmaxReduction(std::vector<Buffer*> states, const Fp8Settings& settings,
                                   Communicator& comm)
    : states_(std::move(states)), settings_(settings), comm_(comm) {
  KILN_CHECK(!states_.empty(), "Fp8AmaxReduction without FP8 scaling states");
  const Shape shape = Fp8Projection::state_shape(settings_);
  for (const Buffer* b : states_) {
    KILN_CHECK(b->value.shape() == shape && b->value.dtype() == DType::F32 &&
                   b->value.is_contiguous() && b->value.device() == comm_.device(),
               "Fp8AmaxReduction: state " + b->name + " is " + b->value.str());
  }
  packed_ = Tensor::empty({static_cast<std::int64_t>(states_.size()) * shape[0], shape[1]},
                          DType::F32, comm_.device());
  for (std::size_t i = 0; i < states_.size(); ++i) {
    const std::int64_t at = static_cast<std::int64_t>(i) * shape[0];
    Tensor rows = packed_.slice(0, at, at + shape[0]);
    rows.copy_from(states_[i]->value);
    states_[i]->value = rows;
  }
}

void Fp8AmaxReduction::reduce() {
  // A state rebound elsewhere (moved to another device) would no longer be reduced.
  for (std::size_t i = 0; i < states_.size(); ++i) {
    KILN_CHECK(states_[i]->value.data<float>() ==
                   packed_.data<float>() + i * static_cast<std::size_t>(states_[i]->value.numel()),
               "Fp8AmaxReduction: state " + states_[i]->name + " no longer in the packed tensor");
  }
  comm_.all_reduce(packed_, ReduceOp::Max);
  fp8_scales_from_history(packed_, settings_);
}

std::unique_ptr<Fp8AmaxReduction> make_fp8_amax_reduction(const std::vector<Buffer*>& buffers,
                                                          const Fp8Settings& settings,
                                                          Communicator* comm) {
  if (comm == nullptr || comm->size() == 1 || !settings.enabled ||
      settings.scaling.recipe != Fp8Recipe::Delayed) {
    return nullptr;
  }
  std::vector<Buffer*> states = fp8_scaling_buffers(buffers);
  if (states.empty()) return nullptr;
  return std::make_unique<Fp8AmaxReduction>(std::move(states), settings, *comm);
}

}  // namespace kiln::train
