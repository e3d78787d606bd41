// Attention kernels: the fused masked softmax (+ dropout) over rows of scores, one warp per row,
// fp32 math (f64 for f64); its backward regenerating the dropout mask from Philox; and the
// elementwise helpers the transformer layers share (bias add).

#include <algorithm>
#include <cmath>

#include "core/cuda/cuda_check.h"
#include "core/cuda/element.cuh"
#include "core/stream.h"
#include "layers/cuda/attention_cuda.h"
#include "layers/cuda/column_sums.cuh"
#include "layers/dropout.h"

namespace kiln::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kRowsPerBlock = 8;

cudaStream_t stream_of(const Tensor& t) {
  return static_cast<cudaStream_t>(current_stream(t.device()));
}

template <typename C>
__device__ __forceinline__ C warp_sum(C v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

template <typename C>
__device__ __forceinline__ C warp_max(C v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    v = max(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

template <typename T, typename B>
__global__ void add_bias_kernel(T* __restrict__ y, const B* __restrict__ bias, std::int64_t rows,
                                std::int64_t cols) {
  // Rows over blocks, columns over threads: no per-element division.
  using C = typename Compute<T>::type;
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    T* row = y + r * cols;
    for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x)
      row[c] = store<T>(static_cast<C>(load(row[c])) + static_cast<C>(load(bias[c])));
  }
}

// Head layout changes: block x = token row n = b*T + t, block y = part; threads over the E
// columns of that part (col = head*d + dd), so reads and writes are contiguous runs of d.
template <typename T>
__global__ void to_heads_kernel(const T* __restrict__ src, int parts, int t, int h, int d,
                                T* __restrict__ out) {
  std::int64_t n = blockIdx.x;
  int part = blockIdx.y, e = h * d;
  std::int64_t b = n / t, tt = n % t, bh_total = (gridDim.x / t) * h;
  const T* row = src + (n * parts + part) * e;
  for (int col = threadIdx.x; col < e; col += blockDim.x) {
    int head = col / d, dd = col % d;
    out[((part * bh_total + b * h + head) * t + tt) * d + dd] = row[col];
  }
}

template <typename T>
__global__ void from_heads_kernel(const T* __restrict__ src, int parts, int t, int h, int d,
                                  T* __restrict__ out) {
  std::int64_t n = blockIdx.x;
  int part = blockIdx.y, e = h * d;
  std::int64_t b = n / t, tt = n % t, bh_total = (gridDim.x / t) * h;
  T* row = out + (n * parts + part) * e;
  for (int col = threadIdx.x; col < e; col += blockDim.x) {
    int head = col / d, dd = col % d;
    row[col] = src[((part * bh_total + b * h + head) * t + tt) * d + dd];
  }
}

// Column sums of dy (rows, cols) in two deterministic passes: per chunk of rows, then over the
// chunks in order, added into the bias gradient. (One thread per column over every row leaves
// most of the GPU idle when there are few columns.)
constexpr std::int64_t kBiasRowsPerChunk = 64;

template <typename T, typename C>
__global__ void column_partial_sums_kernel(const T* __restrict__ dy, std::int64_t rows,
                                           std::int64_t cols, C* __restrict__ partial) {
  std::int64_t col = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  std::int64_t first = static_cast<std::int64_t>(blockIdx.y) * kBiasRowsPerChunk;
  std::int64_t last = min(first + kBiasRowsPerChunk, rows);
  C sum = 0;
  for (std::int64_t r = first; r < last; ++r) sum += static_cast<C>(load(dy[r * cols + col]));
  partial[blockIdx.y * cols + col] = sum;
}

// One warp per row of scores (BH, Tq, Tk); row r is query r % tq of batch r / (heads * tq).
// Causal rows see keys j < tk - tq + r % tq + 1 (bottom-right aligned, as the CPU loops).
template <typename S, typename T>
__global__ void softmax_forward_kernel(const S* __restrict__ scores, const float* __restrict__ mask,
                                       std::int64_t rows, std::int64_t tq, std::int64_t tk,
                                       std::int64_t heads, bool causal,
                                       const std::int32_t* __restrict__ starts, double p,
                                       std::uint64_t key, std::uint64_t stream_value,
                                       const std::uint64_t* __restrict__ stream_source,
                                       T* __restrict__ probs, T* __restrict__ dropped) {
  std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  int lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  const S* s = scores + row * tk;
  const float* m = mask ? mask + (row / (heads * tq)) * tk : nullptr;
  const std::int64_t visible = causal ? min(tk, tk - tq + row % tq + 1) : tk;
  const std::int64_t first = starts ? starts[(row / (heads * tq)) * tq + row % tq] : 0;
  auto attended = [&](std::int64_t j) { return j >= first && j < visible && (!m || m[j] != 0.0f); };
  S row_max = -INFINITY;
  for (std::int64_t j = lane; j < tk; j += kWarp)
    if (attended(j)) row_max = max(row_max, s[j]);
  row_max = warp_max(row_max);
  S sum = 0;
  for (std::int64_t j = lane; j < tk; j += kWarp)
    if (attended(j)) sum += exp(s[j] - row_max);
  sum = warp_sum(sum);
  S scale = static_cast<S>(1.0 / (1.0 - p));
  const std::uint64_t stream =
      dropped != nullptr && stream_source != nullptr ? *stream_source : stream_value;
  for (std::int64_t j = lane; j < tk; j += kWarp) {
    S prob = (sum > 0 && attended(j)) ? exp(s[j] - row_max) / sum : S(0);
    probs[row * tk + j] = store<T>(prob);
    if (dropped) {
      bool keep = dropout_keep(key, stream, static_cast<std::uint64_t>(row * tk + j), p);
      dropped[row * tk + j] = store<T>(keep ? prob * scale : S(0));
    }
  }
}

template <typename S, typename T>
__global__ void softmax_backward_kernel(const S* __restrict__ d_dropped,
                                        const T* __restrict__ probs, std::int64_t rows,
                                        std::int64_t t, double p, bool dropout, std::uint64_t key,
                                        std::uint64_t stream_value,
                                        const std::uint64_t* __restrict__ stream_source,
                                        T* __restrict__ dscores) {
  std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  int lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  S scale = static_cast<S>(1.0 / (1.0 - p));
  const std::uint64_t stream = dropout && stream_source != nullptr ? *stream_source : stream_value;
  S dot = 0;
  for (std::int64_t j = lane; j < t; j += kWarp) {
    std::int64_t i = row * t + j;
    S d = d_dropped[i];
    if (dropout) d = dropout_keep(key, stream, static_cast<std::uint64_t>(i), p) ? d * scale : S(0);
    dot += d * static_cast<S>(load(probs[i]));
  }
  dot = warp_sum(dot);
  for (std::int64_t j = lane; j < t; j += kWarp) {
    std::int64_t i = row * t + j;
    S d = d_dropped[i];
    if (dropout) d = dropout_keep(key, stream, static_cast<std::uint64_t>(i), p) ? d * scale : S(0);
    S prob = static_cast<S>(load(probs[i]));
    dscores[i] = store<T>(prob * (d - dot));
  }
}

}  // namespace

