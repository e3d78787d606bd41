// BatchNorm2d on CUDA with fp32 statistics: per-channel sums in two levels (blocks write partial
// sums per chunk of the batch, a per-channel kernel finishes them), then an elementwise pass.
// One pass over x gives the statistics: the sums of d = x - K and d^2 with K the channel's first
// value (a sample of the channel's own distribution), so that var = E[d^2] - E[d]^2 does not
// cancel away as E[x^2] - mean^2 does for a mean far from 0.
// A fused ReLU (BatchNorm2d::set_fused_relu) is applied to the stored output; backward recomputes
// that output from x with the same roundings instead of reading it, so its mask is forward's.

#include <cstdint>
#include <initializer_list>

#include "core/cuda/cuda_check.h"
#include "core/cuda/element.cuh"
#include "core/stream.h"
#include "layers/cuda/batchnorm_cuda.h"
#include "layers/cuda/column_sums.cuh"

namespace kiln::batchnorm_cuda {
namespace {

// Element (o, c, i) of a physical tensor is at (o * C + c) * inner + i (NCHW: outer = N,
// inner = H*W; NHWC: outer = N*H*W, inner = 1).
struct Layout {
  std::int64_t outer, channels, inner;
};

enum class Sum { Shifted, Gradient };

// What backward needs to recompute a fused ReLU's mask; weight null: no ReLU.
struct FusedRelu {
  const float* weight = nullptr;
  const float* bias = nullptr;
  const float* invstd = nullptr;
};

// The normalised value before the ReLU, with explicit roundings (no contraction that could differ
// between the forward and the backward kernels).
__device__ __forceinline__ float normalized(float v, float mean, float scale, float bias) {
  return __fmaf_rn(__fsub_rn(v, mean), scale, bias);
}

__device__ __forceinline__ float scale_of(const float* invstd, const float* weight,
                                          std::int64_t c) {
  return __fmul_rn(invstd[c], weight[c]);
}

// The stored output, after the ReLU when fused: the ReLU layer's rule on the stored value.
template <typename T>
__device__ __forceinline__ T output_of(float v, float mean, float scale, float bias, bool relu) {
  T y = cuda::store<T>(normalized(v, mean, scale, bias));
  return relu && !(static_cast<float>(cuda::load(y)) > 0.f) ? cuda::store<T>(0.f) : y;
}

// Whether a fused ReLU let v through in forward, given its channel's coefficients.
template <typename T>
__device__ __forceinline__ bool passes(float v, float mean, float scale, float bias) {
  T y = cuda::store<T>(normalized(v, mean, scale, bias));
  return static_cast<float>(cuda::load(y)) > 0.f;
}

template <typename T>
__device__ __forceinline__ bool relu_passes(const FusedRelu& r, float v, float mean,
                                            std::int64_t c) {
  return r.weight == nullptr || passes<T>(v, mean, scale_of(r.invstd, r.weight, c), r.bias[c]);
}

// V per-channel floats from c0 (for V a multiple of 4: c0 too, and the array 16-byte aligned).
template <int V>
__device__ __forceinline__ void load_channels(const float* p, std::uint32_t c0, float (&out)[V]) {
  if constexpr (V % 4 == 0) {
#pragma unroll
    for (int k = 0; k < V; k += 4) {
      const float4 f = *reinterpret_cast<const float4*>(p + c0 + k);
      out[k] = f.x, out[k + 1] = f.y, out[k + 2] = f.z, out[k + 3] = f.w;
    }
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) out[k] = p[c0 + k];
  }
}

constexpr int kPlaneThreads = 256;
constexpr int kRowChannels = 32, kRowThreads = 8;

template <Sum kind, typename T>
__device__ __forceinline__ void accumulate(const T* x, const T* dy, std::int64_t idx, float mean,
                                           const FusedRelu& relu, std::int64_t c, float& s0,
                                           float& s1) {
  float v = static_cast<float>(cuda::load(x[idx]));
  if (kind == Sum::Shifted) {  // `mean` is the shift K
    const float d = v - mean;
    s0 += d;
    s1 += d * d;
  } else {
    float g = relu_passes<T>(relu, v, mean, c) ? static_cast<float>(cuda::load(dy[idx])) : 0.f;
    s0 += g;
    s1 += g * (v - mean);
  }
}

// inner > 1 (NCHW): block (channel, chunk of the N*H*W elements of that channel).
template <Sum kind, typename T>
__global__ void plane_sums_kernel(const T* x, const T* dy, const float* mean, FusedRelu relu,
                                  Layout l, float* part0, float* part1) {
  const std::int64_t c = blockIdx.x, chunk = blockIdx.y, chunks = gridDim.y;
  const std::int64_t count = l.outer * l.inner, per = (count + chunks - 1) / chunks;
  const std::int64_t begin = chunk * per, end = begin + per < count ? begin + per : count;
  const float m = kind == Sum::Shifted ? static_cast<float>(cuda::load(x[c * l.inner])) : mean[c];
  float s0 = 0.f, s1 = 0.f;
  for (std::int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) {
    std::int64_t o = j / l.inner, i = j - o * l.inner;
    accumulate<kind>(x, dy, (o * l.channels + c) * l.inner + i, m, relu, c, s0, s1);
  }
  __shared__ float r0[kPlaneThreads], r1[kPlaneThreads];
  r0[threadIdx.x] = s0;
  r1[threadIdx.x] = s1;
  __syncthreads();
  for (int stride = kPlaneThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      r0[threadIdx.x] += r0[threadIdx.x + stride];
      r1[threadIdx.x] += r1[threadIdx.x + stride];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    part0[chunk * l.channels + c] = r0[0];
    part1[chunk * l.channels + c] = r1[0];
  }
}

// inner == 1 (NHWC): block (32 neighbouring channels, chunk of rows); reads are coalesced.
template <Sum kind, typename T>
__global__ void row_sums_kernel(const T* x, const T* dy, const float* mean, FusedRelu relu,
                                Layout l, float* part0, float* part1) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * kRowChannels + threadIdx.x;
  const std::int64_t chunk = blockIdx.y, chunks = gridDim.y;
  const std::int64_t per = (l.outer + chunks - 1) / chunks;
  const std::int64_t begin = chunk * per, end = begin + per < l.outer ? begin + per : l.outer;
  float s0 = 0.f, s1 = 0.f;
  if (c < l.channels) {
    const float m = kind == Sum::Shifted ? static_cast<float>(cuda::load(x[c])) : mean[c];
    for (std::int64_t r = begin + threadIdx.y; r < end; r += kRowThreads) {
      accumulate<kind>(x, dy, r * l.channels + c, m, relu, c, s0, s1);
    }
  }
  __shared__ float r0[kRowThreads][kRowChannels + 1], r1[kRowThreads][kRowChannels + 1];
  r0[threadIdx.y][threadIdx.x] = s0;
  r1[threadIdx.y][threadIdx.x] = s1;
  __syncthreads();
  if (threadIdx.y == 0 && c < l.channels) {
    float t0 = 0.f, t1 = 0.f;
    for (int k = 0; k < kRowThreads; ++k) {
      t0 += r0[k][threadIdx.x];
      t1 += r1[k][threadIdx.x];
    }
    part0[chunk * l.channels + c] = t0;
    part1[chunk * l.channels + c] = t1;
  }
}

