#pragma once
// BatchNorm2d, PyTorch's: per channel c of x (N, C, H, W) (NCHW or NHWC memory,
// ctx.run.channels_last)
//   training: mean, var (biased) over N, H, W; y = (x - mean) / sqrt(var + eps) * weight + bias;
//             running_mean += momentum * (mean - running_mean),
//             running_var  += momentum * (var * n / (n - 1) - running_var), num_batches_tracked +=
//             1
//   eval:     the running statistics instead of the batch's.
// Parameters "weight" (C, init 1), "bias" (C, init 0): fp32 even in O2 (fp32_in_half), no weight
// decay. Buffers "running_mean", "running_var", "num_batches_tracked" (a () scalar, kept for
// PyTorch's names). Statistics are computed in fp32 (f64 for f64) whatever the activation dtype.
// Gradient contract: weight.grad and bias.grad are ACCUMULATED (+=); dx is written (=).
// The training/eval choice is the layer's training() flag (set_training), as in PyTorch.
// set_fused_relu(true) makes the output relu(y), as BatchNorm2d then ReLU, and backward goes
// through both: on CUDA the ReLU pass and its backward pass over the activations disappear (the
// backward recomputes the mask from the saved input); results are bitwise those of the pair.

#include <cstdint>

#include "layers/layer.h"

namespace kiln {

class BatchNorm2d : public Layer {
 public:
  explicit BatchNorm2d(std::int64_t channels, double eps = 1e-5, double momentum = 0.1);
  std::string type() const override { return fused_relu_ ? "BatchNorm2d+ReLU" : "BatchNorm2d"; }
  Shape output_shape(const Shape& input) const override;
  double forward_flops(const Shape& input) const override;
  // weight 1, bias 0, running statistics reset (PyTorch's reset_parameters + reset_running_stats).
  void reset_parameters(std::uint64_t seed) override;

  Parameter& weight() { return *weight_; }
  Parameter& bias() { return *bias_; }
  Buffer& running_mean() { return *running_mean_; }
  Buffer& running_var() { return *running_var_; }
  Buffer& num_batches_tracked() { return *num_batches_tracked_; }
  void set_fused_relu(bool on) { fused_relu_ = on; }
  bool fused_relu() const { return fused_relu_; }
  double eps() const { return eps_; }
  double momentum() const { return momentum_; }
  // num_batches_tracked += 1, on the buffer's device without a host round trip.
  void count_batch();

 protected:
  Tensor forward_impl(Context& ctx, const Tensor& x) override;
  Tensor backward_impl(Context& ctx, const Tensor& dy) override;
  void release_saved() override {
    saved_x_ = Tensor();
    saved_mean_ = Tensor();
    saved_invstd_ = Tensor();
    saved_y_ = Tensor();
  }

 private:
  std::int64_t channels_;
  double eps_, momentum_;
  bool fused_relu_ = false;
  Parameter* weight_;
  Parameter* bias_;
  Buffer* running_mean_;
  Buffer* running_var_;
  Buffer* num_batches_tracked_;

  // Saved by forward for backward.
  Tensor saved_x_;       // physical (NCHW or NHWC contiguous), forward's dtype (f32 for CPU halves)
  Tensor saved_mean_;    // (C) fp32 (f64 for f64)
  Tensor saved_invstd_;  // (C) 1 / sqrt(var + eps)
  bool saved_channels_last_ = false;
  bool saved_batch_stats_ = true;
  DType saved_input_dtype_ = DType::F32;
  Tensor saved_y_;  // CPU with a fused ReLU: the output (physical, input dtype), for the mask
  Tensor one_;      // 1 on the buffers' device, to count batches without a host round trip
};

}  // namespace kiln
