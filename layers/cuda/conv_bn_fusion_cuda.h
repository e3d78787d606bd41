#pragma once
// Batch norm fused into cuDNN's convolutions (the MLPerf ResNet-50 patterns, through the cuDNN
// frontend's graph API; layers/cuda/conv_bn_fusion.cc and .cu). Layer sources call these on CUDA
// tensors without #if; a build without CUDA gets, beside each declaration, a body that throws
// (core/cuda_op.h).
//
// For a chain conv_k -> bn_k -> relu -> conv_{k+1}, with y_k the output of conv_k:
//   forward   y_{k+1}, sum, sq_sum = conv(relu(y_k * scale_k + bias_k), w)  (prologue + "genstats")
//             finalize: sum, sq_sum -> bn_{k+1}'s mean, invstd and the next scale, bias
//   backward  dw = wgrad(dy, relu(y_k * scale_k + bias_k))                   (prologue)
//             g = drelu(dgrad(dy, w)) with bn_k's weight-gradient sums and equivalent coefficients,
//             then dy_k = eq_dy * g + eq_x * y_k + eq_bias                   (apply_backward)
// Activations are NHWC (physical), f16 or bf16; the prologue's scale and bias are in that dtype
// (as the cuDNN engines take them), statistics and coefficients fp32. cuDNN offers these engines
// on Ampere and Hopper only (9.8 and later for the data gradient): `supported` says, per
// geometry, whether a pattern has a plan; callers run the unfused path otherwise.

#include <cstdint>
#include <string>

#include "core/cuda_op.h"
#include "layers/conv2d.h"

namespace kiln::conv_bn_fusion {

enum class Pattern { Forward, BackwardFilter, BackwardData };

// Whether cuDNN runs `pattern` fused for the convolution g (NHWC, f16 or bf16, groups 1). The first
// call per geometry and device builds the plan; a refusal is remembered and told once on stderr,
// naming the shape and cuDNN's reason. Benchmark search times the first candidates once and
// keeps the fastest, as for the unfused convolutions; the calls below use the plan of the same
// options. The fused statistics are not reproducible bit for bit (two runs differ), so callers
// do not fuse when determinism is asked.
KILN_CUDA_OP("A fused convolution", bool supported(Pattern pattern, const Conv2dGeometry& g,
                                                   const ConvAlgorithmOptions& options));
// How many geometries ran each pattern fused, and how many fell back (for tests and logs).
struct Counts {
  std::int64_t fused = 0, refused = 0;
};
#if KILN_WITH_CUDA
Counts counts();
#else
// Not an error without CUDA: nothing ran fused.
inline Counts counts() {
  return {};
}
#endif

// y = conv(relu(x * scale + bias), w); sum and sq_sum (K, fp32): per-channel sums of y and y^2.
KILN_CUDA_OP("A fused convolution",
             void forward(const Conv2dGeometry& g, const ConvAlgorithmOptions& options,
                          const Tensor& x, const Tensor& scale, const Tensor& bias, const Tensor& w,
                          Tensor& y, Tensor& sum, Tensor& sq_sum));
// dw (filter order KRSC, g.dtype) = the weight gradient of conv(relu(x * scale + bias), w).
KILN_CUDA_OP("A fused convolution",
             void backward_filter(const Conv2dGeometry& g, const ConvAlgorithmOptions& options,
                                  const Tensor& x, const Tensor& scale, const Tensor& bias,
                                  const Tensor& dy, Tensor& dw));
// Through the convolution and the ReLU after batch norm (x its input, mean/invstd its batch
// statistics, gamma/beta its parameters): g = the gradient reaching the batch norm's output,
// dscale/dbias its parameters' gradients (written), eq_* the coefficients of apply_backward.
KILN_CUDA_OP("A fused convolution",
             void backward_data(const Conv2dGeometry& g, const ConvAlgorithmOptions& options,
                                const Tensor& dy, const Tensor& w, const Tensor& x,
                                const Tensor& mean, const Tensor& invstd, const Tensor& gamma,
                                const Tensor& beta, Tensor& grad, Tensor& dscale, Tensor& dbias,
                                Tensor& eq_dy, Tensor& eq_x, Tensor& eq_bias));

// Kiln's kernels (conv_bn_fusion.cu).
// From per-channel sums over `count` values: the batch mean, invstd = 1/sqrt(var + eps), the
// biased var, and the prologue's scale = gamma * invstd, bias = beta - mean * scale (in
// scale.dtype()); the running statistics move by PyTorch's rule when update_running.
KILN_CUDA_OP("A fused convolution",
             void finalize(const Tensor& sum, const Tensor& sq_sum, std::int64_t count,
                           const Tensor& gamma, const Tensor& beta, double eps, double momentum,
                           bool update_running, Tensor& running_mean, Tensor& running_var,
                           Tensor& mean, Tensor& invstd, Tensor& var, Tensor& scale, Tensor& bias));
// out = relu(x * scale + bias) per channel: the prologue, for a pattern that fell back.
KILN_CUDA_OP("A fused convolution", void scale_bias_relu(const Tensor& x, const Tensor& scale,
                                                         const Tensor& bias, Tensor& out));
// dx = eq_dy * g + eq_x * x + eq_bias per channel.
KILN_CUDA_OP("A fused convolution",
             void apply_backward(const Tensor& g, const Tensor& x, const Tensor& eq_dy,
                                 const Tensor& eq_x, const Tensor& eq_bias, Tensor& dx));

}  // namespace kiln::conv_bn_fusion