void add_bias(Tensor& y, const Tensor& bias) {
  std::int64_t rows = y.size(0), cols = y.size(1);
  if (rows * cols == 0) return;
  KILN_CUDA_DISPATCH_FLOATING(y.dtype(), T, {
    KILN_CUDA_DISPATCH_FLOATING(bias.dtype(), B, {
      add_bias_kernel<T, B><<<grid_for(rows, 1), 256, 0, stream_of(y)>>>(
          static_cast<T*>(y.data()), static_cast<const B*>(bias.data()), rows, cols);
      KILN_CUDA_LAUNCH_CHECK();
    });
  });
}

void to_heads(const Tensor& src, std::int64_t parts, std::int64_t b, std::int64_t t, std::int64_t h,
              std::int64_t d, Tensor& out) {
  if (b * t * h * d == 0) return;
  dim3 grid(static_cast<unsigned>(b * t), static_cast<unsigned>(parts));
  int threads = static_cast<int>(std::min<std::int64_t>(256, ((h * d + 31) / 32) * 32));
  KILN_CUDA_DISPATCH_FLOATING(src.dtype(), T, {
    to_heads_kernel<T><<<grid, threads, 0, stream_of(src)>>>(
        static_cast<const T*>(src.data()), static_cast<int>(parts), static_cast<int>(t),
        static_cast<int>(h), static_cast<int>(d), static_cast<T*>(out.data()));
    KILN_CUDA_LAUNCH_CHECK();
  });
}

