// ReLU on CUDA: one grid-stride elementwise kernel each way, on 16-byte packs when the
// tensors are aligned (the common case), else element by element.

#include "core/cuda/cuda_check.h"
#include "core/cuda/element.cuh"
#include "core/stream.h"
#include "layers/relu.h"

namespace kiln::relu_cuda {
namespace {

template <typename T>
__device__ __forceinline__ T relu_of(T v) {
  return static_cast<float>(cuda::load(v)) > 0.f ? v : cuda::store<T>(0.f);
}
template <typename T>
__device__ __forceinline__ T relu_grad_of(T y, T dy) {
  return static_cast<float>(cuda::load(y)) > 0.f ? dy : cuda::store<T>(0.f);
}

// Elements [begin, n) one at a time, from one grid-stride loop (the tail after the packs).
template <typename T>
__global__ void relu_forward_kernel(const T* x, T* y, std::int64_t begin, std::int64_t n) {
  for (std::int64_t i = begin + blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       i < n; i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    y[i] = relu_of(x[i]);
  }
}

// relu(x + r): the sum rounds to T first, as an addition kernel then ReLU would.
template <typename T>
__device__ __forceinline__ T relu_of_sum(T a, T b) {
  return relu_of(cuda::store<T>(cuda::load(a) + cuda::load(b)));
}

template <typename T>
__global__ void relu_add_kernel(const T* x, const T* r, T* y, std::int64_t begin, std::int64_t n) {
  for (std::int64_t i = begin + blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       i < n; i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    y[i] = relu_of_sum(x[i], r[i]);
  }
}

template <typename T>
__global__ void relu_add_packed_kernel(const cuda::Pack<T>* x, const cuda::Pack<T>* r,
                                       cuda::Pack<T>* y, std::int64_t packs) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < packs;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    cuda::Pack<T> p = x[i];
    const cuda::Pack<T> q = r[i];
#pragma unroll
    for (int k = 0; k < cuda::Pack<T>::kSize; ++k) p.v[k] = relu_of_sum(p.v[k], q.v[k]);
    y[i] = p;
  }
}

template <typename T>
__global__ void relu_backward_kernel(const T* y, const T* dy, T* dx, std::int64_t begin,
                                     std::int64_t n) {
  for (std::int64_t i = begin + blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       i < n; i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    dx[i] = relu_grad_of(y[i], dy[i]);
  }
}

template <typename T>
__global__ void relu_forward_packed_kernel(const cuda::Pack<T>* x, cuda::Pack<T>* y,
                                           std::int64_t packs) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < packs;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    cuda::Pack<T> p = x[i];
#pragma unroll
    for (int k = 0; k < cuda::Pack<T>::kSize; ++k) p.v[k] = relu_of(p.v[k]);
    y[i] = p;
  }
}

template <typename T>
__global__ void relu_backward_packed_kernel(const cuda::Pack<T>* y, const cuda::Pack<T>* dy,
                                            cuda::Pack<T>* dx, std::int64_t packs) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < packs;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    cuda::Pack<T> py = y[i], g = dy[i];
#pragma unroll
    for (int k = 0; k < cuda::Pack<T>::kSize; ++k) g.v[k] = relu_grad_of(py.v[k], g.v[k]);
    dx[i] = g;
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
    const T* px = static_cast<const T*>(x.data());
    T* py = static_cast<T*>(y.data());
    std::int64_t packs = cuda::aligned16({px, py}) ? n / cuda::Pack<T>::kSize : 0;
    if (packs > 0) {
      relu_forward_packed_kernel<T><<<cuda::grid_for(packs), 256, 0, stream>>>(
          reinterpret_cast<const cuda::Pack<T>*>(px), reinterpret_cast<cuda::Pack<T>*>(py), packs);
      KILN_CUDA_LAUNCH_CHECK();
    }
    std::int64_t done = packs * cuda::Pack<T>::kSize;
    if (done < n) {
      relu_forward_kernel<T><<<cuda::grid_for(n - done), 256, 0, stream>>>(px, py, done, n);
      KILN_CUDA_LAUNCH_CHECK();
    }
  });
}

void forward_add(const Tensor& x, const Tensor& r, Tensor& y) {
  KILN_CHECK(x.is_contiguous() && r.is_contiguous() && y.is_contiguous() &&
                 x.dtype() == y.dtype() && r.dtype() == x.dtype() && x.numel() == y.numel() &&
                 r.numel() == x.numel(),
             "relu_cuda::forward_add: x " + x.str() + ", r " + r.str() + ", y " + y.str());
  const std::int64_t n = x.numel();
  if (n == 0) return;
  cudaStream_t stream = static_cast<cudaStream_t>(current_stream(x.device()));
  KILN_CUDA_DISPATCH_FLOATING(x.dtype(), T, {
    const T* px = static_cast<const T*>(x.data());
    const T* pr = static_cast<const T*>(r.data());
    T* py = static_cast<T*>(y.data());
    std::int64_t packs = cuda::aligned16({px, pr, py}) ? n / cuda::Pack<T>::kSize : 0;
    if (packs > 0) {
      relu_add_packed_kernel<T><<<cuda::grid_for(packs), 256, 0, stream>>>(
          reinterpret_cast<const cuda::Pack<T>*>(px), reinterpret_cast<const cuda::Pack<T>*>(pr),
          reinterpret_cast<cuda::Pack<T>*>(py), packs);
      KILN_CUDA_LAUNCH_CHECK();
    }
    std::int64_t done = packs * cuda::Pack<T>::kSize;
    if (done < n) {
      relu_add_kernel<T><<<cuda::grid_for(n - done), 256, 0, stream>>>(px, pr, py, done, n);
      KILN_CUDA_LAUNCH_CHECK();
    }
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
    const T* py = static_cast<const T*>(y.data());
    const T* pdy = static_cast<const T*>(dy.data());
    T* pdx = static_cast<T*>(dx.data());
    std::int64_t packs = cuda::aligned16({py, pdy, pdx}) ? n / cuda::Pack<T>::kSize : 0;
    if (packs > 0) {
      relu_backward_packed_kernel<T><<<cuda::grid_for(packs), 256, 0, stream>>>(
          reinterpret_cast<const cuda::Pack<T>*>(py), reinterpret_cast<const cuda::Pack<T>*>(pdy),
          reinterpret_cast<cuda::Pack<T>*>(pdx), packs);
      KILN_CUDA_LAUNCH_CHECK();
    }
    std::int64_t done = packs * cuda::Pack<T>::kSize;
    if (done < n) {
      relu_backward_kernel<T><<<cuda::grid_for(n - done), 256, 0, stream>>>(py, pdy, pdx, done, n);
      KILN_CUDA_LAUNCH_CHECK();
    }
  });
}

}  // namespace kiln::relu_cuda
