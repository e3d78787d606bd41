#pragma once
// A residual block's body, conv_0 - bn_0 - ReLU - conv_1 - bn_1 - ReLU - ... - conv_n-1 - bn_n-1
// (no ReLU after the last batch norm), run in training on CUDA with batch norm fused into cuDNN's
// convolutions (layers/cuda/conv_bn_fusion_cuda.h), as NVIDIA's MLPerf ResNet-50 trains:
//   forward   each convolution applies the previous batch norm and ReLU to its input in its
//             prologue and sums its output for the next batch norm in its epilogue, so the
//             normalised activations are never written; the last batch norm is applied by Kiln's
//             kernel (the block adds the shortcut and applies the ReLU after it).
//   backward  each weight gradient applies the same prologue to the saved convolution output;
//             each data gradient finishes with the ReLU's backward and the batch norm's weight
//             sums, and one elementwise pass gives the batch norm's input gradient.
// The layers keep their parameters, buffers and names: checkpoints, eval mode (the layers run one
// by one) and the CPU are unchanged. A pattern cuDNN has no engine for falls back to Kiln's
// kernels for that convolution (told once on stderr); a chain whose forward cannot be fused is
// run layer by layer by its owner (`applicable` is false).

#include <vector>

#include "layers/batchnorm.h"
#include "layers/conv2d.h"

namespace kiln {

class ConvBatchNormChain {
 public:
  ConvBatchNormChain(std::vector<Conv2d*> convs, std::vector<BatchNorm2d*> bns);

  // Whether forward can run fused for x in ctx: training on CUDA, NHWC, f16 or bf16 activations
  // and convolutions, no determinism asked (the fused statistics' reduction order varies; said
  // once on stderr), and cuDNN's fused forward for every convolution. The first convolution's
  // input must be non-negative (a ReLU's output, as every residual block's input is): its
  // prologue is relu(x * 1 + 0).
  bool applicable(const Context& ctx, const Tensor& x);
  // bn_n-1(conv_n-1(... relu(bn_0(conv_0(x))) ...)) with batch statistics; updates the running
  // statistics unless ctx.recomputing.
  Tensor forward(Context& ctx, const Tensor& x);
  // dy: the gradient of forward's output. Accumulates every parameter's gradient, calls
  // ctx.observers and ctx.on_grad_ready for each layer as its own backward would, and returns dx
  // (undefined when the first convolution needs no input gradient).
  Tensor backward(Context& ctx, const Tensor& dy);
  void release();
  bool saved() const { return saved_x_.defined(); }

 private:
  struct Link {
    Conv2dGeometry geometry;
    Tensor in_scale, in_bias;  // the prologue of this convolution (T)
    Tensor y;                  // this convolution's output, the batch norm's input (NHWC)
    Tensor mean, invstd, var;  // this batch norm's batch statistics (fp32)
  };
  std::vector<Conv2d*> convs_;
  std::vector<BatchNorm2d*> bns_;
  std::vector<Link> links_;
  Tensor saved_x_;
  Tensor ones_, zeros_;  // the first convolution's prologue
};

}  // namespace kiln