void from_heads(const Tensor& src, std::int64_t parts, std::int64_t b, std::int64_t t,
                std::int64_t h, std::int64_t d, Tensor& out) {
  if (b * t * h * d == 0) return;
  dim3 grid(static_cast<unsigned>(b * t), static_cast<unsigned>(parts));
  int threads = static_cast<int>(std::min<std::int64_t>(256, ((h * d + 31) / 32) * 32));
  KILN_CUDA_DISPATCH_FLOATING(src.dtype(), T, {
    from_heads_kernel<T><<<grid, threads, 0, stream_of(src)>>>(
        static_cast<const T*>(src.data()), static_cast<int>(parts), static_cast<int>(t),
        static_cast<int>(h), static_cast<int>(d), static_cast<T*>(out.data()));
    KILN_CUDA_LAUNCH_CHECK();
  });
}

void accumulate_bias_grad(const Tensor& dy, Tensor& bias_grad) {
  std::int64_t cols = bias_grad.numel(), rows = cols == 0 ? 0 : dy.numel() / cols;
  if (rows == 0 || cols == 0) return;
  std::int64_t chunks = (rows + kBiasRowsPerChunk - 1) / kBiasRowsPerChunk;
  unsigned column_blocks = static_cast<unsigned>((cols + 255) / 256);
  DType wide = dy.dtype() == DType::F64 ? DType::F64 : DType::F32;
  Tensor partial = Tensor::empty({chunks, cols}, wide, dy.device());
  KILN_CUDA_DISPATCH_FLOATING(dy.dtype(), T, {
    using C = typename Compute<T>::type;
    column_partial_sums_kernel<T, C>
        <<<dim3(column_blocks, static_cast<unsigned>(chunks)), 256, 0, stream_of(dy)>>>(
            static_cast<const T*>(dy.data()), rows, cols, static_cast<C*>(partial.data()));
    KILN_CUDA_LAUNCH_CHECK();
    KILN_CUDA_DISPATCH_FLOATING(bias_grad.dtype(), G, {
      column_sums_kernel<C, G><<<column_sums_grid(cols), column_sums_block(), 0, stream_of(dy)>>>(
          static_cast<const C*>(partial.data()), chunks, cols, true,
          static_cast<G*>(bias_grad.data()));
      KILN_CUDA_LAUNCH_CHECK();
    });
  });
}

void attention_softmax_forward(const Tensor& scores, const Tensor& mask, std::int64_t heads,
                               bool causal, const Tensor& document_starts, double p,
                               std::uint64_t key, std::uint64_t stream,
                               const std::uint64_t* stream_source, Tensor& probs,
                               Tensor& dropped_probs) {
  std::int64_t tq = scores.size(1), tk = scores.size(2), rows = scores.size(0) * tq;
  if (rows == 0) return;
  unsigned blocks = static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
  const float* m = mask.defined() ? static_cast<const float*>(mask.data()) : nullptr;
  KILN_CUDA_DISPATCH_FLOATING(probs.dtype(), T, {
    using S = typename Compute<T>::type;
    softmax_forward_kernel<S, T><<<blocks, kRowsPerBlock * kWarp, 0, stream_of(scores)>>>(
        static_cast<const S*>(scores.data()), m, rows, tq, tk, heads, causal,
        document_starts.defined() ? static_cast<const std::int32_t*>(document_starts.data())
                                  : nullptr,
        p, key, stream, stream_source, static_cast<T*>(probs.data()),
        dropped_probs.defined() ? static_cast<T*>(dropped_probs.data()) : nullptr);
    KILN_CUDA_LAUNCH_CHECK();
  });
}

void attention_softmax_backward(const Tensor& d_dropped, const Tensor& probs, double p,
                                std::uint64_t key, std::uint64_t stream,
                                const std::uint64_t* stream_source, Tensor& dscores) {
  std::int64_t t = probs.size(2), rows = probs.size(0) * probs.size(1);
  if (rows == 0) return;
  unsigned blocks = static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
  KILN_CUDA_DISPATCH_FLOATING(probs.dtype(), T, {
    using S = typename Compute<T>::type;
    softmax_backward_kernel<S, T><<<blocks, kRowsPerBlock * kWarp, 0, stream_of(probs)>>>(
        static_cast<const S*>(d_dropped.data()), static_cast<const T*>(probs.data()), rows, t, p,
        p > 0.0, key, stream, stream_source, static_cast<T*>(dscores.data()));
    KILN_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace kiln::cuda
