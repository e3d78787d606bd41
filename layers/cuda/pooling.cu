// Pooling on CUDA: one thread per output element forward, one per input element backward (a
// gather over the windows covering it: no atomics, deterministic), in NCHW or NHWC. Index
// arithmetic is 32-bit when the tensors allow it.

#include "core/cuda/cuda_check.h"
#include "core/cuda/element.cuh"
#include "core/stream.h"
#include "layers/cuda/pooling_cuda.h"

namespace kiln::pooling_cuda {
namespace {

template <typename I>
struct Index {
  I n, c, h, w;
};

// Splits a linear index of a (hh, ww) plane tensor in g's memory order.
template <typename I>
__device__ __forceinline__ Index<I> split(const PoolGeometry& g, I i, I hh, I ww) {
  const I channels = static_cast<I>(g.channels);
  Index<I> x;
  if (g.channels_last) {
    x.c = i % channels;
    i /= channels;
    x.w = i % ww;
    i /= ww;
    x.h = i % hh;
    x.n = i / hh;
  } else {
    x.w = i % ww;
    i /= ww;
    x.h = i % hh;
    i /= hh;
    x.c = i % channels;
    x.n = i / channels;
  }
  return x;
}

template <typename I>
__device__ __forceinline__ I offset(const PoolGeometry& g, I n, I c, I h, I w, I hh, I ww) {
  const I channels = static_cast<I>(g.channels);
  return g.channels_last ? ((n * hh + h) * ww + w) * channels + c
                         : ((n * channels + c) * hh + h) * ww + w;
}

template <typename I>
__device__ __forceinline__ void covering(I h, I k, I s, I p, I out, I* lo, I* hi) {
  I first = h + p - k + 1;
  *lo = first <= 0 ? 0 : (first + s - 1) / s;
  I last = (h + p) / s;
  *hi = last < out - 1 ? last : out - 1;
}

// The window's sizes in the index type I: (height, width, out_height, out_width, kernel, stride,
// padding).
template <typename I>
struct WindowSizes {
  I height, width, out_height, out_width, kernel, stride, padding;
};
template <typename I>
__device__ __forceinline__ WindowSizes<I> window_in(const PoolGeometry& g) {
  return {static_cast<I>(g.height),    static_cast<I>(g.width),  static_cast<I>(g.out_height),
          static_cast<I>(g.out_width), static_cast<I>(g.kernel), static_cast<I>(g.stride),
          static_cast<I>(g.padding)};
}

#define KILN_GRID_STRIDE(i, n)                                               \
  for (I i = blockIdx.x * static_cast<I>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<I>(gridDim.x) * blockDim.x)

template <typename T, typename I>
__global__ void max_forward_kernel(PoolGeometry g, const T* x, T* y, std::int32_t* argmax,
                                   I total) {
  const auto [height, width, out_height, out_width, kernel, stride, padding] = window_in<I>(g);
  KILN_GRID_STRIDE(i, total) {
    Index<I> o = split(g, i, out_height, out_width);
    float best = -INFINITY;
    I best_at = -1;
    for (I r = 0; r < kernel; ++r) {
      I h = o.h * stride - padding + r;
      if (h < 0 || h >= height) continue;
      for (I s = 0; s < kernel; ++s) {
        I w = o.w * stride - padding + s;
        if (w < 0 || w >= width) continue;
        float v = static_cast<float>(cuda::load(x[offset(g, o.n, o.c, h, w, height, width)]));
        if (v > best || best_at < 0) {
          best = v;
          best_at = h * width + w;
        }
      }
    }
    y[i] = cuda::store<T>(best);
    argmax[i] = static_cast<std::int32_t>(best_at);
  }
}

template <typename T, typename I>
__global__ void max_backward_kernel(PoolGeometry g, const T* dy, const std::int32_t* argmax, T* dx,
                                    I total) {
  const auto [height, width, out_height, out_width, kernel, stride, padding] = window_in<I>(g);
  KILN_GRID_STRIDE(i, total) {
    Index<I> p = split(g, i, height, width);
    I oh_lo, oh_hi, ow_lo, ow_hi;
    covering(p.h, kernel, stride, padding, out_height, &oh_lo, &oh_hi);
    covering(p.w, kernel, stride, padding, out_width, &ow_lo, &ow_hi);
    const std::int32_t me = static_cast<std::int32_t>(p.h * width + p.w);
    float sum = 0.f;
    for (I oh = oh_lo; oh <= oh_hi; ++oh)
      for (I ow = ow_lo; ow <= ow_hi; ++ow) {
        I o = offset(g, p.n, p.c, oh, ow, out_height, out_width);
        if (argmax[o] == me) sum += static_cast<float>(cuda::load(dy[o]));
      }
    dx[i] = cuda::store<T>(sum);
  }
}

// NHWC with whole 16-byte packs of channels: one thread per (pixel, pack), so the index
// arithmetic is done once for V channels and every access is a vector access. The same
// comparisons and the same summation order per channel as the kernels above: bitwise equal.
template <typename T>
struct ArgmaxPack {  // the int32 argmax of one pack's channels
  std::int32_t v[cuda::Pack<T>::kSize];
};

template <typename T>
__global__ void max_forward_packed_kernel(PoolGeometry g, const cuda::Pack<T>* x, cuda::Pack<T>* y,
                                          ArgmaxPack<T>* argmax, std::int32_t total_packs) {
  constexpr int V = cuda::Pack<T>::kSize;
  const std::int32_t packs = static_cast<std::int32_t>(g.channels / V);
  const std::int32_t height = static_cast<std::int32_t>(g.height);
  const std::int32_t width = static_cast<std::int32_t>(g.width);
  const std::int32_t out_height = static_cast<std::int32_t>(g.out_height);
  const std::int32_t out_width = static_cast<std::int32_t>(g.out_width);
  const std::int32_t kernel = static_cast<std::int32_t>(g.kernel);
  const std::int32_t stride = static_cast<std::int32_t>(g.stride);
  const std::int32_t padding = static_cast<std::int32_t>(g.padding);
  using I = std::int32_t;
  KILN_GRID_STRIDE(i, total_packs) {
    const I c = i % packs, pixel = i / packs;
    const I ow = pixel % out_width, rest = pixel / out_width;
    const I oh = rest % out_height, n = rest / out_height;
    float best[V];
    std::int32_t best_at[V];
#pragma unroll
    for (int k = 0; k < V; ++k) best[k] = -INFINITY, best_at[k] = -1;
    for (I r = 0; r < kernel; ++r) {
      const I h = oh * stride - padding + r;
      if (h < 0 || h >= height) continue;
      for (I q = 0; q < kernel; ++q) {
        const I w = ow * stride - padding + q;
        if (w < 0 || w >= width) continue;
        const cuda::Pack<T> xv = x[((n * height + h) * width + w) * packs + c];
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float v = static_cast<float>(cuda::load(xv.v[k]));
          if (v > best[k] || best_at[k] < 0) best[k] = v, best_at[k] = h * width + w;
        }
      }
    }
    cuda::Pack<T> out;
    ArgmaxPack<T> at;
#pragma unroll
    for (int k = 0; k < V; ++k) out.v[k] = cuda::store<T>(best[k]), at.v[k] = best_at[k];
    y[i] = out;
    argmax[i] = at;
  }
}

template <typename T>
__global__ void max_backward_packed_kernel(PoolGeometry g, const cuda::Pack<T>* dy,
                                           const ArgmaxPack<T>* argmax, cuda::Pack<T>* dx,
                                           std::int32_t total_packs) {
  constexpr int V = cuda::Pack<T>::kSize;
  using I = std::int32_t;
  const I packs = static_cast<I>(g.channels / V);
  const auto [height, width, out_height, out_width, kernel, stride, padding] = window_in<I>(g);
  KILN_GRID_STRIDE(i, total_packs) {
    const I c = i % packs, pixel = i / packs;
    const I w = pixel % width, rest = pixel / width;
    const I h = rest % height, n = rest / height;
    I oh_lo, oh_hi, ow_lo, ow_hi;
    covering(h, kernel, stride, padding, out_height, &oh_lo, &oh_hi);
    covering(w, kernel, stride, padding, out_width, &ow_lo, &ow_hi);
    const std::int32_t me = h * width + w;
    float sum[V];
#pragma unroll
    for (int k = 0; k < V; ++k) sum[k] = 0.f;
    for (I oh = oh_lo; oh <= oh_hi; ++oh)
      for (I ow = ow_lo; ow <= ow_hi; ++ow) {
        const I o = ((n * out_height + oh) * out_width + ow) * packs + c;
        const ArgmaxPack<T> at = argmax[o];
        const cuda::Pack<T> g = dy[o];
#pragma unroll
        for (int k = 0; k < V; ++k) {
          if (at.v[k] == me) sum[k] += static_cast<float>(cuda::load(g.v[k]));
        }
      }
    cuda::Pack<T> out;
#pragma unroll
    for (int k = 0; k < V; ++k) out.v[k] = cuda::store<T>(sum[k]);
    dx[i] = out;
  }
}

// Whether the packed kernels can run: NHWC, whole packs per pixel, aligned, 32-bit indices.
template <typename T>
bool packed(const PoolGeometry& g, const Tensor& a, const Tensor& b, const Tensor& argmax) {
  constexpr int V = cuda::Pack<T>::kSize;
  return g.channels_last && g.channels % V == 0 && a.numel() < (std::int64_t{1} << 30) &&
         b.numel() < (std::int64_t{1} << 30) &&
         cuda::aligned16({a.data(), b.data(), argmax.data()}) &&
         reinterpret_cast<std::uintptr_t>(argmax.data()) % sizeof(ArgmaxPack<T>) == 0;
}

template <typename T, typename I>
__global__ void avg_forward_kernel(PoolGeometry g, const T* x, T* y, I total) {
  const float inv = 1.f / static_cast<float>(g.kernel * g.kernel);
  const auto [height, width, out_height, out_width, kernel, stride, padding] = window_in<I>(g);
  KILN_GRID_STRIDE(i, total) {
    Index<I> o = split(g, i, out_height, out_width);
    float sum = 0.f;
    for (I r = 0; r < kernel; ++r) {
      I h = o.h * stride - padding + r;
      if (h < 0 || h >= height) continue;
      for (I s = 0; s < kernel; ++s) {
        I w = o.w * stride - padding + s;
        if (w >= 0 && w < width) {
          sum += static_cast<float>(cuda::load(x[offset(g, o.n, o.c, h, w, height, width)]));
        }
      }
    }
    y[i] = cuda::store<T>(sum * inv);
  }
}

template <typename T, typename I>
__global__ void avg_backward_kernel(PoolGeometry g, const T* dy, T* dx, I total) {
  const float inv = 1.f / static_cast<float>(g.kernel * g.kernel);
  const auto [height, width, out_height, out_width, kernel, stride, padding] = window_in<I>(g);
  KILN_GRID_STRIDE(i, total) {
    Index<I> p = split(g, i, height, width);
    I oh_lo, oh_hi, ow_lo, ow_hi;
    covering(p.h, kernel, stride, padding, out_height, &oh_lo, &oh_hi);
    covering(p.w, kernel, stride, padding, out_width, &ow_lo, &ow_hi);
    float sum = 0.f;
    for (I oh = oh_lo; oh <= oh_hi; ++oh)
      for (I ow = ow_lo; ow <= ow_hi; ++ow) {
        sum +=
            static_cast<float>(cuda::load(dy[offset(g, p.n, p.c, oh, ow, out_height, out_width)]));
      }
    dx[i] = cuda::store<T>(sum * inv);
  }
}

// One thread per (n, c); in NHWC neighbouring threads read neighbouring channels.
template <typename T, typename I = std::int64_t>
__global__ void global_avg_forward_kernel(PoolGeometry g, const T* x, T* y, std::int64_t total) {
  const std::int64_t plane = g.height * g.width;
  KILN_GRID_STRIDE(i, total) {
    std::int64_t n = i / g.channels, c = i % g.channels;
    float sum = 0.f;
    for (std::int64_t p = 0; p < plane; ++p) {
      sum += static_cast<float>(cuda::load(x[g.channels_last ? (n * plane + p) * g.channels + c
                                                             : (n * g.channels + c) * plane + p]));
    }
    y[i] = cuda::store<T>(sum / static_cast<float>(plane));
  }
}

template <typename T, typename I = std::int64_t>
__global__ void global_avg_backward_kernel(PoolGeometry g, const T* dy, T* dx, std::int64_t total) {
  const std::int64_t plane = g.height * g.width;
  KILN_GRID_STRIDE(i, total) {
    std::int64_t n, c;
    if (g.channels_last) {
      c = i % g.channels;
      n = i / (plane * g.channels);
    } else {
      c = (i / plane) % g.channels;
      n = i / (plane * g.channels);
    }
    dx[i] = cuda::store<T>(static_cast<float>(cuda::load(dy[n * g.channels + c])) /
                           static_cast<float>(plane));
  }
}

cudaStream_t stream_of(const Tensor& t) {
  return static_cast<cudaStream_t>(current_stream(t.device()));
}

void check_dense(const Tensor& a, const Tensor& b, const char* who) {
  KILN_CHECK(a.is_contiguous() && b.is_contiguous() && a.dtype() == b.dtype() &&
                 a.device().is_cuda() && b.device() == a.device(),
             std::string(who) + ": " + a.str() + ", " + b.str());
}

// Calls f(T{}, I{}, total): T the storage type of `out`, total its element count (nothing
// for an empty output), I the index type, int32 when every index of a and b fits (64-bit
// division is several times slower on the GPU), else int64. The operands were checked dense and
// of one dtype.
template <typename F>
void for_each_output(const Tensor& out, const Tensor& a, const Tensor& b, F&& f) {
  const std::int64_t total = out.numel();
  if (total == 0) return;
  constexpr std::int64_t kLimit = std::int64_t{1} << 30;
  const bool narrow = a.numel() < kLimit && b.numel() < kLimit;
  KILN_CUDA_DISPATCH_FLOATING(out.dtype(), T, {
    if (narrow) {
      f(T{}, std::int32_t{}, total);
    } else {
      f(T{}, std::int64_t{}, total);
    }
  });
}

// The one kernel launch of the pooling entry points: one thread per item (element, or pack of
// channels) in blocks of 256, on `stream`.
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), std::int64_t items, cudaStream_t stream, Args... args) {
  kernel<<<cuda::grid_for(items), 256, 0, stream>>>(args...);
  KILN_CUDA_LAUNCH_CHECK();
}

}  // namespace

