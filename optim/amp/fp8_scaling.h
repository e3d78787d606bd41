#pragma once
// Per-tensor FP8 scaling, Transformer Engine's two recipes (issue 37): the scale each FP8 cast of
// one tensor (a layer's weight, its input, its output gradient) multiplies by, so that the
// tensor's largest magnitude lands near the format's largest value (core/fp8.h).
//   Current: from the amax of the tensor being cast (measured before the cast)
//   Delayed: from the largest amax of the last `history` casts, the newest recorded after its
//            cast (TE's amax history; no pass before the cast)
// An amax of infinity or NaN (an overflow upstream, which the loss scaler skips) keeps the scale
// and is counted. The history and scale are state a checkpoint keeps (state()/load_state()).

#include <cstdint>
#include <string>
#include <vector>

#include "core/fp8.h"

namespace kiln::optim {

enum class Fp8Recipe { Current, Delayed };

struct Fp8ScalingOptions {
  Fp8Recipe recipe = Fp8Recipe::Delayed;
  int history = 16;     // Delayed: casts remembered
  float margin = 0.0f;  // the scale is divided by 2^margin
};

class Fp8TensorScaling {
 public:
  Fp8TensorScaling(Fp8Format format, Fp8ScalingOptions options);

  Fp8Format format() const { return format_; }
  // The scale for the next cast: Delayed, from the history; Current, from `amax` (this tensor's,
  // measured now).
  float scale() const { return scale_; }
  float current_scale(float amax) const;
  // The amax a cast measured: Delayed, the next scale from the history with it.
  void record(float amax);
  std::int64_t overflows() const { return overflows_; }

  // [scale, overflows, history...]: what resume needs to continue bit for bit.
  std::vector<float> state() const;
  // InputError naming `where` for a state of another length.
  void load_state(const std::vector<float>& state, const std::string& where);

 private:
  Fp8Format format_;
  Fp8ScalingOptions options_;
  float scale_ = 1.0f;
  std::int64_t overflows_ = 0;
  std::vector<float> history_;  // a ring, the newest at next_ - 1
  std::size_t next_ = 0;
};

}  // namespace kiln::optim
