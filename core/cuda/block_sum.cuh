#pragma once
// Sum over a thread block in a fixed tree order, so the same inputs give the same bits on every
// run; every thread gets the total. All `Threads` threads of the block must call it.

namespace kiln::cuda {

template <int Threads>
__device__ double block_sum(double v) {
  __shared__ double shared[Threads];
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int half = Threads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  const double total = shared[0];
  __syncthreads();
  return total;
}

}  // namespace kiln::cuda
