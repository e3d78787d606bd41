// Elementwise activation kernels (GELU layer, Linear's unfused epilogues): fp32 math for half
// storage, f64 for f64. When every operand has one dtype and 16-byte alignment, a thread moves
// a Pack (8 halves, 4 floats) per step: full 16-byte transactions and 8 independent erfc chains,
// which is what keeps GELU on a (B*T, 3072) activation near memory speed.

#include "core/cuda/cuda_check.h"
#include "core/cuda/element.cuh"
#include "core/stream.h"
#include "layers/cuda/activations_cuda.h"

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

// The same arithmetic per element as the kernels above, a Pack per thread and step.
template <typename T>
__global__ void activation_forward_packed_kernel(Activation act, const Pack<T>* __restrict__ x,
                                                 Pack<T>* __restrict__ y, std::int64_t packs) {
  using C = typename Compute<T>::type;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < packs;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    Pack<T> in = x[i], out;
#pragma unroll
    for (int k = 0; k < Pack<T>::kSize; ++k)
      out.v[k] = store<T>(activation_apply<C>(act, static_cast<C>(load(in.v[k]))));
    y[i] = out;
  }
}

template <typename T>
__global__ void activation_backward_packed_kernel(Activation act, const Pack<T>* __restrict__ x,
                                                  const Pack<T>* __restrict__ dy,
                                                  Pack<T>* __restrict__ dx, std::int64_t packs) {
  using C = typename Compute<T>::type;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < packs;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    Pack<T> in = x[i], g = dy[i], out;
#pragma unroll
    for (int k = 0; k < Pack<T>::kSize; ++k) {
      C grad = activation_grad<C>(act, static_cast<C>(load(in.v[k])));
      out.v[k] = store<T>(static_cast<C>(load(g.v[k])) * grad);
    }
    dx[i] = out;
  }
}

// Whether the packed kernels serve these operands: one dtype, whole packs, 16-byte aligned.
bool packable(std::int64_t n, std::initializer_list<const Tensor*> operands) {
  const Tensor* first = *operands.begin();
  int pack = 16 / static_cast<int>(dtype_size(first->dtype()));
  for (const Tensor* t : operands) {
    if (t->dtype() != first->dtype() || !aligned16({t->data()})) return false;
  }
  return n % pack == 0;
}

}  // namespace

void activation_forward(Activation act, const Tensor& x, Tensor& y) {
  std::int64_t n = x.numel();
  if (n == 0) return;
  auto stream = static_cast<cudaStream_t>(current_stream(x.device()));
  if (packable(n, {&x, &y})) {
    KILN_CUDA_DISPATCH_FLOATING(x.dtype(), T, {
      std::int64_t packs = n / Pack<T>::kSize;
      activation_forward_packed_kernel<T><<<grid_for(packs), 256, 0, stream>>>(
          act, static_cast<const Pack<T>*>(x.data()), static_cast<Pack<T>*>(y.data()), packs);
      KILN_CUDA_LAUNCH_CHECK();
    });
    return;
  }
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
  if (packable(n, {&x, &dy, &dx})) {
    KILN_CUDA_DISPATCH_FLOATING(x.dtype(), T, {
      std::int64_t packs = n / Pack<T>::kSize;
      activation_backward_packed_kernel<T><<<grid_for(packs), 256, 0, stream>>>(
          act, static_cast<const Pack<T>*>(x.data()), static_cast<const Pack<T>*>(dy.data()),
          static_cast<Pack<T>*>(dx.data()), packs);
      KILN_CUDA_LAUNCH_CHECK();
    });
    return;
  }
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
