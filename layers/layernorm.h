#pragma once
// LayerNorm over the last dimension: y = (x - mean) * rstd * weight + bias.
//   x (..., C) -> y (..., C), same dtype. weight, bias (C), fp32 (f64 for f64 inputs) even when
//   activations are half; mean and rstd (rows) are kept in fp32 (f64) for backward.
// RMSNorm (Llama, Qwen2): y = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps), no bias: the
// same kernels with the mean held at 0 (RMSNorm below).
// Gradient contract: weight.grad and bias.grad are accumulated (+=); dx is written (=).
// CUDA: one warp per row forward (rows held in registers as 16-byte packs for half rows of up to
// 2048 columns); backward is one kernel writing dx and per-chunk partial sums of
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
  Parameter& bias() { return *bias_; }  // LayerNorm only: RMSNorm has none
  bool centered() const { return centered_; }

  // Pre-norm residual streams (GPT-2, ViT): h = x + delta; y = LN(h) in one pass instead of an
  // addition and a LayerNorm (llm.c's fused_residual_forward). add_to_next_input(delta) makes the
  // next forward(x) normalise x + delta (rounded to x's dtype, as the addition would store it);
  // residual_sum() then hands out h. add_to_next_dx(g) makes the next backward return
  // dx = LN'(dy) + g, the residual's gradient added in the same pass. Each applies to one call.
  void add_to_next_input(const Tensor& delta) { pending_delta_ = delta; }
  const Tensor& residual_sum() const { return residual_sum_; }
  void add_to_next_dx(const Tensor& residual_grad) { pending_residual_grad_ = residual_grad; }

 protected:
  // centered: LayerNorm (mean subtracted, bias "bias"); else RMSNorm (no mean, no bias).
  LayerNorm(std::int64_t normalized_size, double eps, bool centered);
  Tensor forward_impl(Context& ctx, const Tensor& x) override;
  Tensor backward_impl(Context& ctx, const Tensor& dy) override;
  void release_saved() override {
    saved_x_ = Tensor();
    saved_mean_ = Tensor();
    saved_rstd_ = Tensor();
  }

 private:
  // weight.grad += dw, bias.grad += db, unless the parameters are frozen.
  void accumulate_parameter_grads(const Tensor& dw, const Tensor& db);
  std::int64_t size_;
  double eps_;
  bool centered_ = true;
  Parameter* weight_;
  Parameter* bias_ = nullptr;
  Tensor saved_x_;     // (rows, C)
  Tensor saved_mean_;  // (rows) fp32 (f64)
  Tensor saved_rstd_;  // (rows)
  Tensor pending_delta_, residual_sum_, pending_residual_grad_;
};

// RMSNorm over the last dimension (transformers' LlamaRMSNorm / Qwen2RMSNorm): one parameter,
// "weight" (init 1); the residual fusions of LayerNorm above.
class RMSNorm : public LayerNorm {
 public:
  explicit RMSNorm(std::int64_t normalized_size, double eps = 1e-6)
      : LayerNorm(normalized_size, eps, /*centered=*/false) {}
  std::string type() const override { return "RMSNorm"; }
};

}  // namespace kiln
