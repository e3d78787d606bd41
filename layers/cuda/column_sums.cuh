#pragma once
// The last stage of a deterministic column reduction: (chunks, cols) partial sums, written in
// chunk order by an earlier kernel, summed per column. Block = 32 columns x 32 threads striding
// over the chunks, then a fixed-order sum of the 32: enough parallelism for hundreds of chunks
// (one thread per column summing them all leaves most of the GPU idle).

#include <cstdint>

#include "core/cuda/element.cuh"

namespace kiln::cuda {

constexpr int kColumnSumColumns = 32, kColumnSumThreads = 32;

// out[c] = (accumulate ? out[c] : 0) + (sum over k of partial[k * cols + c]), for this block's
// columns: the sum is formed first, so accumulating it adds one rounded number.
template <typename C, typename G>
__device__ __forceinline__ void sum_columns(const C* __restrict__ partial,
                                                  std::int64_t chunks, std::int64_t cols,
                                                  bool accumulate, G* __restrict__ out) {
  __shared__ C sums[kColumnSumThreads][kColumnSumColumns + 1];
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * kColumnSumColumns + threadIdx.x;
  C sum = 0;
  if (c < cols) {
    for (std::int64_t k = threadIdx.y; k < chunks; k += kColumnSumThreads) {
      sum += partial[k * cols + c];
    }
  }
  sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    C total = 0;
    for (int k = 0; k < kColumnSumThreads; ++k) total += sums[k][threadIdx.x];
    out[c] = store<G>(accumulate ? static_cast<C>(load(out[c])) + total : total);
  }
}

template <typename C, typename G>
__global__ void column_sums_kernel(const C* __restrict__ partial, std::int64_t chunks,
                                   std::int64_t cols, bool accumulate, G* __restrict__ out) {
  sum_columns(partial, chunks, cols, accumulate, out);
}

inline dim3 column_sums_grid(std::int64_t cols) {
  return dim3(static_cast<unsigned>((cols + kColumnSumColumns - 1) / kColumnSumColumns));
}
inline dim3 column_sums_block() {
  return dim3(kColumnSumColumns, kColumnSumThreads);
}

}  // namespace kiln::cuda
