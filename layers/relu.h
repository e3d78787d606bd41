#pragma once
// ReLU: y = max(x, 0), elementwise on any shape; keeps the input's memory order (NCHW or NHWC).
//   x (any), y (same shape). Backward uses the saved output: dx = dy * (y > 0), written (=).
// In place (inplace=true) overwrites x; use it only where nothing else needs x afterwards.
// set_residual(r) makes the next forward relu(x + r) in one pass (a residual block's sum; the sum
// rounds to x's dtype first, so the result is bitwise that of an addition then ReLU).

#include "layers/layer.h"

namespace kiln {

class ReLU : public Layer {
 public:
  explicit ReLU(bool inplace = false) : inplace_(inplace) {}
  std::string type() const override { return "ReLU"; }
  Shape output_shape(const Shape& input) const override { return input; }
  void set_residual(const Tensor& r) { residual_ = r; }

 protected:
  Tensor forward_impl(Context& ctx, const Tensor& x) override;
  Tensor backward_impl(Context& ctx, const Tensor& dy) override;
  void release_saved() override { saved_y_ = Tensor(); }

 private:
  bool inplace_;
  Tensor residual_;  // added to the next forward's input, then released
  bool saved_channels_last_ = false;
  Tensor saved_y_;  // dense (contiguous, or NHWC memory of an (N, C, H, W) view)
};

// The CPU loops on dense tensors of one dtype (also BatchNorm2d's fused ReLU on the CPU).
namespace relu_cpu {
void forward(const Tensor& x, Tensor& y);                      // y may be x
void backward(const Tensor& y, const Tensor& dy, Tensor& dx);  // dx may be dy
}  // namespace relu_cpu

// The dense memory of x in its own order: contiguous, or the (N, H, W, C) tensor behind an NHWC
// view. `channels_last` tells which, for from_physical (layers/conv2d.h).
Tensor dense_memory(const Tensor& x, bool* channels_last);

}  // namespace kiln