// inner == 1 (NHWC) with whole 16-byte packs of channels per row: thread (x: one pack of
// channels, y: every blockDim.y-th row of the chunk); the block then sums its rows per channel.
template <Sum kind, typename T>
__global__ void row_pack_sums_kernel(const T* x, const T* dy, const float* mean, FusedRelu relu,
                                     Layout l, float* part0, float* part1) {
  constexpr int V = cuda::Pack<T>::kSize;
  const std::int64_t packs_per_row = l.channels / V;
  const std::int64_t p = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t chunk = blockIdx.y, chunks = gridDim.y;
  const std::int64_t per = (l.outer + chunks - 1) / chunks;
  const std::int64_t begin = chunk * per, end = begin + per < l.outer ? begin + per : l.outer;
  float s0[V], s1[V], m[V], rs[V], rb[V];
#pragma unroll
  for (int k = 0; k < V; ++k) s0[k] = s1[k] = m[k] = rs[k] = rb[k] = 0.f;
  if (p < packs_per_row) {
    // This thread's channels are fixed: their shift (or mean) and ReLU coefficients load once.
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const std::int64_t c = p * V + k;
      m[k] = kind == Sum::Shifted ? static_cast<float>(cuda::load(x[c])) : mean[c];
      if (relu.weight != nullptr)
        rs[k] = scale_of(relu.invstd, relu.weight, c), rb[k] = relu.bias[c];
    }
    const auto* xp = reinterpret_cast<const cuda::Pack<T>*>(x);
    const auto* gp = reinterpret_cast<const cuda::Pack<T>*>(dy);
    for (std::int64_t r = begin + threadIdx.y; r < end; r += blockDim.y) {
      cuda::Pack<T> xv = xp[r * packs_per_row + p];
      if (kind == Sum::Gradient) {
        cuda::Pack<T> gv = gp[r * packs_per_row + p];
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float v = static_cast<float>(cuda::load(xv.v[k]));
          const float g = relu.weight == nullptr || passes<T>(v, m[k], rs[k], rb[k])
                              ? static_cast<float>(cuda::load(gv.v[k]))
                              : 0.f;
          s0[k] += g;
          s1[k] += g * (v - m[k]);
        }
      } else {
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float d = static_cast<float>(cuda::load(xv.v[k])) - m[k];
          s0[k] += d;
          s1[k] += d * d;
        }
      }
    }
  }
  extern __shared__ float rows[];  // [2][blockDim.y][blockDim.x * V]
  const int width = blockDim.x * V;
  float* r0 = rows;
  float* r1 = rows + blockDim.y * width;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    r0[threadIdx.y * width + threadIdx.x * V + k] = s0[k];
    r1[threadIdx.y * width + threadIdx.x * V + k] = s1[k];
  }
  __syncthreads();
  for (int col = threadIdx.y * blockDim.x + threadIdx.x; col < width;
       col += blockDim.x * blockDim.y) {
    const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * width + col;
    if (c >= l.channels) continue;
    float t0 = 0.f, t1 = 0.f;
    for (unsigned y = 0; y < blockDim.y; ++y) {
      t0 += r0[y * width + col];
      t1 += r1[y * width + col];
    }
    part0[chunk * l.channels + c] = t0;
    part1[chunk * l.channels + c] = t1;
  }
}

