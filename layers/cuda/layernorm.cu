// LayerNorm kernels: one warp per row forward (statistics in fp32, f64 for f64); backward writes
// dx one warp per row and partial dweight/dbias sums per chunk of rows, then a second kernel adds
// the partials in chunk order, so the parameter gradients are reproducible bit for bit.
// RMSNorm runs the same kernels uncentered: no bias (b == nullptr), the mean held at 0 and
// backward's mean(g) term dropped.

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

// With delta, the row is h = x + delta, rounded to T and stored in `sum` as it is first read;
// the later passes read h from there (this thread's own writes).
template <typename T, typename C>
__global__ void layernorm_forward_kernel(const T* __restrict__ x, const T* __restrict__ delta,
                                         const C* __restrict__ w, const C* __restrict__ b, C eps,
                                         std::int64_t rows, std::int64_t cols, T* __restrict__ y,
                                         T* __restrict__ h, C* __restrict__ mean,
                                         C* __restrict__ rstd) {
  std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  int lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  const T* xr = x + row * cols;
  C sum = 0;
  if (delta != nullptr) {
    const T* dr = delta + row * cols;
    T* hr = h + row * cols;
    for (std::int64_t c = lane; c < cols; c += kWarp) {
      const T v = store<T>(static_cast<C>(load(xr[c])) + static_cast<C>(load(dr[c])));
      hr[c] = v;
      sum += static_cast<C>(load(v));
    }
    xr = hr;
  } else {
    for (std::int64_t c = lane; c < cols; c += kWarp) sum += static_cast<C>(load(xr[c]));
  }
  C mu = b != nullptr ? warp_sum(sum) / static_cast<C>(cols) : C(0);
  C var = 0;
  for (std::int64_t c = lane; c < cols; c += kWarp) {
    C d = static_cast<C>(load(xr[c])) - mu;
    var += d * d;
  }
  C r = static_cast<C>(1) / sqrt(warp_sum(var) / static_cast<C>(cols) + eps);
  T* yr = y + row * cols;
  for (std::int64_t c = lane; c < cols; c += kWarp)
    yr[c] = store<T>((static_cast<C>(load(xr[c])) - mu) * r * w[c] + (b ? b[c] : C(0)));
  if (lane == 0) {
    mean[row] = mu;
    rstd[row] = r;
  }
}

