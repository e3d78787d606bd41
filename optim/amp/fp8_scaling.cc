#include "optim/amp/fp8_scaling.h"

#include "core/check.h"

namespace kiln::optim {

Fp8TensorScaling::Fp8TensorScaling(Fp8Format format, Fp8ScalingOptions options)
    : format_(format), options_(options) {
  KILN_CHECK(options_.history >= 1,
             "FP8 scaling: an amax history of " + std::to_string(options_.history) + " casts");
  state_.assign(static_cast<std::size_t>(kFp8StateHeader + options_.history), 0.0f);
  state_[0] = 1.0f;
}

float Fp8TensorScaling::current_scale(float amax) const {
  return fp8_scale_for(amax, format_, options_.margin, state_[0]);
}

void Fp8TensorScaling::load_state(const std::vector<float>& state, const std::string& where) {
  if (state.size() != state_.size()) {
    throw InputError(where + ": FP8 scaling state of " + std::to_string(state.size()) +
                     " values, expected " + std::to_string(state_.size()) +
                     " (an amax history of " + std::to_string(options_.history) + ")");
  }
  state_ = state;
  const int next = static_cast<int>(state_[2]);
  state_[2] = static_cast<float>(((next % options_.history) + options_.history) % options_.history);
}

}  // namespace kiln::optim
