// SwiGLU on CUDA: one grid-stride elementwise kernel forward and one backward, fp32 math (f64 in
// f64), matching the CPU loops of layers/swiglu_mlp.cc. Rows whose I is a multiple of a 16-byte
// pack (every preset) move whole packs per thread; others go element by element.

#include <algorithm>
#include <initializer_list>
#include <type_traits>

#include "core/cuda/cuda_check.h"
#include "core/cuda/element.cuh"
#include "core/stream.h"
#include "layers/activations.h"
#include "layers/cuda/swiglu_cuda.h"

namespace kiln::cuda {
namespace {

// Pack k of the (N, I) output (P elements per pack, P = 1 when unaligned): row k / (I / P); the
// gate half's pack at the same column of the row's [g | u], the up half's I columns later.
template <typename T, typename C, int P>
__global__ void swiglu_forward_kernel(const T* __restrict__ gate_up, T* __restrict__ a,
                                      std::int64_t packs, std::int64_t inner) {
  using V = Pack<T>;
  const std::int64_t per_row = inner / P;
  for (std::int64_t k = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; k < packs;
       k += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = k / per_row, j = (k - r * per_row) * P;
    const T* row = gate_up + r * 2 * inner;
    T g[P], u[P], out[P];
    if constexpr (P > 1) {
      *reinterpret_cast<V*>(g) = *reinterpret_cast<const V*>(row + j);
      *reinterpret_cast<V*>(u) = *reinterpret_cast<const V*>(row + inner + j);
    } else {
      g[0] = row[j];
      u[0] = row[inner + j];
    }
#pragma unroll
    for (int e = 0; e < P; ++e) {
      C s, one_minus_s;
      const C x = static_cast<C>(load(g[e]));
      sigmoid_pair(x, s, one_minus_s);
      out[e] = store<T>(x * s * static_cast<C>(load(u[e])));
    }
    if constexpr (P > 1) {
      *reinterpret_cast<V*>(a + k * P) = *reinterpret_cast<const V*>(out);
    } else {
      a[k] = out[0];
    }
  }
}

template <typename T, typename C, int P>
__global__ void swiglu_backward_kernel(const T* __restrict__ da, const T* __restrict__ gate_up,
                                       T* __restrict__ dgate_up, std::int64_t packs,
                                       std::int64_t inner) {
  using V = Pack<T>;
  const std::int64_t per_row = inner / P;
  for (std::int64_t k = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; k < packs;
       k += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = k / per_row, j = (k - r * per_row) * P;
    const T* row = gate_up + r * 2 * inner;
    T* drow = dgate_up + r * 2 * inner;
    T g[P], u[P], d[P], dg[P], du[P];
    if constexpr (P > 1) {
      *reinterpret_cast<V*>(g) = *reinterpret_cast<const V*>(row + j);
      *reinterpret_cast<V*>(u) = *reinterpret_cast<const V*>(row + inner + j);
      *reinterpret_cast<V*>(d) = *reinterpret_cast<const V*>(da + k * P);
    } else {
      g[0] = row[j];
      u[0] = row[inner + j];
      d[0] = da[k];
    }
#pragma unroll
    for (int e = 0; e < P; ++e) {
      C s, one_minus_s;
      const C x = static_cast<C>(load(g[e])), up = static_cast<C>(load(u[e]));
      const C grad = static_cast<C>(load(d[e]));
      sigmoid_pair(x, s, one_minus_s);
      dg[e] = store<T>(grad * up * s * (C(1) + x * one_minus_s));
      du[e] = store<T>(grad * x * s);
    }
    if constexpr (P > 1) {
      *reinterpret_cast<V*>(drow + j) = *reinterpret_cast<const V*>(dg);
      *reinterpret_cast<V*>(drow + inner + j) = *reinterpret_cast<const V*>(du);
    } else {
      drow[j] = dg[0];
      drow[inner + j] = du[0];
    }
  }
}

unsigned blocks_for(std::int64_t n) {
  return static_cast<unsigned>(std::min<std::int64_t>((n + 255) / 256, 65536));
}

}  // namespace

// launch(std::integral_constant<int, P>()) with 16-byte packs when the rows allow them.
template <typename T, typename Launch>
void with_pack_size(std::int64_t inner, std::initializer_list<const void*> pointers,
                    Launch&& launch) {
  constexpr int kPack = Pack<T>::kSize;
  if (inner % kPack == 0 && aligned16(pointers)) {
    launch(std::integral_constant<int, kPack>());
  } else {
    launch(std::integral_constant<int, 1>());
  }
}

void swiglu_forward(const Tensor& gate_up, Tensor& a) {
  const std::int64_t n = a.numel(), inner = a.size(-1);
  if (n == 0) return;
  cudaStream_t stream = static_cast<cudaStream_t>(current_stream(a.device()));
  KILN_CUDA_DISPATCH_FLOATING(a.dtype(), T, {
    using C = typename Compute<T>::type;
    with_pack_size<T>(inner, {gate_up.data(), a.data()}, [&](auto pack) {
      constexpr int P = decltype(pack)::value;
      swiglu_forward_kernel<T, C, P><<<blocks_for(n / P), 256, 0, stream>>>(
          static_cast<const T*>(gate_up.data()), static_cast<T*>(a.data()), n / P, inner);
      KILN_CUDA_LAUNCH_CHECK();
    });
  });
}

void swiglu_backward(const Tensor& da, const Tensor& gate_up, Tensor& dgate_up) {
  const std::int64_t n = da.numel(), inner = da.size(-1);
  if (n == 0) return;
  cudaStream_t stream = static_cast<cudaStream_t>(current_stream(da.device()));
  KILN_CUDA_DISPATCH_FLOATING(da.dtype(), T, {
    using C = typename Compute<T>::type;
    with_pack_size<T>(inner, {da.data(), gate_up.data(), dgate_up.data()}, [&](auto pack) {
      constexpr int P = decltype(pack)::value;
      swiglu_backward_kernel<T, C, P><<<blocks_for(n / P), 256, 0, stream>>>(
          static_cast<const T*>(da.data()), static_cast<const T*>(gate_up.data()),
          static_cast<T*>(dgate_up.data()), n / P, inner);
      KILN_CUDA_LAUNCH_CHECK();
    });
  });
}

}  // namespace kiln::cuda