// The sum over chunks of part[k * channels + c] for this block's channel c: a block is 32
// channels x 32 threads striding over the chunks, then a fixed-order sum of the 32 (deterministic;
// one thread per channel over ~1000 chunks left the GPU idle). The total is valid in threadIdx.y 0.
__device__ __forceinline__ float chunk_total(const float* part, int chunks, std::int64_t channels) {
  __shared__ float sums[cuda::kColumnSumThreads][cuda::kColumnSumColumns + 1];
  const std::int64_t c =
      static_cast<std::int64_t>(blockIdx.x) * cuda::kColumnSumColumns + threadIdx.x;
  float s = 0.f;
  if (c < channels) {
    for (int k = threadIdx.y; k < chunks; k += cuda::kColumnSumThreads) s += part[k * channels + c];
  }
  __syncthreads();  // the readers of a previous call are done
  sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  float total = 0.f;
  if (threadIdx.y == 0) {
    for (int k = 0; k < cuda::kColumnSumThreads; ++k) total += sums[k][threadIdx.x];
  }
  return total;
}

__device__ __forceinline__ std::int64_t finalize_channel() {
  return static_cast<std::int64_t>(blockIdx.x) * cuda::kColumnSumColumns + threadIdx.x;
}

// Mean and 1/std from the shifted sums (shift: the channel's first value, element c * inner),
// and the running statistics' update.
template <typename T>
__global__ void finalize_stats_kernel(const float* part0, const float* part1, int chunks,
                                      std::int64_t channels, const T* x, std::int64_t inner,
                                      float count, float eps, float momentum, bool update,
                                      float* mean, float* invstd, float* running_mean,
                                      float* running_var) {
  const float s = chunk_total(part0, chunks, channels);
  const float q = chunk_total(part1, chunks, channels);
  const std::int64_t c = finalize_channel();
  if (threadIdx.y != 0 || c >= channels) return;
  const float d = s / count;
  const float m = static_cast<float>(cuda::load(x[c * inner])) + d;
  const float var = fmaxf(q / count - d * d, 0.f);
  mean[c] = m;
  invstd[c] = rsqrtf(var + eps);
  if (update) {
    running_mean[c] = (1.f - momentum) * running_mean[c] + momentum * m;
    running_var[c] = (1.f - momentum) * running_var[c] + momentum * var * count / (count - 1.f);
  }
}

