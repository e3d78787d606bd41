#include "layers/pooling.h"

#include <algorithm>
#include <limits>

#include "core/cpu/element.h"
#include "layers/conv2d.h"
#include "layers/cuda/pooling_cuda.h"

namespace kiln {
namespace {

PoolGeometry pool_geometry(const Shape& input, std::int64_t kernel, std::int64_t stride,
                           std::int64_t padding, bool channels_last, const std::string& who) {
  if (input.size() != 4) throw InputError(who + ": expected (N, C, H, W), got " + shape_str(input));
  PoolGeometry g;
  g.batch = input[0];
  g.channels = input[1];
  g.height = input[2];
  g.width = input[3];
  g.kernel = kernel;
  g.stride = stride;
  g.padding = padding;
  g.out_height = (g.height + 2 * padding - kernel) / stride + 1;
  g.out_width = (g.width + 2 * padding - kernel) / stride + 1;
  g.channels_last = channels_last;
  if (g.out_height <= 0 || g.out_width <= 0) {
    throw InputError(who + ": a " + std::to_string(kernel) + "x" + std::to_string(kernel) +
                     " window does not fit " + shape_str(input));
  }
  return g;
}

void check_window(std::int64_t kernel, std::int64_t stride, std::int64_t padding, const char* who) {
  if (kernel <= 0 || stride < 0 || padding < 0 || padding * 2 > kernel) {
    throw InputError(std::string(who) +
                     ": kernel must be positive, stride non-negative, and "
                     "padding at most half the kernel");
  }
}

// Offset of element (n, c, h, w) of a plane of size hh x ww in g's memory order.
inline std::int64_t offset(const PoolGeometry& g, std::int64_t n, std::int64_t c, std::int64_t h,
                           std::int64_t w, std::int64_t hh, std::int64_t ww) {
  return g.channels_last ? ((n * hh + h) * ww + w) * g.channels + c
                         : ((n * g.channels + c) * hh + h) * ww + w;
}

// Where plane (n, c) of `plane_size` elements starts, and the distance between its elements.
inline std::int64_t plane_base(const PoolGeometry& g, std::int64_t n, std::int64_t c,
                               std::int64_t plane_size) {
  return g.channels_last ? n * plane_size * g.channels + c : (n * g.channels + c) * plane_size;
}
inline std::int64_t element_stride(const PoolGeometry& g) {
  return g.channels_last ? g.channels : 1;
}

// The output windows covering input row h: [lo, hi].
inline void covering(std::int64_t h, std::int64_t k, std::int64_t s, std::int64_t p,
                     std::int64_t out, std::int64_t* lo, std::int64_t* hi) {
  std::int64_t first = h + p - k + 1;
  *lo = first <= 0 ? 0 : (first + s - 1) / s;
  *hi = std::min(out - 1, (h + p) / s);
}

Shape physical_shape(const PoolGeometry& g, std::int64_t h, std::int64_t w) {
  return g.channels_last ? Shape{g.batch, h, w, g.channels} : Shape{g.batch, g.channels, h, w};
}

}  // namespace

// ---- WindowPool2d ------------------------------------------------------------------------------

WindowPool2d::WindowPool2d(std::int64_t kernel, std::int64_t stride, std::int64_t padding,
                           const char* type)
    : kernel_(kernel), stride_(stride == 0 ? kernel : stride), padding_(padding) {
  check_window(kernel_, stride_, padding_, type);
}

PoolGeometry WindowPool2d::geometry(const Shape& input, bool channels_last) const {
  return pool_geometry(input, kernel_, stride_, padding_, channels_last, type() + " " + name());
}

Shape WindowPool2d::output_shape(const Shape& input) const {
  PoolGeometry g = geometry(input, false);
  return {g.batch, g.channels, g.out_height, g.out_width};
}

PoolGeometry WindowPool2d::begin_forward(const Context& ctx, const Tensor& x, Tensor& x_physical,
                                         Tensor& y_physical) const {
  PoolGeometry g = geometry(x.shape(), ctx.run.channels_last);
  x_physical = to_physical(x, g.channels_last);
  y_physical = Tensor::empty(physical_shape(g, g.out_height, g.out_width), x.dtype(), x.device());
  return g;
}

Tensor WindowPool2d::end_forward(const PoolGeometry& g, const Tensor& x, const Tensor& y_physical) {
  saved_ = g;
  saved_dtype_ = x.dtype();
  return from_physical(y_physical, g.channels_last);
}

void WindowPool2d::begin_backward(const Tensor& dy, Tensor& dy_physical,
                                  Tensor& dx_physical) const {
  const PoolGeometry& g = saved_;
  dy_physical = to_physical(dy, g.channels_last).to(saved_dtype_);
  dx_physical = Tensor::empty(physical_shape(g, g.height, g.width), saved_dtype_, dy.device());
}

// ---- MaxPool2d ---------------------------------------------------------------------------------

Tensor MaxPool2d::forward_impl(Context& ctx, const Tensor& x) {
  Tensor xp, yp;
  PoolGeometry g = begin_forward(ctx, x, xp, yp);
  argmax_ = Tensor::empty(yp.shape(), DType::I32, x.device());
  if (x.device().is_cuda()) {
    pooling_cuda::max_forward(g, xp, yp, argmax_);
  } else {
    std::int32_t* am = argmax_.data<std::int32_t>();
    KILN_DISPATCH_FLOATING(x.dtype(), T, {
      const T* px = static_cast<const T*>(xp.data());
      T* py = static_cast<T*>(yp.data());
      const std::int64_t es = element_stride(g);
      for (std::int64_t n = 0; n < g.batch; ++n)
        for (std::int64_t c = 0; c < g.channels; ++c) {
          const T* plane = px + plane_base(g, n, c, g.height * g.width);
          const std::int64_t out_base = plane_base(g, n, c, g.out_height * g.out_width);
          for (std::int64_t oh = 0; oh < g.out_height; ++oh)
            for (std::int64_t ow = 0; ow < g.out_width; ++ow) {
              // The window clipped to the plane: no bounds checks in the inner loops.
              const std::int64_t h0 = oh * g.stride - g.padding, w0 = ow * g.stride - g.padding;
              const std::int64_t h_lo = std::max<std::int64_t>(h0, 0),
                                 h_hi = std::min(h0 + g.kernel, g.height);
              const std::int64_t w_lo = std::max<std::int64_t>(w0, 0),
                                 w_hi = std::min(w0 + g.kernel, g.width);
              std::int64_t best_at = h_lo * g.width + w_lo;
              auto best = cpu::load(plane[best_at * es]);
              for (std::int64_t h = h_lo; h < h_hi; ++h) {
                for (std::int64_t w = w_lo; w < w_hi; ++w) {
                  auto v = cpu::load(plane[(h * g.width + w) * es]);
                  if (v > best) {
                    best = v;
                    best_at = h * g.width + w;
                  }
                }
              }
              std::int64_t o = out_base + (oh * g.out_width + ow) * es;
              py[o] = cpu::store<T>(best);
              am[o] = static_cast<std::int32_t>(best_at);
            }
        }
    });
  }
  return end_forward(g, x, yp);
}

Tensor MaxPool2d::backward_impl(Context& ctx, const Tensor& dy) {
  (void)ctx;
  KILN_CHECK(argmax_.defined(), "MaxPool2d " + name() + ": backward without forward");
  const PoolGeometry& g = saved_;
  Tensor dyp, dxp;
  begin_backward(dy, dyp, dxp);
  if (dy.device().is_cuda()) {
    pooling_cuda::max_backward(g, dyp, argmax_, dxp);
  } else {
    // On the CPU a sequential scatter to each window's maximum is exact and deterministic.
    const std::int32_t* am = argmax_.data<std::int32_t>();
    dxp.zero();
    KILN_DISPATCH_FLOATING(saved_dtype_, T, {
      const T* pd = static_cast<const T*>(dyp.data());
      T* px = static_cast<T*>(dxp.data());
      const std::int64_t es = element_stride(g);
      for (std::int64_t n = 0; n < g.batch; ++n)
        for (std::int64_t c = 0; c < g.channels; ++c) {
          T* plane = px + plane_base(g, n, c, g.height * g.width);
          const std::int64_t out_base = plane_base(g, n, c, g.out_height * g.out_width);
          for (std::int64_t i = 0; i < g.out_height * g.out_width; ++i) {
            const std::int64_t o = out_base + i * es;
            T& target = plane[am[o] * es];
            target = cpu::store<T>(cpu::load(target) + cpu::load(pd[o]));
          }
        }
    });
  }
  return from_physical(dxp, g.channels_last);
}

// ---- AvgPool2d ---------------------------------------------------------------------------------

Tensor AvgPool2d::forward_impl(Context& ctx, const Tensor& x) {
  Tensor xp, yp;
  PoolGeometry g = begin_forward(ctx, x, xp, yp);
  if (x.device().is_cuda()) {
    pooling_cuda::avg_forward(g, xp, yp);
  } else {
    // count_include_pad: every window divides by kernel^2 (floor mode keeps windows in the pad).
    const double inv = 1.0 / static_cast<double>(g.kernel * g.kernel);
    KILN_DISPATCH_FLOATING(x.dtype(), T, {
      const T* px = static_cast<const T*>(xp.data());
      T* py = static_cast<T*>(yp.data());
      for (std::int64_t n = 0; n < g.batch; ++n)
        for (std::int64_t c = 0; c < g.channels; ++c)
          for (std::int64_t oh = 0; oh < g.out_height; ++oh)
            for (std::int64_t ow = 0; ow < g.out_width; ++ow) {
              double sum = 0;
              for (std::int64_t r = 0; r < g.kernel; ++r) {
                std::int64_t h = oh * g.stride - g.padding + r;
                if (h < 0 || h >= g.height) continue;
                for (std::int64_t s = 0; s < g.kernel; ++s) {
                  std::int64_t w = ow * g.stride - g.padding + s;
                  if (w >= 0 && w < g.width) {
                    sum += cpu::load(px[offset(g, n, c, h, w, g.height, g.width)]);
                  }
                }
              }
              py[offset(g, n, c, oh, ow, g.out_height, g.out_width)] = cpu::store<T>(sum * inv);
            }
    });
  }
  return end_forward(g, x, yp);
}

Tensor AvgPool2d::backward_impl(Context& ctx, const Tensor& dy) {
  (void)ctx;
  const PoolGeometry& g = saved_;
  KILN_CHECK(g.batch > 0, "AvgPool2d " + name() + ": backward without forward");
  Tensor dyp, dxp;
  begin_backward(dy, dyp, dxp);
  if (dy.device().is_cuda()) {
    pooling_cuda::avg_backward(g, dyp, dxp);
  } else {
    const double inv = 1.0 / static_cast<double>(g.kernel * g.kernel);
    KILN_DISPATCH_FLOATING(saved_dtype_, T, {
      const T* pd = static_cast<const T*>(dyp.data());
      T* px = static_cast<T*>(dxp.data());
      for (std::int64_t n = 0; n < g.batch; ++n)
        for (std::int64_t c = 0; c < g.channels; ++c)
          for (std::int64_t h = 0; h < g.height; ++h) {
            std::int64_t oh_lo, oh_hi;
            covering(h, g.kernel, g.stride, g.padding, g.out_height, &oh_lo, &oh_hi);
            for (std::int64_t w = 0; w < g.width; ++w) {
              std::int64_t ow_lo, ow_hi;
              covering(w, g.kernel, g.stride, g.padding, g.out_width, &ow_lo, &ow_hi);
              double sum = 0;
              for (std::int64_t oh = oh_lo; oh <= oh_hi; ++oh)
                for (std::int64_t ow = ow_lo; ow <= ow_hi; ++ow) {
                  sum += cpu::load(pd[offset(g, n, c, oh, ow, g.out_height, g.out_width)]);
                }
              px[offset(g, n, c, h, w, g.height, g.width)] = cpu::store<T>(sum * inv);
            }
          }
    });
  }
  return from_physical(dxp, g.channels_last);
}

// ---- GlobalAvgPool -----------------------------------------------------------------------------

Shape GlobalAvgPool::output_shape(const Shape& input) const {
  if (input.size() != 4) {
    throw InputError("GlobalAvgPool " + name() + ": expected (N, C, H, W), got " +
                     shape_str(input));
  }
  return {input[0], input[1]};
}

Tensor GlobalAvgPool::forward_impl(Context& ctx, const Tensor& x) {
  output_shape(x.shape());
  PoolGeometry g;
  g.batch = x.size(0);
  g.channels = x.size(1);
  g.height = x.size(2);
  g.width = x.size(3);
  g.out_height = g.out_width = 1;
  g.channels_last = ctx.run.channels_last;
  Tensor xp = to_physical(x, g.channels_last);
  Tensor y = Tensor::empty({g.batch, g.channels}, x.dtype(), x.device());  // (N, C)
  if (x.device().is_cuda()) {
    pooling_cuda::global_avg_forward(g, xp, y);
  } else {
    const std::int64_t plane = g.height * g.width;
    KILN_DISPATCH_FLOATING(x.dtype(), T, {
      const T* px = static_cast<const T*>(xp.data());
      T* py = static_cast<T*>(y.data());
      for (std::int64_t n = 0; n < g.batch; ++n)
        for (std::int64_t c = 0; c < g.channels; ++c) {
          double sum = 0;
          for (std::int64_t i = 0; i < plane; ++i) {
            sum += cpu::load(px[g.channels_last ? (n * plane + i) * g.channels + c
                                                : (n * g.channels + c) * plane + i]);
          }
          py[n * g.channels + c] = cpu::store<T>(sum / static_cast<double>(plane));
        }
    });
  }
  saved_ = g;
  saved_dtype_ = x.dtype();
  return y;
}

Tensor GlobalAvgPool::backward_impl(Context& ctx, const Tensor& dy) {
  (void)ctx;
  const PoolGeometry& g = saved_;
  KILN_CHECK(g.batch > 0, "GlobalAvgPool " + name() + ": backward without forward");
  Tensor dyc = dy.contiguous().to(saved_dtype_);  // (N, C)
  Tensor dxp = Tensor::empty(physical_shape(g, g.height, g.width), saved_dtype_, dy.device());
  if (dy.device().is_cuda()) {
    pooling_cuda::global_avg_backward(g, dyc, dxp);
  } else {
    const std::int64_t plane = g.height * g.width;
    KILN_DISPATCH_FLOATING(saved_dtype_, T, {
      const T* pd = static_cast<const T*>(dyc.data());
      T* px = static_cast<T*>(dxp.data());
      for (std::int64_t n = 0; n < g.batch; ++n)
        for (std::int64_t c = 0; c < g.channels; ++c) {
          T v = cpu::store<T>(cpu::load(pd[n * g.channels + c]) / static_cast<double>(plane));
          for (std::int64_t i = 0; i < plane; ++i) {
            px[g.channels_last ? (n * plane + i) * g.channels + c
                               : (n * g.channels + c) * plane + i] = v;
          }
        }
    });
  }
  return from_physical(dxp, g.channels_last);
}

}  // namespace kiln