void max_forward(const PoolGeometry& g, const Tensor& x, Tensor& y, Tensor& argmax) {
  check_dense(x, y, "pooling_cuda::max_forward");
  KILN_CHECK(argmax.dtype() == DType::I32 && argmax.numel() == y.numel(), "max_forward: argmax");
  for_each_output(y, x, y, [&](auto tag, auto index, std::int64_t total) {
    using T = decltype(tag);
    using I = decltype(index);
    if (packed<T>(g, x, y, argmax)) {
      const std::int64_t packs = total / cuda::Pack<T>::kSize;
      launch(max_forward_packed_kernel<T>, packs, stream_of(x), g,
             static_cast<const cuda::Pack<T>*>(x.data()), static_cast<cuda::Pack<T>*>(y.data()),
             static_cast<ArgmaxPack<T>*>(argmax.data()), static_cast<std::int32_t>(packs));
      return;
    }
    launch(max_forward_kernel<T, I>, total, stream_of(x), g, static_cast<const T*>(x.data()),
           static_cast<T*>(y.data()), static_cast<std::int32_t*>(argmax.data()),
           static_cast<I>(total));
  });
}

void max_backward(const PoolGeometry& g, const Tensor& dy, const Tensor& argmax, Tensor& dx) {
  check_dense(dy, dx, "pooling_cuda::max_backward");
  for_each_output(dx, dx, dy, [&](auto tag, auto index, std::int64_t total) {
    using T = decltype(tag);
    using I = decltype(index);
    if (packed<T>(g, dx, dy, argmax)) {
      const std::int64_t packs = total / cuda::Pack<T>::kSize;
      launch(max_backward_packed_kernel<T>, packs, stream_of(dx), g,
             static_cast<const cuda::Pack<T>*>(dy.data()),
             static_cast<const ArgmaxPack<T>*>(argmax.data()),
             static_cast<cuda::Pack<T>*>(dx.data()), static_cast<std::int32_t>(packs));
      return;
    }
    launch(max_backward_kernel<T, I>, total, stream_of(dx), g, static_cast<const T*>(dy.data()),
           static_cast<const std::int32_t*>(argmax.data()), static_cast<T*>(dx.data()),
           static_cast<I>(total));
  });
}