__global__ void inference_invstd_kernel(const float* running_var, std::int64_t channels, float eps,
                                        float* invstd) {
  std::int64_t c = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (c < channels) invstd[c] = rsqrtf(running_var[c] + eps);
}

// Parameter gradients (+=) and the two per-channel terms of dx.
__global__ void finalize_backward_kernel(const float* part0, const float* part1, int chunks,
                                         std::int64_t channels, float count, bool batch_stats,
                                         const float* invstd, float* dweight, float* dbias,
                                         float* mean_dy, float* mean_dy_xhat) {
  const float s_dy = chunk_total(part0, chunks, channels);
  const float s_dy_xmu = chunk_total(part1, chunks, channels);
  const std::int64_t c = finalize_channel();
  if (threadIdx.y != 0 || c >= channels) return;
  float s_dy_xhat = s_dy_xmu * invstd[c];
  dbias[c] += s_dy;
  dweight[c] += s_dy_xhat;
  mean_dy[c] = batch_stats ? s_dy / count : 0.f;
  mean_dy_xhat[c] = batch_stats ? s_dy_xhat / count : 0.f;
}

template <typename T>
__global__ void normalize_kernel(const T* x, const float* mean, const float* invstd,
                                 const float* weight, const float* bias, bool relu, Layout l,
                                 std::int64_t n, T* y) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t c = (i / l.inner) % l.channels;
    y[i] = output_of<T>(static_cast<float>(cuda::load(x[i])), mean[c], scale_of(invstd, weight, c),
                        bias[c], relu);
  }
}

template <typename T>
__global__ void backward_dx_kernel(const T* x, const T* dy, const float* mean, const float* invstd,
                                   const float* weight, const float* mean_dy,
                                   const float* mean_dy_xhat, FusedRelu relu, Layout l,
                                   std::int64_t n, T* dx) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t c = (i / l.inner) % l.channels;
    const float v = static_cast<float>(cuda::load(x[i]));
    float xhat = (v - mean[c]) * invstd[c];
    float g = relu_passes<T>(relu, v, mean[c], c) ? static_cast<float>(cuda::load(dy[i])) : 0.f;
    dx[i] = cuda::store<T>(weight[c] * invstd[c] * (g - mean_dy[c] - xhat * mean_dy_xhat[c]));
  }
}

// NHWC with whole packs of channels per row: the channel of a pack is its index modulo the
// packs per row (32-bit: a tensor of 2^32 packs would be 64 GiB).
template <typename T>
__global__ void normalize_rows_kernel(const cuda::Pack<T>* x, const float* mean,
                                      const float* invstd, const float* weight, const float* bias,
                                      bool relu, std::uint32_t packs_per_row, std::uint32_t packs,
                                      cuda::Pack<T>* y) {
  constexpr int V = cuda::Pack<T>::kSize;
  for (std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < packs;
       i += gridDim.x * blockDim.x) {
    const std::uint32_t c0 = (i % packs_per_row) * V;
    cuda::Pack<T> p = x[i];
    float mv[V], iv[V], wv[V], bv[V];
    load_channels(mean, c0, mv);
    load_channels(invstd, c0, iv);
    load_channels(weight, c0, wv);
    load_channels(bias, c0, bv);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      p.v[k] = output_of<T>(static_cast<float>(cuda::load(p.v[k])), mv[k], __fmul_rn(iv[k], wv[k]),
                            bv[k], relu);
    }
    y[i] = p;
  }
}

template <typename T>
__global__ void backward_dx_rows_kernel(const cuda::Pack<T>* x, const cuda::Pack<T>* dy,
                                        const float* mean, const float* invstd, const float* weight,
                                        const float* mean_dy, const float* mean_dy_xhat,
                                        FusedRelu relu, std::uint32_t packs_per_row,
                                        std::uint32_t packs, cuda::Pack<T>* dx) {
  constexpr int V = cuda::Pack<T>::kSize;
  for (std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < packs;
       i += gridDim.x * blockDim.x) {
    const std::uint32_t c0 = (i % packs_per_row) * V;
    cuda::Pack<T> xv = x[i], g = dy[i];
    float mv[V], iv[V], wv[V], av[V], bv[V], rb[V];
    load_channels(mean, c0, mv);
    load_channels(invstd, c0, iv);
    load_channels(weight, c0, wv);
    load_channels(mean_dy, c0, av);
    load_channels(mean_dy_xhat, c0, bv);
    if (relu.weight != nullptr) load_channels(relu.bias, c0, rb);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float v = static_cast<float>(cuda::load(xv.v[k]));
      float xhat = (v - mv[k]) * iv[k];
      const bool pass =
          relu.weight == nullptr || passes<T>(v, mv[k], __fmul_rn(iv[k], wv[k]), rb[k]);
      float gk = pass ? static_cast<float>(cuda::load(g.v[k])) : 0.f;
      g.v[k] = cuda::store<T>(wv[k] * iv[k] * (gk - av[k] - xhat * bv[k]));
    }
    dx[i] = g;
  }
}

