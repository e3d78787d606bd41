#pragma once
// BatchNorm2d: the CUDA entry points (layers/cuda/batchnorm.cu). Layer sources call them on CUDA
// tensors without #if; a build without CUDA gets, beside each declaration, a body that throws
// (core/cuda_op.h).

#include "core/cuda_op.h"
#include "layers/batchnorm.h"

namespace kiln {

// CUDA launchers (layers/cuda/batchnorm.cu) on physical tensors; x, y, dy, dx share a dtype
// (f32, f16 or bf16); weight, bias, statistics and gradients are f32 (C).
namespace batchnorm_cuda {
// Batch statistics; updates the running ones when update_running.
KILN_CUDA_OP("BatchNorm2d",
             void forward_training(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                   bool channels_last, double eps, double momentum,
                                   bool update_running, Tensor& running_mean, Tensor& running_var,
                                   Tensor& y, Tensor& save_mean, Tensor& save_invstd,
                                   bool relu = false));
// Running statistics; save_invstd receives 1 / sqrt(running_var + eps).
KILN_CUDA_OP("BatchNorm2d",
             void forward_inference(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                    bool channels_last, double eps, const Tensor& running_mean,
                                    const Tensor& running_var, Tensor& y, Tensor& save_invstd,
                                    bool relu = false));
// batch_stats: backward through the batch statistics (training) or through fixed ones (eval).
// dweight, dbias are accumulated (+=). relu: dy is the gradient of relu(y), the mask recomputed
// from x, weight, bias, mean and invstd exactly as forward computed y.
KILN_CUDA_OP("BatchNorm2d",
             void backward(const Tensor& x, const Tensor& dy, const Tensor& weight,
                           const Tensor& bias, const Tensor& mean, const Tensor& invstd,
                           bool channels_last, bool batch_stats, bool relu, Tensor& dx,
                           Tensor& dweight, Tensor& dbias));
}  // namespace batchnorm_cuda

}  // namespace kiln
