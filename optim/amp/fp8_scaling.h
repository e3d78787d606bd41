#pragma once
// Per-tensor FP8 scaling, Transformer Engine's two recipes (issue 37): the scale each FP8 cast of
// one tensor (a layer's weight, its input, its output gradient) multiplies by, so that the
// tensor's largest magnitude lands near the format's largest value (core/fp8.h).
//   Current: from the amax of the tensor being cast (measured before the cast)
//   Delayed: from the largest amax of the last `history` casts, the newest recorded after its
//            cast (TE's amax history; no pass before the cast)
// An amax of infinity or NaN (an overflow upstream, which the loss scaler skips) keeps the scale
// and is counted. The rule is core/fp8.h's fp8_scaling_record, which the CUDA casts of FP8
// projections run on the device; this class holds one tensor's state on the host.

#include <cstdint>
#include <string>
#include <vector>

#include "core/fp8.h"

namespace kiln::optim {

using kiln::Fp8Recipe;
using kiln::Fp8ScalingOptions;

class Fp8TensorScaling {
 public:
  Fp8TensorScaling(Fp8Format format, Fp8ScalingOptions options);

  Fp8Format format() const { return format_; }
  // The scale for the next cast: Delayed, from the history; Current, from `amax` (this tensor's,
  // measured now).
  float scale() const { return state_[0]; }
  float current_scale(float amax) const;
  // The amax a cast measured: Delayed, the next scale from the history with it.
  void record(float amax) { fp8_scaling_record(state_.data(), options_, format_, amax); }
  std::int64_t overflows() const { return static_cast<std::int64_t>(state_[1]); }

  // [scale, overflows, next slot, history...] (core/fp8.h's layout): what resume needs to
  // continue bit for bit.
  const std::vector<float>& state() const { return state_; }
  // InputError naming `where` for a state of another length.
  void load_state(const std::vector<float>& state, const std::string& where);

 private:
  Fp8Format format_;
  Fp8ScalingOptions options_;
  std::vector<float> state_;
};

}  // namespace kiln::optim