// Whether `l` is NHWC with whole 16-byte packs per row and the tensors allow pack access.
template <typename T>
bool packed_rows(const Layout& l, std::initializer_list<const void*> pointers) {
  constexpr int V = cuda::Pack<T>::kSize;
  return l.inner == 1 && l.channels % V == 0 && cuda::aligned16(pointers) &&
         l.outer * l.channels / V < (std::int64_t{1} << 32);
}

Layout layout_of(const Tensor& physical, bool channels_last) {
  KILN_CHECK(physical.dim() == 4 && physical.is_contiguous(),
             "batchnorm_cuda: expected a contiguous 4-D tensor, got " + physical.str());
  if (channels_last) {
    return Layout{physical.size(0) * physical.size(1) * physical.size(2), physical.size(3), 1};
  }
  return Layout{physical.size(0), physical.size(1), physical.size(2) * physical.size(3)};
}

void check_channel_vector(const Tensor& t, std::int64_t channels, const char* what) {
  KILN_CHECK(
      t.dtype() == DType::F32 && t.numel() == channels && t.is_contiguous() && t.device().is_cuda(),
      std::string("batchnorm_cuda: ") + what + " must be f32 (" + std::to_string(channels) +
          ") on CUDA, got " + t.str());
}

int chunks_for(const Layout& l) {
  std::int64_t work = l.inner == 1 ? l.outer / 64 : l.outer * l.inner / 4096;
  return static_cast<int>(work < 1 ? 1 : (work > 1024 ? 1024 : work));
}

unsigned channel_blocks(std::int64_t channels) {
  return static_cast<unsigned>((channels + 255) / 256);
}

// Partial sums of `kind` into part0 (and part1), (chunks, C) each.
template <Sum kind, typename T>
void launch_sums(const Tensor& x, const Tensor* dy, const float* mean, const FusedRelu& relu,
                 const Layout& l, int chunks, Tensor& part0, Tensor& part1, cudaStream_t stream) {
  const T* px = static_cast<const T*>(x.data());
  const T* pdy = dy ? static_cast<const T*>(dy->data()) : nullptr;
  float* p0 = static_cast<float*>(part0.data());
  float* p1 = static_cast<float*>(part1.data());
  if (packed_rows<T>(l, {px, pdy})) {
    constexpr int V = cuda::Pack<T>::kSize;
    const std::int64_t packs_per_row = l.channels / V;
    const unsigned bx = static_cast<unsigned>(packs_per_row < 32 ? packs_per_row : 32);
    const unsigned by = 256 / bx;
    dim3 grid(static_cast<unsigned>((packs_per_row + bx - 1) / bx), static_cast<unsigned>(chunks));
    std::size_t shared = 2 * sizeof(float) * by * bx * V;
    row_pack_sums_kernel<kind, T>
        <<<grid, dim3(bx, by), shared, stream>>>(px, pdy, mean, relu, l, p0, p1);
    KILN_CUDA_LAUNCH_CHECK();
    return;
  } else if (l.inner == 1) {
    dim3 grid(static_cast<unsigned>((l.channels + kRowChannels - 1) / kRowChannels),
              static_cast<unsigned>(chunks));
    row_sums_kernel<kind, T>
        <<<grid, dim3(kRowChannels, kRowThreads), 0, stream>>>(px, pdy, mean, relu, l, p0, p1);
  } else {
    dim3 grid(static_cast<unsigned>(l.channels), static_cast<unsigned>(chunks));
    plane_sums_kernel<kind, T><<<grid, kPlaneThreads, 0, stream>>>(px, pdy, mean, relu, l, p0, p1);
  }
  KILN_CUDA_LAUNCH_CHECK();
}

