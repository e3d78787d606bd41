// LayerNorm kernels: one warp per row forward (statistics in fp32, f64 for f64); backward writes
// dx one warp per row and partial dweight/dbias sums per chunk of rows, then a second kernel adds
// the partials in chunk order, so the parameter gradients are reproducible bit for bit.

#include <algorithm>
#include <type_traits>

#include "core/cuda/cuda_check.h"
#include "core/cuda/element.cuh"
#include "core/stream.h"
#include "layers/cuda/column_sums.cuh"
#include "layers/cuda/layernorm_cuda.h"

namespace kiln::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kRowsPerBlock = 8;            // warps per block
constexpr std::int64_t kRowsPerChunk = 16;  // 256 blocks for 4096 rows

template <typename C>
__device__ __forceinline__ C warp_sum(C v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

template <typename T, typename C>
__global__ void layernorm_forward_kernel(const T* __restrict__ x, const C* __restrict__ w,
                                         const C* __restrict__ b, C eps, std::int64_t rows,
                                         std::int64_t cols, T* __restrict__ y, C* __restrict__ mean,
                                         C* __restrict__ rstd) {
  std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  int lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  const T* xr = x + row * cols;
  C sum = 0;
  for (std::int64_t c = lane; c < cols; c += kWarp) sum += static_cast<C>(load(xr[c]));
  C mu = warp_sum(sum) / static_cast<C>(cols);
  C var = 0;
  for (std::int64_t c = lane; c < cols; c += kWarp) {
    C d = static_cast<C>(load(xr[c])) - mu;
    var += d * d;
  }
  C r = static_cast<C>(1) / sqrt(warp_sum(var) / static_cast<C>(cols) + eps);
  T* yr = y + row * cols;
  for (std::int64_t c = lane; c < cols; c += kWarp)
    yr[c] = store<T>((static_cast<C>(load(xr[c])) - mu) * r * w[c] + b[c]);
  if (lane == 0) {
    mean[row] = mu;
    rstd[row] = r;
  }
}

// Block = one chunk of kRowsPerChunk rows: warps write dx row by row, then every thread sums its
// columns over the chunk's rows in order into the chunk's partials.
template <typename T, typename C>
__global__ void layernorm_backward_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                          const C* __restrict__ w, const C* __restrict__ mean,
                                          const C* __restrict__ rstd, std::int64_t rows,
                                          std::int64_t cols, T* __restrict__ dx,
                                          C* __restrict__ dw_partial, C* __restrict__ db_partial) {
  std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * kRowsPerChunk;
  std::int64_t last = min(first + kRowsPerChunk, rows);
  int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  for (std::int64_t row = first + warp; row < last; row += blockDim.x / kWarp) {
    const T* xr = x + row * cols;
    const T* dyr = dy + row * cols;
    C mu = mean[row], r = rstd[row];
    C sum_g = 0, sum_g_xhat = 0;
    for (std::int64_t c = lane; c < cols; c += kWarp) {
      C xhat = (static_cast<C>(load(xr[c])) - mu) * r;
      C g = static_cast<C>(load(dyr[c])) * w[c];
      sum_g += g;
      sum_g_xhat += g * xhat;
    }
    C mean_g = warp_sum(sum_g) / static_cast<C>(cols);
    C mean_g_xhat = warp_sum(sum_g_xhat) / static_cast<C>(cols);
    for (std::int64_t c = lane; c < cols; c += kWarp) {
      C xhat = (static_cast<C>(load(xr[c])) - mu) * r;
      C g = static_cast<C>(load(dyr[c])) * w[c];
      dx[row * cols + c] = store<T>(r * (g - mean_g - xhat * mean_g_xhat));
    }
  }
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    C sum_w = 0, sum_b = 0;
    for (std::int64_t row = first; row < last; ++row) {
      C d = static_cast<C>(load(dy[row * cols + c]));
      sum_w += d * (static_cast<C>(load(x[row * cols + c])) - mean[row]) * rstd[row];
      sum_b += d;
    }
    dw_partial[blockIdx.x * cols + c] = sum_w;
    db_partial[blockIdx.x * cols + c] = sum_b;
  }
}

