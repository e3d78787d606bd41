#pragma once
// Conv2d: y = conv(x, weight) + bias, PyTorch's layout and names.
//   x      (N, C, H, W)        logical shape; memory NCHW, or NHWC when ctx.run.channels_last
//   weight (K, C / groups, R, S)  "weight"
//   bias   (K)                  "bias" (optional, no weight decay)
//   y      (N, K, OH, OW)       same memory order as the layer runs in
// Gradient contract: weight and bias gradients are ACCUMULATED (+=), dx is written (=).
// CPU: im2col + ops::gemm in f32/f64 (half inputs compute in f32). CUDA: cuDNN's convolution API
// with fp32 accumulation; f32 runs without TF32, f16/bf16 on tensor cores; the algorithm is
// chosen once per problem shape (heuristics or benchmark, optionally deterministic) and cached.
//
// Activation memory order (shared by conv2d, batchnorm, pooling and relu): tensors keep the
// logical shape (N, C, H, W) in both orders; NHWC activations are the strided view
// permute(0, 3, 1, 2) of a contiguous (N, H, W, C) tensor, so Flatten and output_shape do not
// depend on the order.

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "layers/layer.h"
#include "layers/weight_cast_cache.h"

namespace kiln {

// The dense memory of a 4-D activation: contiguous (N, C, H, W) or, when channels_last,
// contiguous (N, H, W, C). Copies only when x is not already in that order.
Tensor to_physical(const Tensor& x, bool channels_last);
// The logical (N, C, H, W) view of a physical tensor made by to_physical.
Tensor from_physical(const Tensor& physical, bool channels_last);
// Whether x is laid out as NHWC (and not also NCHW-contiguous).
bool is_channels_last(const Tensor& x);

// One convolution problem, enough to choose and cache a cuDNN algorithm.
struct Conv2dGeometry {
  std::int64_t batch = 0, in_channels = 0, height = 0, width = 0, out_channels = 0;
  std::int64_t kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  std::int64_t dilation_h = 1, dilation_w = 1, groups = 1;
  DType dtype = DType::F32;  // x, weight and y (fp32 accumulation always)
  bool channels_last = false;

  std::int64_t out_height() const {
    return (height + 2 * pad_h - dilation_h * (kernel_h - 1) - 1) / stride_h + 1;
  }
  std::int64_t out_width() const {
    return (width + 2 * pad_w - dilation_w * (kernel_w - 1) - 1) / stride_w + 1;
  }
  std::string str() const;
  bool operator==(const Conv2dGeometry& o) const;
};

enum class ConvAlgorithmSearch {
  Heuristic,  // cudnnGet*Algorithm_v7: no time spent searching
  Benchmark,  // cudnnFind*AlgorithmEx: time every algorithm once per shape (cudnn.benchmark)
};

struct ConvAlgorithmOptions {
  ConvAlgorithmSearch search = ConvAlgorithmSearch::Heuristic;
  bool deterministic = false;                // only algorithms giving bit-identical results
  std::size_t workspace_limit = 1ull << 30;  // bytes, per direction
};

// The process-wide options new Conv2d layers start from (like torch.backends.cudnn.benchmark).
ConvAlgorithmOptions default_conv_algorithm_options();
void set_default_conv_algorithm_options(const ConvAlgorithmOptions& options);

// The algorithms chosen for one geometry (cuDNN enum values) and their workspace sizes. A
// direction that runs a graph-API plan has no legacy algorithm (-1).
struct ConvAlgorithmChoice {
  int forward = -1, backward_data = -1, backward_filter = -1;
  std::size_t forward_workspace = 0, backward_data_workspace = 0, backward_filter_workspace = 0;
  bool forward_deterministic = false, backward_data_deterministic = false,
       backward_filter_deterministic = false;
  int forward_math = 0, backward_data_math = 0, backward_filter_math = 0;  // cudnnMathType_t
  // Cached graph-API execution plans that run instead of the legacy calls above (-1: none;
  // layers/cuda/conv2d_graph.h). Weight gradients have one plan writing, one accumulating.
  int graph_forward = -1, graph_backward_data = -1, graph_backward_filter = -1,
      graph_backward_filter_accumulate = -1;
};

class Conv2d : public Layer {
 public:
  Conv2d(std::int64_t in_channels, std::int64_t out_channels,
         std::pair<std::int64_t, std::int64_t> kernel,
         std::pair<std::int64_t, std::int64_t> stride = {1, 1},
         std::pair<std::int64_t, std::int64_t> padding = {0, 0},
         std::pair<std::int64_t, std::int64_t> dilation = {1, 1}, std::int64_t groups = 1,
         bool bias = true);

  std::string type() const override { return "Conv2d"; }
  Shape output_shape(const Shape& input) const override;
  double forward_flops(const Shape& input) const override;
  // kaiming_uniform(a=sqrt(5)) for the weight, U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for the bias.
  void reset_parameters(std::uint64_t seed) override;

  Parameter& weight() { return *weight_; }
  Parameter* bias() { return bias_; }
  void set_algorithm_options(const ConvAlgorithmOptions& options) { algorithm_options_ = options; }
  const ConvAlgorithmOptions& algorithm_options() const { return algorithm_options_; }
  // The cuDNN algorithms of the last CUDA forward (all -1 before one, and on CPU).
  const ConvAlgorithmChoice& last_algorithms() const { return last_algorithms_; }
  Conv2dGeometry geometry(const Shape& input, DType dtype, bool channels_last) const;
  // The weight in the compute dtype and filter order (KRSC when channels_last), cast once per
  // ctx.weights_version.
  Tensor compute_weight(const Context& ctx, DType dtype, bool channels_last);
  // weight.grad += dw, dw in the filter order and compute dtype of a CUDA weight gradient.
  void accumulate_weight_gradient(const Tensor& dw, bool channels_last);

 protected:
  Tensor forward_impl(Context& ctx, const Tensor& x) override;
  Tensor backward_impl(Context& ctx, const Tensor& dy) override;
  void release_saved() override {
    saved_x_ = Tensor();
    saved_col_ = Tensor();
  }

 private:
  Tensor forward_cpu(const Tensor& x_nchw);
  Tensor backward_cpu(const Tensor& dy_nchw);
  Tensor forward_cuda(Context& ctx, const Tensor& x);
  Tensor backward_cuda(Context& ctx, const Tensor& dy);
  std::int64_t in_channels_, out_channels_, kernel_h_, kernel_w_, stride_h_, stride_w_, pad_h_,
      pad_w_, dilation_h_, dilation_w_, groups_;
  Parameter* weight_;
  Parameter* bias_ = nullptr;
  ConvAlgorithmOptions algorithm_options_;
  ConvAlgorithmChoice last_algorithms_;

  // Saved by forward for backward.
  Tensor saved_x_;    // CPU: (N, C, H, W) contiguous; CUDA: physical, compute dtype
  Tensor saved_col_;  // CPU, training: forward's im2col matrix, reused once by backward
  bool saved_channels_last_ = false;
  DType saved_input_dtype_ = DType::F32;
  Conv2dGeometry saved_geometry_;

  WeightCastCache weight_cache_;
};

}  // namespace kiln