template <typename T>
void launch_normalize(const Tensor& x, const float* mean, const float* invstd, const Tensor& weight,
                      const Tensor& bias, bool relu, const Layout& l, Tensor& y,
                      cudaStream_t stream) {
  const std::int64_t n = x.numel();
  const T* px = static_cast<const T*>(x.data());
  T* py = static_cast<T*>(y.data());
  const float* pw = static_cast<const float*>(weight.data());
  const float* pb = static_cast<const float*>(bias.data());
  if (packed_rows<T>(l, {px, py, mean, invstd, pw, pb})) {
    const std::int64_t packs = n / cuda::Pack<T>::kSize;
    normalize_rows_kernel<T><<<cuda::grid_for(packs), 256, 0, stream>>>(
        reinterpret_cast<const cuda::Pack<T>*>(px), mean, invstd, pw, pb, relu,
        static_cast<std::uint32_t>(l.channels / cuda::Pack<T>::kSize),
        static_cast<std::uint32_t>(packs), reinterpret_cast<cuda::Pack<T>*>(py));
  } else {
    normalize_kernel<T>
        <<<cuda::grid_for(n), 256, 0, stream>>>(px, mean, invstd, pw, pb, relu, l, n, py);
  }
  KILN_CUDA_LAUNCH_CHECK();
}

}  // namespace

void forward_training(const Tensor& x, const Tensor& weight, const Tensor& bias, bool channels_last,
                      double eps, double momentum, bool update_running, Tensor& running_mean,
                      Tensor& running_var, Tensor& y, Tensor& save_mean, Tensor& save_invstd,
                      bool relu) {
  const Layout l = layout_of(x, channels_last);
  for (const Tensor* t : std::initializer_list<const Tensor*>{
           &weight, &bias, &running_mean, &running_var, &save_mean, &save_invstd}) {
    check_channel_vector(*t, l.channels, "a per-channel vector");
  }
  KILN_CHECK(y.shape() == x.shape() && y.dtype() == x.dtype() && y.is_contiguous(),
             "batchnorm_cuda: y " + y.str() + " for x " + x.str());
  const float count = static_cast<float>(l.outer * l.inner);
  const int chunks = chunks_for(l);
  cudaStream_t stream = static_cast<cudaStream_t>(current_stream(x.device()));
  Tensor part0 = Tensor::empty({chunks, l.channels}, DType::F32, x.device());
  Tensor part1 = Tensor::empty({chunks, l.channels}, DType::F32, x.device());
  float* mean = static_cast<float*>(save_mean.data());
  float* invstd = static_cast<float*>(save_invstd.data());
  KILN_CUDA_DISPATCH_FLOATING(x.dtype(), T, {
    launch_sums<Sum::Shifted, T>(x, nullptr, nullptr, {}, l, chunks, part0, part1, stream);
    finalize_stats_kernel<T>
        <<<cuda::column_sums_grid(l.channels), cuda::column_sums_block(), 0, stream>>>(
            static_cast<const float*>(part0.data()), static_cast<const float*>(part1.data()),
            chunks, l.channels, static_cast<const T*>(x.data()), l.inner, count,
            static_cast<float>(eps), static_cast<float>(momentum), update_running, mean, invstd,
            static_cast<float*>(running_mean.data()), static_cast<float*>(running_var.data()));
    KILN_CUDA_LAUNCH_CHECK();
    launch_normalize<T>(x, mean, invstd, weight, bias, relu, l, y, stream);
  });
}

void forward_inference(const Tensor& x, const Tensor& weight, const Tensor& bias,
                       bool channels_last, double eps, const Tensor& running_mean,
                       const Tensor& running_var, Tensor& y, Tensor& save_invstd, bool relu) {
  const Layout l = layout_of(x, channels_last);
  for (const Tensor* t : std::initializer_list<const Tensor*>{&weight, &bias, &running_mean,
                                                              &running_var, &save_invstd}) {
    check_channel_vector(*t, l.channels, "a per-channel vector");
  }
  KILN_CHECK(y.shape() == x.shape() && y.dtype() == x.dtype() && y.is_contiguous(),
             "batchnorm_cuda: y " + y.str() + " for x " + x.str());
  cudaStream_t stream = static_cast<cudaStream_t>(current_stream(x.device()));
  float* invstd = static_cast<float*>(save_invstd.data());
  inference_invstd_kernel<<<channel_blocks(l.channels), 256, 0, stream>>>(
      static_cast<const float*>(running_var.data()), l.channels, static_cast<float>(eps), invstd);
  KILN_CUDA_LAUNCH_CHECK();
  KILN_CUDA_DISPATCH_FLOATING(x.dtype(), T, {
    launch_normalize<T>(x, static_cast<const float*>(running_mean.data()), invstd, weight, bias,
                        relu, l, y, stream);
  });
}