// Half rows of up to 32 * P packs of 8 (GPT-2's 768: P = 3; XL's 1600: P = 7), one warp per row
// held in registers: x (and delta) read once as 16-byte packs, y (and h) written once.
template <typename T, int P>
__global__ void __launch_bounds__(kRowsPerBlock* kWarp)
    layernorm_forward_packed_kernel(const T* __restrict__ x, const T* __restrict__ delta,
                                    const float* __restrict__ w, const float* __restrict__ b,
                                    float eps, std::int64_t rows, std::int64_t cols,
                                    T* __restrict__ y, T* __restrict__ h, float* __restrict__ mean,
                                    float* __restrict__ rstd) {
  constexpr int kPack = 8;
  const std::int64_t row =
      static_cast<std::int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  const int packs = static_cast<int>(cols / kPack);
  const Pack<T>* xr = reinterpret_cast<const Pack<T>*>(x + row * cols);
  float v[P][kPack];
  float sum = 0;
#pragma unroll
  for (int j = 0; j < P; ++j) {
    const int idx = j * kWarp + lane;
    if (idx >= packs) continue;
    Pack<T> xp = xr[idx];
    if (delta != nullptr) {
      const Pack<T> dp = reinterpret_cast<const Pack<T>*>(delta + row * cols)[idx];
#pragma unroll
      for (int k = 0; k < kPack; ++k) xp.v[k] = store<T>(load(xp.v[k]) + load(dp.v[k]));
      reinterpret_cast<Pack<T>*>(h + row * cols)[idx] = xp;
    }
#pragma unroll
    for (int k = 0; k < kPack; ++k) {
      v[j][k] = load(xp.v[k]);
      sum += v[j][k];
    }
  }
  const float mu = b != nullptr ? warp_sum(sum) / static_cast<float>(cols) : 0.0f;
  float var = 0;
#pragma unroll
  for (int j = 0; j < P; ++j) {
    if (j * kWarp + lane >= packs) continue;
#pragma unroll
    for (int k = 0; k < kPack; ++k) {
      const float d = v[j][k] - mu;
      var += d * d;
    }
  }
  const float r = 1.0f / sqrtf(warp_sum(var) / static_cast<float>(cols) + eps);
  const float4* w4 = reinterpret_cast<const float4*>(w);
  const float4* b4 = reinterpret_cast<const float4*>(b);
  Pack<T>* yr = reinterpret_cast<Pack<T>*>(y + row * cols);
#pragma unroll
  for (int j = 0; j < P; ++j) {
    const int idx = j * kWarp + lane;
    if (idx >= packs) continue;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const float4 wa = w4[idx * 2], wb = w4[idx * 2 + 1];
    const float4 ba = b4 ? b4[idx * 2] : zero, bb = b4 ? b4[idx * 2 + 1] : zero;
    const float wk[kPack] = {wa.x, wa.y, wa.z, wa.w, wb.x, wb.y, wb.z, wb.w};
    const float bk[kPack] = {ba.x, ba.y, ba.z, ba.w, bb.x, bb.y, bb.z, bb.w};
    Pack<T> out;
#pragma unroll
    for (int k = 0; k < kPack; ++k) out.v[k] = store<T>((v[j][k] - mu) * r * wk[k] + bk[k]);
    yr[idx] = out;
  }
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
                                          const C* __restrict__ rstd,
                                          const T* __restrict__ residual_grad, bool centered,
                                          std::int64_t rows, std::int64_t cols, T* __restrict__ dx,
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
    C mean_g = centered ? warp_sum(sum_g) / static_cast<C>(cols) : C(0);
    C mean_g_xhat = warp_sum(sum_g_xhat) / static_cast<C>(cols);
    for (std::int64_t c = lane; c < cols; c += kWarp) {
      C xhat = (static_cast<C>(load(xr[c])) - mu) * r;
      C g = static_cast<C>(load(dyr[c])) * w[c];
      C v = r * (g - mean_g - xhat * mean_g_xhat);
      if (residual_grad != nullptr) v += static_cast<C>(load(residual_grad[row * cols + c]));
      dx[row * cols + c] = store<T>(v);
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

// Half rows of any multiple of 8 columns (GPT-2 XL's 1600), the generic kernel's work in 16-byte
// packs: warps write dx row by row (the second read of the row hits L1), then each thread sums its
// packs of columns over the chunk's rows in order.
template <typename T>
__global__ void layernorm_backward_pack8_kernel(
    const T* __restrict__ dy, const T* __restrict__ x, const float* __restrict__ w,
    const float* __restrict__ mean, const float* __restrict__ rstd,
    const T* __restrict__ residual_grad, bool centered, std::int64_t rows, std::int64_t cols,
    T* __restrict__ dx, float* __restrict__ dw_partial, float* __restrict__ db_partial) {
  constexpr int kPack = 8;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * kRowsPerChunk;
  const std::int64_t last = min(first + kRowsPerChunk, rows);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const std::int64_t packs = cols / kPack;
  const float4* w4 = reinterpret_cast<const float4*>(w);
  for (std::int64_t row = first + warp; row < last; row += blockDim.x / kWarp) {
    const Pack<T>* xr = reinterpret_cast<const Pack<T>*>(x + row * cols);
    const Pack<T>* dyr = reinterpret_cast<const Pack<T>*>(dy + row * cols);
    const float mu = mean[row], r = rstd[row];
    float sum_g = 0, sum_g_xhat = 0;
    for (std::int64_t p = lane; p < packs; p += kWarp) {
      const Pack<T> xp = xr[p], dp = dyr[p];
      const float4 wa = w4[p * 2], wb = w4[p * 2 + 1];
      const float wk[kPack] = {wa.x, wa.y, wa.z, wa.w, wb.x, wb.y, wb.z, wb.w};
#pragma unroll
      for (int k = 0; k < kPack; ++k) {
        const float g = load(dp.v[k]) * wk[k];
        sum_g += g;
        sum_g_xhat += g * ((load(xp.v[k]) - mu) * r);
      }
    }
    const float mean_g = centered ? warp_sum(sum_g) / static_cast<float>(cols) : 0.0f;
    const float mean_g_xhat = warp_sum(sum_g_xhat) / static_cast<float>(cols);
    Pack<T>* dxr = reinterpret_cast<Pack<T>*>(dx + row * cols);
    const Pack<T>* rgr = residual_grad != nullptr
                             ? reinterpret_cast<const Pack<T>*>(residual_grad + row * cols)
                             : nullptr;
    for (std::int64_t p = lane; p < packs; p += kWarp) {
      const Pack<T> xp = xr[p], dp = dyr[p];
      const float4 wa = w4[p * 2], wb = w4[p * 2 + 1];
      const float wk[kPack] = {wa.x, wa.y, wa.z, wa.w, wb.x, wb.y, wb.z, wb.w};
      float add[kPack] = {};
      if (rgr != nullptr) {
        const Pack<T> rp = rgr[p];
#pragma unroll
        for (int k = 0; k < kPack; ++k) add[k] = load(rp.v[k]);
      }
      Pack<T> out;
#pragma unroll
      for (int k = 0; k < kPack; ++k) {
        const float xhat = (load(xp.v[k]) - mu) * r;
        const float g = load(dp.v[k]) * wk[k];
        out.v[k] = store<T>(r * (g - mean_g - xhat * mean_g_xhat) + add[k]);
      }
      dxr[p] = out;
    }
  }
  for (std::int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
    float sum_w[kPack] = {}, sum_b[kPack] = {};
    for (std::int64_t row = first; row < last; ++row) {
      const Pack<T> xp = reinterpret_cast<const Pack<T>*>(x + row * cols)[p];
      const Pack<T> dp = reinterpret_cast<const Pack<T>*>(dy + row * cols)[p];
      const float mu = mean[row], r = rstd[row];
#pragma unroll
      for (int k = 0; k < kPack; ++k) {
        const float d = load(dp.v[k]);
        sum_w[k] += d * ((load(xp.v[k]) - mu) * r);
        sum_b[k] += d;
      }
    }
    float4* pw = reinterpret_cast<float4*>(dw_partial + blockIdx.x * cols) + p * 2;
    float4* pb = reinterpret_cast<float4*>(db_partial + blockIdx.x * cols) + p * 2;
    pw[0] = make_float4(sum_w[0], sum_w[1], sum_w[2], sum_w[3]);
    pw[1] = make_float4(sum_w[4], sum_w[5], sum_w[6], sum_w[7]);
    pb[0] = make_float4(sum_b[0], sum_b[1], sum_b[2], sum_b[3]);
    pb[1] = make_float4(sum_b[4], sum_b[5], sum_b[6], sum_b[7]);
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
                                     const float* __restrict__ rstd,
                                     const T* __restrict__ residual_grad, bool centered,
                                     std::int64_t rows, T* __restrict__ dx,
                                     float* __restrict__ dw_partial,
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
    const float mean_g = centered ? warp_sum(sum_g) / static_cast<float>(kCols) : 0.0f;
    const float mean_g_xhat = warp_sum(sum_g_xhat) / static_cast<float>(kCols);
    Pack<T>* dxr = reinterpret_cast<Pack<T>*>(dx + row * kCols);
    const Pack<T>* rgr = residual_grad != nullptr
                             ? reinterpret_cast<const Pack<T>*>(residual_grad + row * kCols)
                             : nullptr;
#pragma unroll
    for (int j = 0; j < P; ++j) {
      Pack<T> out;
      float add[kPack] = {};
      if (rgr != nullptr) {
        const Pack<T> rp = rgr[j * kWarp + lane];
#pragma unroll
        for (int k = 0; k < kPack; ++k) add[k] = load(rp.v[k]);
      }
#pragma unroll
      for (int k = 0; k < kPack; ++k)
        out.v[k] = store<T>(r * (g[j][k] - mean_g - xhat[j][k] * mean_g_xhat) + add[k]);
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

// The weight's (blockIdx.y 0) and the bias's (1) column sums of their partials, (2, chunks, cols),
// in one launch.
template <typename C>
__global__ void layernorm_param_grads_kernel(const C* __restrict__ partials, std::int64_t chunks,
                                             std::int64_t cols, bool accumulate,
                                             C* __restrict__ dweight, C* __restrict__ dbias) {
  sum_columns(partials + static_cast<std::int64_t>(blockIdx.y) * chunks * cols, chunks, cols,
              accumulate, blockIdx.y == 0 ? dweight : dbias);
}

// launch(std::integral_constant<int, P>()) with the register pack count P (at most Max) that
// holds `packs` packs per lane: the kernels are instantiated for 1, 2, 3, 4, 6 and 8.
template <int Max, typename Launch>
void with_packs_per_lane(std::int64_t packs, Launch&& launch) {
  if (packs <= 1) {
    launch(std::integral_constant<int, 1>());
  } else if (packs == 2 || Max == 2) {
    launch(std::integral_constant<int, 2>());
  } else if constexpr (Max >= 3) {
    if (packs == 3 || Max == 3) {
      launch(std::integral_constant<int, 3>());
    } else if constexpr (Max >= 4) {
      if (packs == 4 || Max == 4) {
        launch(std::integral_constant<int, 4>());
      } else if constexpr (Max >= 6) {
        if (packs <= 6 || Max < 8) {
          launch(std::integral_constant<int, 6>());
        } else {
          launch(std::integral_constant<int, 8>());
        }
      }
    }
  }
}

}  // namespace

void layernorm_forward(const Tensor& x, const Tensor& delta, const Tensor& weight,
                       const Tensor& bias, double eps, Tensor& y, Tensor& sum, Tensor& mean,
                       Tensor& rstd) {
  std::int64_t rows = x.size(0), cols = x.size(1);
  if (rows == 0) return;
  cudaStream_t stream = static_cast<cudaStream_t>(current_stream(x.device()));
  unsigned blocks = static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
  const bool has_delta = delta.defined();
  const std::int64_t packs_per_lane = (cols / 8 + kWarp - 1) / kWarp;
  const bool centered = bias.defined();
  const void* bias_data = centered ? bias.data() : weight.data();  // aligned16 of what is read
  const bool packed = is_half(x.dtype()) && cols % 8 == 0 && packs_per_lane <= 8 &&
                      aligned16({x.data(), y.data(), weight.data(), bias_data}) &&
                      (!has_delta || aligned16({delta.data(), sum.data()}));
  KILN_CUDA_DISPATCH_FLOATING(x.dtype(), T, {
    using C = typename Compute<T>::type;
    const T* d = has_delta ? static_cast<const T*>(delta.data()) : nullptr;
    T* h = has_delta ? static_cast<T*>(sum.data()) : nullptr;
    if constexpr (sizeof(T) == 2) {
      if (packed) {
        auto launch = [&](auto p) {
          layernorm_forward_packed_kernel<T, decltype(p)::value>
              <<<blocks, kRowsPerBlock * kWarp, 0, stream>>>(
                  static_cast<const T*>(x.data()), d, static_cast<const float*>(weight.data()),
                  centered ? static_cast<const float*>(bias.data()) : nullptr,
                  static_cast<float>(eps), rows, cols, static_cast<T*>(y.data()), h,
                  static_cast<float*>(mean.data()), static_cast<float*>(rstd.data()));
          KILN_CUDA_LAUNCH_CHECK();
        };
        with_packs_per_lane<8>(packs_per_lane, launch);
      }
    }
    if (!packed) {
      layernorm_forward_kernel<T, C><<<blocks, kRowsPerBlock * kWarp, 0, stream>>>(
          static_cast<const T*>(x.data()), d, static_cast<const C*>(weight.data()),
          centered ? static_cast<const C*>(bias.data()) : nullptr, static_cast<C>(eps), rows, cols,
          static_cast<T*>(y.data()), h, static_cast<C*>(mean.data()), static_cast<C*>(rstd.data()));
      KILN_CUDA_LAUNCH_CHECK();
    }
  });
}

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, const Tensor& residual_grad, Tensor& dx,
                        Tensor& dweight, Tensor& dbias, bool accumulate) {
  std::int64_t rows = x.size(0), cols = x.size(1);
  cudaStream_t stream = static_cast<cudaStream_t>(current_stream(x.device()));
  const bool centered = dbias.defined();
  if (rows == 0) {
    if (!accumulate) {
      dweight.zero();
      if (centered) dbias.zero();
    }
    return;
  }
  const bool has_residual = residual_grad.defined();
  // Half rows of 256, 512 or 768 columns (1024 would spill registers), 16-byte aligned: the packed
  // kernel.
  const std::int64_t packs_per_lane = cols / (kWarp * 8);
  const bool packed = is_half(x.dtype()) && dy.dtype() == x.dtype() && dx.dtype() == x.dtype() &&
                      cols % (kWarp * 8) == 0 && packs_per_lane >= 1 && packs_per_lane <= 3 &&
                      aligned16({x.data(), dy.data(), dx.data()}) &&
                      (!has_residual || aligned16({residual_grad.data()}));
  // Other half rows of 8k columns, 16-byte aligned: the same work in packs.
  const bool pack8 = !packed && is_half(x.dtype()) && dy.dtype() == x.dtype() &&
                     dx.dtype() == x.dtype() && cols % 8 == 0 &&
                     aligned16({x.data(), dy.data(), dx.data(), weight.data()}) &&
                     (!has_residual || aligned16({residual_grad.data()}));
  const std::int64_t rows_per_chunk = packed ? kPackedRowsPerChunk : kRowsPerChunk;
  std::int64_t chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
  // The weight's partials, then the bias's: one column-sum launch adds both.
  Tensor partials = Tensor::empty({2, chunks, cols}, dweight.dtype(), x.device());
  if (pack8) {
    auto launch = [&](auto half) {
      using H = decltype(half);
      layernorm_backward_pack8_kernel<H><<<static_cast<unsigned>(chunks), 256, 0, stream>>>(
          static_cast<const H*>(dy.data()), static_cast<const H*>(x.data()),
          static_cast<const float*>(weight.data()), static_cast<const float*>(mean.data()),
          static_cast<const float*>(rstd.data()),
          has_residual ? static_cast<const H*>(residual_grad.data()) : nullptr, centered, rows,
          cols, static_cast<H*>(dx.data()), static_cast<float*>(partials.data()),
          static_cast<float*>(partials.data()) + chunks * cols);
      KILN_CUDA_LAUNCH_CHECK();
    };
    if (x.dtype() == DType::BF16) {
      launch(__nv_bfloat16());
    } else {
      launch(__half());
    }
  }
  KILN_CUDA_DISPATCH_FLOATING(x.dtype(), T, {
    using C = typename Compute<T>::type;
    const T* rg = has_residual ? static_cast<const T*>(residual_grad.data()) : nullptr;
    C* dw_partial = static_cast<C*>(partials.data());
    C* db_partial = dw_partial + chunks * cols;
    if constexpr (sizeof(T) == 2) {
      if (packed) {
        auto launch = [&](auto p) {
          layernorm_backward_packed_kernel<T, decltype(p)::value>
              <<<static_cast<unsigned>(chunks), kRowsPerBlock * kWarp, 0, stream>>>(
                  static_cast<const T*>(dy.data()), static_cast<const T*>(x.data()),
                  static_cast<const float*>(weight.data()), static_cast<const float*>(mean.data()),
                  static_cast<const float*>(rstd.data()), rg, centered, rows,
                  static_cast<T*>(dx.data()), static_cast<float*>(partials.data()),
                  static_cast<float*>(partials.data()) + chunks * cols);
          KILN_CUDA_LAUNCH_CHECK();
        };
        with_packs_per_lane<3>(packs_per_lane, launch);
      }
    }
    if (!packed && !pack8) {
      layernorm_backward_kernel<T, C><<<static_cast<unsigned>(chunks), 256, 0, stream>>>(
          static_cast<const T*>(dy.data()), static_cast<const T*>(x.data()),
          static_cast<const C*>(weight.data()), static_cast<const C*>(mean.data()),
          static_cast<const C*>(rstd.data()), rg, centered, rows, cols, static_cast<T*>(dx.data()),
          dw_partial, db_partial);
      KILN_CUDA_LAUNCH_CHECK();
    }
    layernorm_param_grads_kernel<C>
        <<<dim3(column_sums_grid(cols).x, centered ? 2 : 1), column_sums_block(), 0, stream>>>(
            dw_partial, chunks, cols, accumulate, static_cast<C*>(dweight.data()),
            centered ? static_cast<C*>(dbias.data()) : nullptr);
    KILN_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace kiln::cuda
