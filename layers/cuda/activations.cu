// Elementwise activation kernels (GELU layer, Linear's unfused epilogues): grid-stride loops,
// fp32 math for half storage, f64 for f64.

#include "core/cuda/cuda_check.h"
#include "core/cuda/element.cuh"
#include "core/stream.h"
#include "layers/activations.h"

namespace kiln::cuda {
namespace {

template <typename TX, typename TY>
__global__ void activation_forward_kernel(Activation act, const TX* x, TY* y, std::int64_t n) {
  using C = typename Compute<TX>::type;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    y[i] = store<TY>(activation_apply<C>(act, static_cast<C>(load(x[i]))));
  }
}

template <typename TX, typename TD>
__global__ void activation_backward_kernel(Activation act, const TX* x, const TD* dy, TD* dx,
                                           std::int64_t n) {
  using C = typename Compute<TX>::type;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    C grad = activation_grad<C>(act, static_cast<C>(load(x[i])));
    dx[i] = store<TD>(static_cast<C>(load(dy[i])) * grad);
  }
}

}  // namespace

void activation_forward(Activation act, const Tensor& x, Tensor& y) {
  std::int64_t n = x.numel();
  if (n == 0) return;
  auto stream = static_cast<cudaStream_t>(current_stream(x.device()));
  KILN_CUDA_DISPATCH_FLOATING(x.dtype(), TX, {
    KILN_CUDA_DISPATCH_FLOATING(y.dtype(), TY, {
      activation_forward_kernel<TX, TY><<<grid_for(n), 256, 0, stream>>>(
          act, static_cast<const TX*>(x.data()), static_cast<TY*>(y.data()), n);
      KILN_CUDA_LAUNCH_CHECK();
    });
  });
}

void activation_backward(Activation act, const Tensor& x, const Tensor& dy, Tensor& dx) {
  std::int64_t n = x.numel();
  if (n == 0) return;
  auto stream = static_cast<cudaStream_t>(current_stream(x.device()));
  KILN_CUDA_DISPATCH_FLOATING(x.dtype(), TX, {
    KILN_CUDA_DISPATCH_FLOATING(dy.dtype(), TD, {
      activation_backward_kernel<TX, TD><<<grid_for(n), 256, 0, stream>>>(
          act, static_cast<const TX*>(x.data()), static_cast<const TD*>(dy.data()),
          static_cast<TD*>(dx.data()), n);
      KILN_CUDA_LAUNCH_CHECK();
    });
  });
}

}  // namespace kiln::cuda
