// Pooling on CUDA: one thread per output element forward, one per input element backward (a
// gather over the windows covering it: no atomics, deterministic), in NCHW or NHWC.

#include "core/cuda/cuda_check.h"
#include "core/cuda/element.cuh"
#include "core/stream.h"
#include "layers/pooling.h"

namespace kiln::pooling_cuda {
namespace {

struct Index {
  std::int64_t n, c, h, w;
};

// Splits a linear index of a (hh, ww) plane tensor in g's memory order.
__device__ __forceinline__ Index split(const PoolGeometry& g, std::int64_t i, std::int64_t hh,
                                       std::int64_t ww) {
  Index x;
  if (g.channels_last) {
    x.c = i % g.channels;
    i /= g.channels;
    x.w = i % ww;
    i /= ww;
    x.h = i % hh;
    x.n = i / hh;
  } else {
    x.w = i % ww;
    i /= ww;
    x.h = i % hh;
    i /= hh;
    x.c = i % g.channels;
    x.n = i / g.channels;
  }
  return x;
}

__device__ __forceinline__ std::int64_t offset(const PoolGeometry& g, std::int64_t n,
                                               std::int64_t c, std::int64_t h, std::int64_t w,
                                               std::int64_t hh, std::int64_t ww) {
  return g.channels_last ? ((n * hh + h) * ww + w) * g.channels + c
                         : ((n * g.channels + c) * hh + h) * ww + w;
}

__device__ __forceinline__ void covering(std::int64_t h, std::int64_t k, std::int64_t s,
                                         std::int64_t p, std::int64_t out, std::int64_t* lo,
                                         std::int64_t* hi) {
  std::int64_t first = h + p - k + 1;
  *lo = first <= 0 ? 0 : (first + s - 1) / s;
  std::int64_t last = (h + p) / s;
  *hi = last < out - 1 ? last : out - 1;
}

#define KILN_GRID_STRIDE(i, n)                                                                     \
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)

template <typename T>
__global__ void max_forward_kernel(PoolGeometry g, const T* x, T* y, std::int32_t* argmax,
                                   std::int64_t total) {
  KILN_GRID_STRIDE(i, total) {
    Index o = split(g, i, g.out_height, g.out_width);
    float best = -INFINITY;
    std::int64_t best_at = -1;
    for (std::int64_t r = 0; r < g.kernel; ++r) {
      std::int64_t h = o.h * g.stride - g.padding + r;
      if (h < 0 || h >= g.height) continue;
      for (std::int64_t s = 0; s < g.kernel; ++s) {
        std::int64_t w = o.w * g.stride - g.padding + s;
        if (w < 0 || w >= g.width) continue;
        float v = static_cast<float>(cuda::load(x[offset(g, o.n, o.c, h, w, g.height, g.width)]));
        if (v > best || best_at < 0) {
          best = v;
          best_at = h * g.width + w;
        }
      }
    }
    y[i] = cuda::store<T>(best);
    argmax[i] = static_cast<std::int32_t>(best_at);
  }
}

template <typename T>
__global__ void max_backward_kernel(PoolGeometry g, const T* dy, const std::int32_t* argmax, T* dx,
                                    std::int64_t total) {
  KILN_GRID_STRIDE(i, total) {
    Index p = split(g, i, g.height, g.width);
    std::int64_t oh_lo, oh_hi, ow_lo, ow_hi;
    covering(p.h, g.kernel, g.stride, g.padding, g.out_height, &oh_lo, &oh_hi);
    covering(p.w, g.kernel, g.stride, g.padding, g.out_width, &ow_lo, &ow_hi);
    const std::int32_t me = static_cast<std::int32_t>(p.h * g.width + p.w);
    float sum = 0.f;
    for (std::int64_t oh = oh_lo; oh <= oh_hi; ++oh)
      for (std::int64_t ow = ow_lo; ow <= ow_hi; ++ow) {
        std::int64_t o = offset(g, p.n, p.c, oh, ow, g.out_height, g.out_width);
        if (argmax[o] == me) sum += static_cast<float>(cuda::load(dy[o]));
      }
    dx[i] = cuda::store<T>(sum);
  }
}

template <typename T>
__global__ void avg_forward_kernel(PoolGeometry g, const T* x, T* y, std::int64_t total) {
  const float inv = 1.f / static_cast<float>(g.kernel * g.kernel);
  KILN_GRID_STRIDE(i, total) {
    Index o = split(g, i, g.out_height, g.out_width);
    float sum = 0.f;
    for (std::int64_t r = 0; r < g.kernel; ++r) {
      std::int64_t h = o.h * g.stride - g.padding + r;
      if (h < 0 || h >= g.height) continue;
      for (std::int64_t s = 0; s < g.kernel; ++s) {
        std::int64_t w = o.w * g.stride - g.padding + s;
        if (w >= 0 && w < g.width) {
          sum += static_cast<float>(cuda::load(x[offset(g, o.n, o.c, h, w, g.height, g.width)]));
        }
      }
    }
    y[i] = cuda::store<T>(sum * inv);
  }
}

template <typename T>
__global__ void avg_backward_kernel(PoolGeometry g, const T* dy, T* dx, std::int64_t total) {
  const float inv = 1.f / static_cast<float>(g.kernel * g.kernel);
  KILN_GRID_STRIDE(i, total) {
    Index p = split(g, i, g.height, g.width);
    std::int64_t oh_lo, oh_hi, ow_lo, ow_hi;
    covering(p.h, g.kernel, g.stride, g.padding, g.out_height, &oh_lo, &oh_hi);
    covering(p.w, g.kernel, g.stride, g.padding, g.out_width, &ow_lo, &ow_hi);
    float sum = 0.f;
    for (std::int64_t oh = oh_lo; oh <= oh_hi; ++oh)
      for (std::int64_t ow = ow_lo; ow <= ow_hi; ++ow) {
        sum += static_cast<float>(
            cuda::load(dy[offset(g, p.n, p.c, oh, ow, g.out_height, g.out_width)]));
      }
    dx[i] = cuda::store<T>(sum * inv);
  }
}

// One thread per (n, c); in NHWC neighbouring threads read neighbouring channels.
template <typename T>
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

template <typename T>
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

}  // namespace

