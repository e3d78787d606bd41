// Rotary position embeddings on CUDA: one thread per (row, head, pair i < d/2), rotating the pair
// (i, i + d/2) in place; the cos/sin tables are read per position (restarting at each packed
// document's first token when document starts are given).

#include <algorithm>

#include "core/cuda/cuda_check.h"
#include "core/cuda/element.cuh"
#include "core/stream.h"
#include "layers/cuda/rotary_cuda.h"

namespace kiln::cuda {
namespace {

template <typename T, typename C>
__global__ void rotary_kernel(T* __restrict__ x, std::int64_t rows, std::int64_t row_stride,
                              const C* __restrict__ cos, const C* __restrict__ sin, int heads,
                              int half, std::int64_t tokens, std::int64_t first,
                              const std::int32_t* __restrict__ starts, C sign) {
  const std::int64_t per_row = static_cast<std::int64_t>(heads) * half;
  const std::int64_t n = rows * per_row;
  for (std::int64_t k = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = k / per_row;
    const int rest = static_cast<int>(k - r * per_row);
    const int h = rest / half, i = rest - h * half;
    const std::int64_t t = r % tokens;
    // A bad start must not read outside the tables: clamped into [0, t].
    const std::int64_t pos =
        starts != nullptr ? t - min(max(static_cast<std::int64_t>(starts[r]), std::int64_t{0}), t)
                          : first + t;
    const C c = cos[pos * half + i], s = sign * sin[pos * half + i];
    T* v = x + r * row_stride + static_cast<std::int64_t>(h) * 2 * half;
    const C a = static_cast<C>(load(v[i])), b = static_cast<C>(load(v[i + half]));
    v[i] = store<T>(a * c - b * s);
    v[i + half] = store<T>(b * c + a * s);
  }
}

}  // namespace

void rotary_apply(Tensor& x, const Tensor& cos, const Tensor& sin, std::int64_t heads,
                  std::int64_t head_dim, std::int64_t tokens, std::int64_t first_position,
                  const Tensor& document_starts, bool inverse) {
  const std::int64_t rows = x.size(0), half = head_dim / 2;
  const std::int64_t n = rows * heads * half;
  if (n == 0) return;
  cudaStream_t stream = static_cast<cudaStream_t>(current_stream(x.device()));
  const int threads = 256;
  const unsigned blocks =
      static_cast<unsigned>(std::min<std::int64_t>((n + threads - 1) / threads, 65536));
  KILN_CUDA_DISPATCH_FLOATING(x.dtype(), T, {
    using C = typename Compute<T>::type;
    rotary_kernel<T, C><<<blocks, threads, 0, stream>>>(
        static_cast<T*>(x.data()), rows, x.stride(0), static_cast<const C*>(cos.data()),
        static_cast<const C*>(sin.data()), static_cast<int>(heads), static_cast<int>(half), tokens,
        first_position,
        document_starts.defined() ? static_cast<const std::int32_t*>(document_starts.data())
                                  : nullptr,
        static_cast<C>(inverse ? -1 : 1));
    KILN_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace kiln::cuda
