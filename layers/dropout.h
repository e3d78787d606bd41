#pragma once
// Dropout(p): in training (ctx.training and training()), y = x * keep / (1 - p) with
// keep ~ Bernoulli(1 - p); in eval (either flag false), y = x.
// Any shape; y has x's shape and ctx.run.precision.activation's dtype. No parameters; dx is written
// (=).
//
// The mask is counter-based, never stored: element i keeps when the Philox uniform for counter i
// under key dropout_key(ctx.run.seed, layer_id()) and stream the micro-step at ctx.step.step is
// >= p. Replaying a step (same seed, step, layer construction order) gives the same mask on CPU
// and GPU; backward recomputes it from the key and the step's address saved at forward. The step
// is read from that address when the kernel runs (a captured CUDA graph replays with the current
// step).

#include <cstdint>
#include <string>

#include "core/random.h"
#include "layers/layer.h"

namespace kiln {

KILN_HOST_DEVICE_INLINE std::uint64_t dropout_key(std::uint64_t seed, std::uint64_t layer_id) {
  // splitmix64 of the pair, so neighbouring layers and seeds get unrelated streams
  std::uint64_t z = seed + 0x9E3779B97F4A7C15ull * (layer_id + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Whether element i is kept, for drop probability p.
KILN_HOST_DEVICE_INLINE bool dropout_keep(std::uint64_t key, std::uint64_t step, std::uint64_t i,
                                          double p) {
  Philox4x32 r = philox(i / 4, key, step);
  return philox_uniform(r.v[i % 4]) >= p;
}

class Dropout : public Layer {
 public:
  explicit Dropout(double p);
  std::string type() const override { return "Dropout"; }
  Shape output_shape(const Shape& input) const override { return input; }
  double p() const { return p_; }
  std::uint64_t mask_key(const Context& ctx) const { return dropout_key(ctx.run.seed, layer_id()); }

 protected:
  Tensor forward_impl(Context& ctx, const Tensor& x) override;
  Tensor backward_impl(Context& ctx, const Tensor& dy) override;

 private:
  double p_;
  bool applied_ = false;  // the last forward dropped (training and p > 0)
  std::uint64_t key_ = 0;
  const std::uint64_t* step_ = nullptr;  // ctx.step.step at forward
  Shape input_shape_;
};

}  // namespace kiln