// The same for half rows of P * 256 columns (BERT's and ViT's 768): lane l owns the packs l,
// l + 32, .. of every row, so x and dy are read once, as 16-byte packs, and the weight and bias
// gradients accumulate in registers over the warp's rows; the block then adds its warps in order.
constexpr std::int64_t kPackedRowsPerChunk = 32;

template <typename T, int P>
__global__ void __launch_bounds__(kRowsPerBlock* kWarp, 2)
    layernorm_backward_packed_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                     const float* __restrict__ w, const float* __restrict__ mean,
                                     const float* __restrict__ rstd, std::int64_t rows,
                                     T* __restrict__ dx, float* __restrict__ dw_partial,
                                     float* __restrict__ db_partial) {
  constexpr int kPack = 8, kCols = P * kWarp * kPack;
  __shared__ float by_warp[kRowsPerBlock][kCols];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * kPackedRowsPerChunk;
  const std::int64_t last = min(first + kPackedRowsPerChunk, rows);
  float acc_w[P][kPack] = {}, acc_b[P][kPack] = {};
  const float4* w4 = reinterpret_cast<const float4*>(w);  // the weight stays in L1
  for (std::int64_t row = first + warp; row < last; row += kRowsPerBlock) {
    const Pack<T>* xr = reinterpret_cast<const Pack<T>*>(x + row * kCols);
    const Pack<T>* dyr = reinterpret_cast<const Pack<T>*>(dy + row * kCols);
    const float mu = mean[row], r = rstd[row];
    float xhat[P][kPack], g[P][kPack], sum_g = 0, sum_g_xhat = 0;
#pragma unroll
    for (int j = 0; j < P; ++j) {
      Pack<T> xp = xr[j * kWarp + lane], dp = dyr[j * kWarp + lane];
      float4 wa = w4[(j * kWarp + lane) * 2], wb = w4[(j * kWarp + lane) * 2 + 1];
      const float wk[kPack] = {wa.x, wa.y, wa.z, wa.w, wb.x, wb.y, wb.z, wb.w};
#pragma unroll
      for (int k = 0; k < kPack; ++k) {
        xhat[j][k] = (load(xp.v[k]) - mu) * r;
        float d = load(dp.v[k]);
        g[j][k] = d * wk[k];
        sum_g += g[j][k];
        sum_g_xhat += g[j][k] * xhat[j][k];
        acc_w[j][k] += d * xhat[j][k];
        acc_b[j][k] += d;
      }
    }
    const float mean_g = warp_sum(sum_g) / static_cast<float>(kCols);
    const float mean_g_xhat = warp_sum(sum_g_xhat) / static_cast<float>(kCols);
    Pack<T>* dxr = reinterpret_cast<Pack<T>*>(dx + row * kCols);
#pragma unroll
    for (int j = 0; j < P; ++j) {
      Pack<T> out;
#pragma unroll
      for (int k = 0; k < kPack; ++k)
        out.v[k] = store<T>(r * (g[j][k] - mean_g - xhat[j][k] * mean_g_xhat));
      dxr[j * kWarp + lane] = out;
    }
  }
  // The chunk's partials: warps added in order, the weight's then the bias's.
  auto write_partials = [&](const float(&acc)[P][kPack], float* partial) {
#pragma unroll
    for (int j = 0; j < P; ++j)
#pragma unroll
      for (int k = 0; k < kPack; ++k) by_warp[warp][(j * kWarp + lane) * kPack + k] = acc[j][k];
    __syncthreads();
    for (int c = threadIdx.x; c < kCols; c += blockDim.x) {
      float sum = 0;
      for (int v = 0; v < kRowsPerBlock; ++v) sum += by_warp[v][c];
      partial[blockIdx.x * kCols + c] = sum;
    }
    __syncthreads();
  };
  write_partials(acc_w, dw_partial);
  write_partials(acc_b, db_partial);
}

}  // namespace