void avg_forward(const PoolGeometry& g, const Tensor& x, Tensor& y) {
  check_dense(x, y, "pooling_cuda::avg_forward");
  for_each_output(y, x, y, [&](auto tag, auto index, std::int64_t total) {
    using T = decltype(tag);
    using I = decltype(index);
    launch(avg_forward_kernel<T, I>, total, stream_of(x), g, static_cast<const T*>(x.data()),
           static_cast<T*>(y.data()), static_cast<I>(total));
  });
}

void avg_backward(const PoolGeometry& g, const Tensor& dy, Tensor& dx) {
  check_dense(dy, dx, "pooling_cuda::avg_backward");
  for_each_output(dx, dx, dy, [&](auto tag, auto index, std::int64_t total) {
    using T = decltype(tag);
    using I = decltype(index);
    launch(avg_backward_kernel<T, I>, total, stream_of(dx), g, static_cast<const T*>(dy.data()),
           static_cast<T*>(dx.data()), static_cast<I>(total));
  });
}

// The global kernels always index in 64 bits (one thread per (n, c); I is not theirs to pick).
void global_avg_forward(const PoolGeometry& g, const Tensor& x, Tensor& y) {
  check_dense(x, y, "pooling_cuda::global_avg_forward");
  for_each_output(y, x, y, [&](auto tag, auto, std::int64_t total) {
    using T = decltype(tag);
    launch(global_avg_forward_kernel<T>, total, stream_of(x), g, static_cast<const T*>(x.data()),
           static_cast<T*>(y.data()), total);
  });
}

void global_avg_backward(const PoolGeometry& g, const Tensor& dy, Tensor& dx) {
  check_dense(dy, dx, "pooling_cuda::global_avg_backward");
  for_each_output(dx, dx, dy, [&](auto tag, auto, std::int64_t total) {
    using T = decltype(tag);
    launch(global_avg_backward_kernel<T>, total, stream_of(dx), g, static_cast<const T*>(dy.data()),
           static_cast<T*>(dx.data()), total);
  });
}

}  // namespace kiln::pooling_cuda
