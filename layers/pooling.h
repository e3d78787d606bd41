#pragma once
// Pooling over (N, C, H, W) activations in NCHW or NHWC memory (ctx.channels_last), square
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

class MaxPool2d : public Layer {
 public:
  // stride 0 means stride = kernel.
  explicit MaxPool2d(std::int64_t kernel, std::int64_t stride = 0, std::int64_t padding = 0);
  std::string type() const override { return "MaxPool2d"; }
  Shape output_shape(const Shape& input) const override;
  // The window (stride already resolved from 0), for exporters.
  std::int64_t kernel() const { return kernel_; }
  std::int64_t stride() const { return stride_; }
  std::int64_t padding() const { return padding_; }

 protected:
  Tensor forward_impl(Context& ctx, const Tensor& x) override;
  Tensor backward_impl(Context& ctx, const Tensor& dy) override;
  void release_saved() override { argmax_ = Tensor(); }

 private:
  std::int64_t kernel_, stride_, padding_;
  PoolGeometry saved_;
  DType saved_dtype_ = DType::F32;
  Tensor argmax_;  // I32, y's physical shape: h * W + w of each window's maximum
};

class AvgPool2d : public Layer {
 public:
  explicit AvgPool2d(std::int64_t kernel, std::int64_t stride = 0, std::int64_t padding = 0);
  std::string type() const override { return "AvgPool2d"; }
  Shape output_shape(const Shape& input) const override;
  // The window (stride already resolved from 0), for exporters.
  std::int64_t kernel() const { return kernel_; }
  std::int64_t stride() const { return stride_; }
  std::int64_t padding() const { return padding_; }

 protected:
  Tensor forward_impl(Context& ctx, const Tensor& x) override;
  Tensor backward_impl(Context& ctx, const Tensor& dy) override;

 private:
  std::int64_t kernel_, stride_, padding_;
  PoolGeometry saved_;
  DType saved_dtype_ = DType::F32;
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

// CUDA launchers (layers/cuda/pooling.cu) on physical tensors; defined when KILN_WITH_CUDA.
namespace pooling_cuda {
void max_forward(const PoolGeometry& g, const Tensor& x, Tensor& y, Tensor& argmax);
void max_backward(const PoolGeometry& g, const Tensor& dy, const Tensor& argmax, Tensor& dx);
void avg_forward(const PoolGeometry& g, const Tensor& x, Tensor& y);
void avg_backward(const PoolGeometry& g, const Tensor& dy, Tensor& dx);
void global_avg_forward(const PoolGeometry& g, const Tensor& x, Tensor& y);     // y (N, C)
void global_avg_backward(const PoolGeometry& g, const Tensor& dy, Tensor& dx);  // dy (N, C)
}  // namespace pooling_cuda

}  // namespace kiln