void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                       Tensor& y, Tensor& mean, Tensor& rstd) {
  std::int64_t rows = x.size(0), cols = x.size(1);
  if (rows == 0) return;
  cudaStream_t stream = static_cast<cudaStream_t>(current_stream(x.device()));
  unsigned blocks = static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
  KILN_CUDA_DISPATCH_FLOATING(x.dtype(), T, {
    using C = typename Compute<T>::type;
    layernorm_forward_kernel<T, C><<<blocks, kRowsPerBlock * kWarp, 0, stream>>>(
        static_cast<const T*>(x.data()), static_cast<const C*>(weight.data()),
        static_cast<const C*>(bias.data()), static_cast<C>(eps), rows, cols,
        static_cast<T*>(y.data()), static_cast<C*>(mean.data()), static_cast<C*>(rstd.data()));
    KILN_CUDA_LAUNCH_CHECK();
  });
}

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, Tensor& dx, Tensor& dweight, Tensor& dbias) {
  std::int64_t rows = x.size(0), cols = x.size(1);
  cudaStream_t stream = static_cast<cudaStream_t>(current_stream(x.device()));
  if (rows == 0) {
    dweight.zero();
    dbias.zero();
    return;
  }
  // Half rows of 256, 512 or 768 columns (1024 would spill registers), 16-byte aligned: the packed
  // kernel.
  const std::int64_t packs_per_lane = cols / (kWarp * 8);
  const bool packed = is_half(x.dtype()) && dy.dtype() == x.dtype() && dx.dtype() == x.dtype() &&
                      cols % (kWarp * 8) == 0 && packs_per_lane >= 1 && packs_per_lane <= 3 &&
                      aligned16({x.data(), dy.data(), dx.data()});
  const std::int64_t rows_per_chunk = packed ? kPackedRowsPerChunk : kRowsPerChunk;
  std::int64_t chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
  Tensor dw_partial = Tensor::empty({chunks, cols}, dweight.dtype(), x.device());
  Tensor db_partial = Tensor::empty({chunks, cols}, dbias.dtype(), x.device());
  KILN_CUDA_DISPATCH_FLOATING(x.dtype(), T, {
    using C = typename Compute<T>::type;
    if constexpr (sizeof(T) == 2) {
      if (packed) {
        auto launch = [&](auto p) {
          layernorm_backward_packed_kernel<T, decltype(p)::value>
              <<<static_cast<unsigned>(chunks), kRowsPerBlock * kWarp, 0, stream>>>(
                  static_cast<const T*>(dy.data()), static_cast<const T*>(x.data()),
                  static_cast<const float*>(weight.data()), static_cast<const float*>(mean.data()),
                  static_cast<const float*>(rstd.data()), rows, static_cast<T*>(dx.data()),
                  static_cast<float*>(dw_partial.data()), static_cast<float*>(db_partial.data()));
          KILN_CUDA_LAUNCH_CHECK();
        };
        switch (packs_per_lane) {
          case 1:
            launch(std::integral_constant<int, 1>());
            break;
          case 2:
            launch(std::integral_constant<int, 2>());
            break;
          default:
            launch(std::integral_constant<int, 3>());
            break;
        }
      }
    }
    if (!packed) {
      layernorm_backward_kernel<T, C><<<static_cast<unsigned>(chunks), 256, 0, stream>>>(
          static_cast<const T*>(dy.data()), static_cast<const T*>(x.data()),
          static_cast<const C*>(weight.data()), static_cast<const C*>(mean.data()),
          static_cast<const C*>(rstd.data()), rows, cols, static_cast<T*>(dx.data()),
          static_cast<C*>(dw_partial.data()), static_cast<C*>(db_partial.data()));
      KILN_CUDA_LAUNCH_CHECK();
    }
    column_sums_kernel<C, C><<<column_sums_grid(cols), column_sums_block(), 0, stream>>>(
        static_cast<const C*>(dw_partial.data()), chunks, cols, false,
        static_cast<C*>(dweight.data()));
    KILN_CUDA_LAUNCH_CHECK();
    column_sums_kernel<C, C><<<column_sums_grid(cols), column_sums_block(), 0, stream>>>(
        static_cast<const C*>(db_partial.data()), chunks, cols, false,
        static_cast<C*>(dbias.data()));
    KILN_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace kiln::cuda
