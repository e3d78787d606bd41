// ReLU on CUDA: one grid-stride elementwise kernel each way.

#include "core/cuda/cuda_check.h"
#include "core/cuda/element.cuh"
#include "core/stream.h"
#include "layers/relu.h"

namespace kiln::relu_cuda {
namespace {

template <typename T>
__global__ void relu_forward_kernel(const T* x, T* y, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    float v = static_cast<float>(cuda::load(x[i]));
    y[i] = v > 0.f ? x[i] : cuda::store<T>(0.f);
  }
}

template <typename T>
__global__ void relu_backward_kernel(const T* y, const T* dy, T* dx, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    dx[i] = static_cast<float>(cuda::load(y[i])) > 0.f ? dy[i] : cuda::store<T>(0.f);
  }
}

}  // namespace

void forward(const Tensor& x, Tensor& y) {
  KILN_CHECK(
      x.is_contiguous() && y.is_contiguous() && x.dtype() == y.dtype() && x.numel() == y.numel(),
      "relu_cuda::forward: x " + x.str() + ", y " + y.str());
  const std::int64_t n = x.numel();
  if (n == 0) return;
  cudaStream_t stream = static_cast<cudaStream_t>(current_stream(x.device()));
  KILN_CUDA_DISPATCH_FLOATING(x.dtype(), T, {
    relu_forward_kernel<T><<<cuda::grid_for(n), 256, 0, stream>>>(static_cast<const T*>(x.data()),
                                                                  static_cast<T*>(y.data()), n);
    KILN_CUDA_LAUNCH_CHECK();
  });
}

void backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  KILN_CHECK(y.is_contiguous() && dy.is_contiguous() && dx.is_contiguous() &&
                 y.dtype() == dy.dtype() && dy.dtype() == dx.dtype() && y.numel() == dy.numel() &&
                 dy.numel() == dx.numel(),
             "relu_cuda::backward: y " + y.str() + ", dy " + dy.str() + ", dx " + dx.str());
  const std::int64_t n = y.numel();
  if (n == 0) return;
  cudaStream_t stream = static_cast<cudaStream_t>(current_stream(y.device()));
  KILN_CUDA_DISPATCH_FLOATING(y.dtype(), T, {
    relu_backward_kernel<T><<<cuda::grid_for(n), 256, 0, stream>>>(static_cast<const T*>(y.data()),
                                                                   static_cast<const T*>(dy.data()),
                                                                   static_cast<T*>(dx.data()), n);
    KILN_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace kiln::relu_cuda
