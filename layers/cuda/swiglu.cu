// SwiGLU on CUDA: one grid-stride elementwise kernel forward and one backward, fp32 math (f64 in
// f64), matching the CPU loops of layers/swiglu_mlp.cc.

#include <algorithm>

#include "core/cuda/cuda_check.h"
#include "core/cuda/element.cuh"
#include "core/stream.h"
#include "layers/activations.h"
#include "layers/cuda/swiglu_cuda.h"

namespace kiln::cuda {
namespace {

template <typename T, typename C>
__global__ void swiglu_forward_kernel(const T* __restrict__ g, const T* __restrict__ u,
                                      T* __restrict__ a, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    C s, one_minus_s;
    const C x = static_cast<C>(load(g[i]));
    sigmoid_pair(x, s, one_minus_s);
    a[i] = store<T>(x * s * static_cast<C>(load(u[i])));
  }
}

template <typename T, typename C>
__global__ void swiglu_backward_kernel(const T* __restrict__ da, const T* __restrict__ g,
                                       const T* __restrict__ u, T* __restrict__ dg,
                                       T* __restrict__ du, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    C s, one_minus_s;
    const C x = static_cast<C>(load(g[i])), d = static_cast<C>(load(da[i]));
    sigmoid_pair(x, s, one_minus_s);
    dg[i] = store<T>(d * static_cast<C>(load(u[i])) * s * (C(1) + x * one_minus_s));
    du[i] = store<T>(d * x * s);
  }
}

unsigned blocks_for(std::int64_t n) {
  return static_cast<unsigned>(std::min<std::int64_t>((n + 255) / 256, 65536));
}

}  // namespace

void swiglu_forward(const Tensor& g, const Tensor& u, Tensor& a) {
  const std::int64_t n = g.numel();
  if (n == 0) return;
  cudaStream_t stream = static_cast<cudaStream_t>(current_stream(g.device()));
  KILN_CUDA_DISPATCH_FLOATING(g.dtype(), T, {
    using C = typename Compute<T>::type;
    swiglu_forward_kernel<T, C><<<blocks_for(n), 256, 0, stream>>>(static_cast<const T*>(g.data()),
                                                                   static_cast<const T*>(u.data()),
                                                                   static_cast<T*>(a.data()), n);
    KILN_CUDA_LAUNCH_CHECK();
  });
}

void swiglu_backward(const Tensor& da, const Tensor& g, const Tensor& u, Tensor& dg, Tensor& du) {
  const std::int64_t n = g.numel();
  if (n == 0) return;
  cudaStream_t stream = static_cast<cudaStream_t>(current_stream(g.device()));
  KILN_CUDA_DISPATCH_FLOATING(g.dtype(), T, {
    using C = typename Compute<T>::type;
    swiglu_backward_kernel<T, C><<<blocks_for(n), 256, 0, stream>>>(
        static_cast<const T*>(da.data()), static_cast<const T*>(g.data()),
        static_cast<const T*>(u.data()), static_cast<T*>(dg.data()), static_cast<T*>(du.data()), n);
    KILN_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace kiln::cuda
