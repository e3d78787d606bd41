#include "optim/amp/fp8_scaling.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace kiln::optim {

Fp8TensorScaling::Fp8TensorScaling(Fp8Format format, Fp8ScalingOptions options)
    : format_(format), options_(options) {
  KILN_CHECK(options_.history >= 1,
             "FP8 scaling: an amax history of " + std::to_string(options_.history) + " casts");
  history_.assign(static_cast<std::size_t>(options_.history), 0.0f);
}

float Fp8TensorScaling::current_scale(float amax) const {
  return fp8_scale_for(amax, format_, options_.margin, scale_);
}

void Fp8TensorScaling::record(float amax) {
  if (!std::isfinite(amax)) {
    ++overflows_;
    return;
  }
  history_[next_] = amax;
  next_ = (next_ + 1) % history_.size();
  if (options_.recipe == Fp8Recipe::Delayed) {
    const float largest = *std::max_element(history_.begin(), history_.end());
    scale_ = fp8_scale_for(largest, format_, options_.margin, scale_);
  } else {
    scale_ = fp8_scale_for(amax, format_, options_.margin, scale_);
  }
}

std::vector<float> Fp8TensorScaling::state() const {
  std::vector<float> out = {scale_, static_cast<float>(overflows_), static_cast<float>(next_)};
  out.insert(out.end(), history_.begin(), history_.end());
  return out;
}

void Fp8TensorScaling::load_state(const std::vector<float>& state, const std::string& where) {
  if (state.size() != 3 + history_.size()) {
    throw InputError(where + ": FP8 scaling state of " + std::to_string(state.size()) +
                     " values, expected " + std::to_string(3 + history_.size()) +
                     " (an amax history of " + std::to_string(history_.size()) + ")");
  }
  scale_ = state[0];
  overflows_ = static_cast<std::int64_t>(state[1]);
  next_ = static_cast<std::size_t>(state[2]) % history_.size();
  std::copy(state.begin() + 3, state.end(), history_.begin());
}

}  // namespace kiln::optim