void max_forward(const PoolGeometry& g, const Tensor& x, Tensor& y, Tensor& argmax) {
  check_dense(x, y, "pooling_cuda::max_forward");
  KILN_CHECK(argmax.dtype() == DType::I32 && argmax.numel() == y.numel(), "max_forward: argmax");
  const std::int64_t total = y.numel();
  if (total == 0) return;
  KILN_CUDA_DISPATCH_FLOATING(x.dtype(), T, {
    max_forward_kernel<T><<<cuda::grid_for(total), 256, 0, stream_of(x)>>>(
        g, static_cast<const T*>(x.data()), static_cast<T*>(y.data()),
        static_cast<std::int32_t*>(argmax.data()), total);
    KILN_CUDA_LAUNCH_CHECK();
  });
}

void max_backward(const PoolGeometry& g, const Tensor& dy, const Tensor& argmax, Tensor& dx) {
  check_dense(dy, dx, "pooling_cuda::max_backward");
  const std::int64_t total = dx.numel();
  if (total == 0) return;
  KILN_CUDA_DISPATCH_FLOATING(dx.dtype(), T, {
    max_backward_kernel<T><<<cuda::grid_for(total), 256, 0, stream_of(dx)>>>(
        g, static_cast<const T*>(dy.data()), static_cast<const std::int32_t*>(argmax.data()),
        static_cast<T*>(dx.data()), total);
    KILN_CUDA_LAUNCH_CHECK();
  });
}

void avg_forward(const PoolGeometry& g, const Tensor& x, Tensor& y) {
  check_dense(x, y, "pooling_cuda::avg_forward");
  const std::int64_t total = y.numel();
  if (total == 0) return;
  KILN_CUDA_DISPATCH_FLOATING(x.dtype(), T, {
    avg_forward_kernel<T><<<cuda::grid_for(total), 256, 0, stream_of(x)>>>(
        g, static_cast<const T*>(x.data()), static_cast<T*>(y.data()), total);
    KILN_CUDA_LAUNCH_CHECK();
  });
}

void avg_backward(const PoolGeometry& g, const Tensor& dy, Tensor& dx) {
  check_dense(dy, dx, "pooling_cuda::avg_backward");
  const std::int64_t total = dx.numel();
  if (total == 0) return;
  KILN_CUDA_DISPATCH_FLOATING(dx.dtype(), T, {
    avg_backward_kernel<T><<<cuda::grid_for(total), 256, 0, stream_of(dx)>>>(
        g, static_cast<const T*>(dy.data()), static_cast<T*>(dx.data()), total);
    KILN_CUDA_LAUNCH_CHECK();
  });
}

void global_avg_forward(const PoolGeometry& g, const Tensor& x, Tensor& y) {
  check_dense(x, y, "pooling_cuda::global_avg_forward");
  const std::int64_t total = y.numel();
  if (total == 0) return;
  KILN_CUDA_DISPATCH_FLOATING(x.dtype(), T, {
    global_avg_forward_kernel<T><<<cuda::grid_for(total), 256, 0, stream_of(x)>>>(
        g, static_cast<const T*>(x.data()), static_cast<T*>(y.data()), total);
    KILN_CUDA_LAUNCH_CHECK();
  });
}

void global_avg_backward(const PoolGeometry& g, const Tensor& dy, Tensor& dx) {
  check_dense(dy, dx, "pooling_cuda::global_avg_backward");
  const std::int64_t total = dx.numel();
  if (total == 0) return;
  KILN_CUDA_DISPATCH_FLOATING(dx.dtype(), T, {
    global_avg_backward_kernel<T><<<cuda::grid_for(total), 256, 0, stream_of(dx)>>>(
        g, static_cast<const T*>(dy.data()), static_cast<T*>(dx.data()), total);
    KILN_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace kiln::pooling_cuda
