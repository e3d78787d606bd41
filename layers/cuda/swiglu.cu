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

// Element k of the (N, I) output: row k / I, column k % I of the gate half, the same column of
// the up half I columns later.
template <typename T, typename C>
__global__ void swiglu_forward_kernel(const T* __restrict__ gate_up, T* __restrict__ a,
                                      std::int64_t n, std::int64_t inner) {
  for (std::int64_t k = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = k / inner, j = k - r * inner;
    const T* row = gate_up + r * 2 * inner;
    C s, one_minus_s;
    const C g = static_cast<C>(load(row[j]));
    sigmoid_pair(g, s, one_minus_s);
    a[k] = store<T>(g * s * static_cast<C>(load(row[inner + j])));
  }
}

template <typename T, typename C>
__global__ void swiglu_backward_kernel(const T* __restrict__ da, const T* __restrict__ gate_up,
                                       T* __restrict__ dgate_up, std::int64_t n,
                                       std::int64_t inner) {
  for (std::int64_t k = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = k / inner, j = k - r * inner;
    const T* row = gate_up + r * 2 * inner;
    T* drow = dgate_up + r * 2 * inner;
    C s, one_minus_s;
    const C g = static_cast<C>(load(row[j])), u = static_cast<C>(load(row[inner + j]));
    const C d = static_cast<C>(load(da[k]));
    sigmoid_pair(g, s, one_minus_s);
    drow[j] = store<T>(d * u * s * (C(1) + g * one_minus_s));
    drow[inner + j] = store<T>(d * g * s);
  }
}

unsigned blocks_for(std::int64_t n) {
  return static_cast<unsigned>(std::min<std::int64_t>((n + 255) / 256, 65536));
}

}  // namespace

void swiglu_forward(const Tensor& gate_up, Tensor& a) {
  const std::int64_t n = a.numel(), inner = a.size(-1);
  if (n == 0) return;
  cudaStream_t stream = static_cast<cudaStream_t>(current_stream(a.device()));
  KILN_CUDA_DISPATCH_FLOATING(a.dtype(), T, {
    using C = typename Compute<T>::type;
    swiglu_forward_kernel<T, C><<<blocks_for(n), 256, 0, stream>>>(
        static_cast<const T*>(gate_up.data()), static_cast<T*>(a.data()), n, inner);
    KILN_CUDA_LAUNCH_CHECK();
  });
}

void swiglu_backward(const Tensor& da, const Tensor& gate_up, Tensor& dgate_up) {
  const std::int64_t n = da.numel(), inner = da.size(-1);
  if (n == 0) return;
  cudaStream_t stream = static_cast<cudaStream_t>(current_stream(da.device()));
  KILN_CUDA_DISPATCH_FLOATING(da.dtype(), T, {
    using C = typename Compute<T>::type;
    swiglu_backward_kernel<T, C><<<blocks_for(n), 256, 0, stream>>>(
        static_cast<const T*>(da.data()), static_cast<const T*>(gate_up.data()),
        static_cast<T*>(dgate_up.data()), n, inner);
    KILN_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace kiln::cuda
