#pragma once
// LayerNorm over the last dimension: y = (x - mean) * rstd * weight + bias.
//   x (..., C) -> y (..., C), same dtype. weight, bias (C), fp32 (f64 for f64 inputs) even when
//   activations are half; mean and rstd (rows) are kept in fp32 (f64) for backward.
// Gradient contract: weight.grad and bias.grad are accumulated (+=); dx is written (=).
// CUDA: one warp per row forward; backward is one kernel writing dx and per-chunk partial sums of
// dweight/dbias, then a second kernel that adds the partials in a fixed order (no atomics), so
// the gradients are the same bit for bit on every run.

#include <cstdint>

#include "layers/layer.h"

namespace kiln {

class LayerNorm : public Layer {
 public:
  explicit LayerNorm(std::int64_t normalized_size, double eps = 1e-5);
  std::string type() const override { return "LayerNorm"; }
  Shape output_shape(const Shape& input) const override { return input; }
  void reset_parameters(std::uint64_t seed) override;  // weight 1, bias 0

  std::int64_t normalized_size() const { return size_; }
  double eps() const { return eps_; }
  Parameter& weight() { return *weight_; }
  Parameter& bias() { return *bias_; }

 protected:
  Tensor forward_impl(Context& ctx, const Tensor& x) override;
  Tensor backward_impl(Context& ctx, const Tensor& dy) override;
  void release_saved() override {
    saved_x_ = Tensor();
    saved_mean_ = Tensor();
    saved_rstd_ = Tensor();
  }

 private:
  std::int64_t size_;
  double eps_;
  Parameter* weight_;
  Parameter* bias_;
  Tensor saved_x_;     // (rows, C)
  Tensor saved_mean_;  // (rows) fp32 (f64)
  Tensor saved_rstd_;  // (rows)
};

}  // namespace kiln