void backward(const Tensor& x, const Tensor& dy, const Tensor& weight, const Tensor& bias,
              const Tensor& mean, const Tensor& invstd, bool channels_last, bool batch_stats,
              bool relu, Tensor& dx, Tensor& dweight, Tensor& dbias) {
  const Layout l = layout_of(x, channels_last);
  for (const Tensor* t :
       std::initializer_list<const Tensor*>{&weight, &bias, &mean, &invstd, &dweight, &dbias}) {
    check_channel_vector(*t, l.channels, "a per-channel vector");
  }
  KILN_CHECK(dy.shape() == x.shape() && dy.dtype() == x.dtype() && dy.is_contiguous() &&
                 dx.shape() == x.shape() && dx.dtype() == x.dtype() && dx.is_contiguous(),
             "batchnorm_cuda::backward: x " + x.str() + ", dy " + dy.str() + ", dx " + dx.str());
  const std::int64_t n = x.numel();
  const float count = static_cast<float>(l.outer * l.inner);
  const int chunks = chunks_for(l);
  cudaStream_t stream = static_cast<cudaStream_t>(current_stream(x.device()));
  Tensor part0 = Tensor::empty({chunks, l.channels}, DType::F32, x.device());
  Tensor part1 = Tensor::empty({chunks, l.channels}, DType::F32, x.device());
  Tensor terms = Tensor::empty({2, l.channels}, DType::F32, x.device());
  float* mean_dy = static_cast<float*>(terms.data());
  float* mean_dy_xhat = mean_dy + l.channels;
  const float* pmean = static_cast<const float*>(mean.data());
  const float* pinvstd = static_cast<const float*>(invstd.data());
  FusedRelu fused;
  if (relu) {
    fused = FusedRelu{static_cast<const float*>(weight.data()),
                      static_cast<const float*>(bias.data()), pinvstd};
  }
  KILN_CUDA_DISPATCH_FLOATING(x.dtype(), T, {
    launch_sums<Sum::Gradient, T>(x, &dy, pmean, fused, l, chunks, part0, part1, stream);
    finalize_backward_kernel<<<cuda::column_sums_grid(l.channels), cuda::column_sums_block(), 0,
                               stream>>>(
        static_cast<const float*>(part0.data()), static_cast<const float*>(part1.data()), chunks,
        l.channels, count, batch_stats, pinvstd, static_cast<float*>(dweight.data()),
        static_cast<float*>(dbias.data()), mean_dy, mean_dy_xhat);
    KILN_CUDA_LAUNCH_CHECK();
    const T* px = static_cast<const T*>(x.data());
    const T* pdy = static_cast<const T*>(dy.data());
    T* pdx = static_cast<T*>(dx.data());
    const float* pw = static_cast<const float*>(weight.data());
    if (packed_rows<T>(l, {px, pdy, pdx, pmean, pinvstd, pw, mean_dy, mean_dy_xhat, bias.data()})) {
      const std::int64_t packs = n / cuda::Pack<T>::kSize;
      backward_dx_rows_kernel<T><<<cuda::grid_for(packs), 256, 0, stream>>>(
          reinterpret_cast<const cuda::Pack<T>*>(px), reinterpret_cast<const cuda::Pack<T>*>(pdy),
          pmean, pinvstd, pw, mean_dy, mean_dy_xhat, fused,
          static_cast<std::uint32_t>(l.channels / cuda::Pack<T>::kSize),
          static_cast<std::uint32_t>(packs), reinterpret_cast<cuda::Pack<T>*>(pdx));
    } else {
      backward_dx_kernel<T><<<cuda::grid_for(n), 256, 0, stream>>>(
          px, pdy, pmean, pinvstd, pw, mean_dy, mean_dy_xhat, fused, l, n, pdx);
    }
    KILN_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace kiln::batchnorm_cuda
