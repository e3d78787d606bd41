// PowerSGD's orthonormalisation on CUDA: one block runs modified Gram-Schmidt over the columns of
// a (rows, cols) row-major matrix, with f64 sums reduced in a fixed tree order, as the CPU does.

#include "comm/powersgd.h"
#include "core/cuda/block_sum.cuh"
#include "core/cuda/cuda_check.h"

namespace kiln::detail {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void orthogonalize_columns_kernel(T* a, std::int64_t rows, std::int64_t cols) {
  for (std::int64_t i = 0; i < cols; ++i) {
    double sumsq = 0;
    for (std::int64_t k = threadIdx.x; k < rows; k += kThreads) {
      const double v = a[k * cols + i];
      sumsq += v * v;
    }
    const double norm = sqrt(cuda::block_sum<kThreads>(sumsq));
    const double inv = norm > 0 ? 1.0 / norm : 0.0;
    for (std::int64_t k = threadIdx.x; k < rows; k += kThreads) {
      a[k * cols + i] = static_cast<T>(a[k * cols + i] * inv);
    }
    __syncthreads();
    for (std::int64_t j = i + 1; j < cols; ++j) {
      double dot = 0;
      for (std::int64_t k = threadIdx.x; k < rows; k += kThreads) {
        dot += static_cast<double>(a[k * cols + i]) * a[k * cols + j];
      }
      dot = cuda::block_sum<kThreads>(dot);
      for (std::int64_t k = threadIdx.x; k < rows; k += kThreads) {
        a[k * cols + j] = static_cast<T>(a[k * cols + j] - dot * a[k * cols + i]);
      }
      __syncthreads();
    }
  }
}

}  // namespace

void cuda_orthogonalize_columns(void* data, DType dtype, std::int64_t rows, std::int64_t cols,
                                void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (dtype == DType::F64) {
    orthogonalize_columns_kernel<double>
        <<<1, kThreads, 0, s>>>(static_cast<double*>(data), rows, cols);
    KILN_CUDA_LAUNCH_CHECK();
  } else {
    orthogonalize_columns_kernel<float>
        <<<1, kThreads, 0, s>>>(static_cast<float*>(data), rows, cols);
    KILN_CUDA_LAUNCH_CHECK();
  }
}

}  // namespace kiln::detail
