// Conv2d's per-channel bias on CUDA (the convolutions themselves are cuDNN calls in conv2d.cc).

#include "core/cuda/cuda_check.h"
#include "core/cuda/element.cuh"
#include "core/stream.h"
#include "layers/cuda/conv2d_cuda.h"

namespace kiln::cudnn_conv {
namespace {

// y[i] += bias[c]; c = (i / inner) % channels, inner = H*W for NCHW and 1 for NHWC.
template <typename T>
__global__ void add_bias_kernel(T* y, const T* bias, std::int64_t n, std::int64_t channels,
                                std::int64_t inner) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t c = (i / inner) % channels;
    y[i] = cuda::store<T>(cuda::load(y[i]) + cuda::load(bias[c]));
  }
}

}  // namespace

void add_bias(Tensor& y, const Tensor& bias, bool channels_last) {
  KILN_CHECK(y.dim() == 4 && y.is_contiguous() && bias.dtype() == y.dtype() && bias.is_contiguous(),
             "add_bias: y " + y.str() + ", bias " + bias.str());
  const std::int64_t channels = channels_last ? y.size(3) : y.size(1);
  const std::int64_t inner = channels_last ? 1 : y.size(2) * y.size(3);
  KILN_CHECK(bias.numel() == channels, "add_bias: bias " + bias.str() + " for y " + y.str());
  const std::int64_t n = y.numel();
  if (n == 0) return;
  cudaStream_t stream = static_cast<cudaStream_t>(current_stream(y.device()));
  KILN_CUDA_DISPATCH_FLOATING(y.dtype(), T, {
    add_bias_kernel<T><<<cuda::grid_for(n), 256, 0, stream>>>(
        static_cast<T*>(y.data()), static_cast<const T*>(bias.data()), n, channels, inner);
    KILN_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace kiln::cudnn_conv
