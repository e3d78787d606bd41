#pragma once
// Pooling over (N, C, H, W) activations in NCHW or NHWC memory (ctx.run.channels_last), square
// windows, floor mode, as PyTorch's MaxPool2d / AvgPool2d (count_include_pad) / adaptive (1, 1).
//   MaxPool2d, AvgPool2d: x (N, C, H, W) -> y (N, C, OH, OW), OH = (H + 2p - k) / s + 1
//   GlobalAvgPool:        x (N, C, H, W) -> y (N, C)
// No parameters; dx is written (=). Backward gathers (each input sums the windows covering it),
// so it needs no atomics and is deterministic.

#include <cstdint>

#include "layers/layer.h"

namespace kiln {

struct PoolGeometry {
  std::int64_t batch = 0, channels = 0, height = 0, width = 0, out_height = 0, out_width = 0;
  std::int64_t kernel = 1, stride = 1, padding = 0;
  bool channels_last = false;
};

// What MaxPool2d and AvgPool2d share: a square window with its stride and padding, and the
// geometry and dtype of the last forward.
class WindowPool2d : public Layer {
 public:
  Shape output_shape(const Shape& input) const override;
  // The window (stride already resolved from 0), for exporters.
  std::int64_t kernel() const { return kernel_; }
  std::int64_t stride() const { return stride_; }
  std::int64_t padding() const { return padding_; }

 protected:
  // stride 0 means stride = kernel; `type` names the layer in the error for a bad window.
  WindowPool2d(std::int64_t kernel, std::int64_t stride, std::int64_t padding, const char* type);
  // The geometry of an input of this shape (an InputError when the window does not fit).
  PoolGeometry geometry(const Shape& input, bool channels_last) const;
  // Forward's start: x's geometry under ctx, x's physical memory and y's (empty).
  PoolGeometry begin_forward(const Context& ctx, const Tensor& x, Tensor& x_physical,
                             Tensor& y_physical) const;
  // Forward's end: remembers g and x's dtype for backward; returns y's logical view.
  Tensor end_forward(const PoolGeometry& g, const Tensor& x, const Tensor& y_physical);
  // Backward's start: dy's physical memory in forward's dtype, and dx's (empty).
  void begin_backward(const Tensor& dy, Tensor& dy_physical, Tensor& dx_physical) const;

  std::int64_t kernel_, stride_, padding_;
  PoolGeometry saved_;
  DType saved_dtype_ = DType::F32;
};

class MaxPool2d : public WindowPool2d {
 public:
  explicit MaxPool2d(std::int64_t kernel, std::int64_t stride = 0, std::int64_t padding = 0)
      : WindowPool2d(kernel, stride, padding, "MaxPool2d") {}
  std::string type() const override { return "MaxPool2d"; }

 protected:
  Tensor forward_impl(Context& ctx, const Tensor& x) override;
  Tensor backward_impl(Context& ctx, const Tensor& dy) override;
  void release_saved() override { argmax_ = Tensor(); }

 private:
  Tensor argmax_;  // I32, y's physical shape: h * W + w of each window's maximum
};

class AvgPool2d : public WindowPool2d {
 public:
  explicit AvgPool2d(std::int64_t kernel, std::int64_t stride = 0, std::int64_t padding = 0)
      : WindowPool2d(kernel, stride, padding, "AvgPool2d") {}
  std::string type() const override { return "AvgPool2d"; }

 protected:
  Tensor forward_impl(Context& ctx, const Tensor& x) override;
  Tensor backward_impl(Context& ctx, const Tensor& dy) override;
};

// Mean over H and W: (N, C, H, W) -> (N, C), PyTorch's AdaptiveAvgPool2d(1) + flatten(1).
class GlobalAvgPool : public Layer {
 public:
  std::string type() const override { return "GlobalAvgPool"; }
  Shape output_shape(const Shape& input) const override;

 protected:
  Tensor forward_impl(Context& ctx, const Tensor& x) override;
  Tensor backward_impl(Context& ctx, const Tensor& dy) override;

 private:
  PoolGeometry saved_;
  DType saved_dtype_ = DType::F32;
};

}  // namespace kiln
