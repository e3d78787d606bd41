#include "layers/conv2d.h"

#include <cmath>
#include <mutex>

#include "core/gemm_algorithm.h"
#include "core/ops.h"
#include "layers/cuda/conv2d_cuda.h"

namespace kiln {

Tensor to_physical(const Tensor& x, bool channels_last) {
  KILN_CHECK(x.dim() == 4, "expected a 4-D (N, C, H, W) activation, got " + x.str());
  if (!channels_last) return x.contiguous();
  return x.permute({0, 2, 3, 1}).contiguous();
}

Tensor from_physical(const Tensor& physical, bool channels_last) {
  return channels_last ? physical.permute({0, 3, 1, 2}) : physical;
}

bool is_channels_last(const Tensor& x) {
  return x.dim() == 4 && !x.is_contiguous() && x.permute({0, 2, 3, 1}).is_contiguous();
}

std::string Conv2dGeometry::str() const {
  return "conv x(" + std::to_string(batch) + ", " + std::to_string(in_channels) + ", " +
         std::to_string(height) + ", " + std::to_string(width) + ") k" +
         std::to_string(out_channels) + " " + std::to_string(kernel_h) + "x" +
         std::to_string(kernel_w) + " stride " + std::to_string(stride_h) + "," +
         std::to_string(stride_w) + " pad " + std::to_string(pad_h) + "," + std::to_string(pad_w) +
         " dilation " + std::to_string(dilation_h) + "," + std::to_string(dilation_w) + " groups " +
         std::to_string(groups) + " " + dtype_name(dtype) + (channels_last ? " NHWC" : " NCHW");
}

bool Conv2dGeometry::operator==(const Conv2dGeometry& o) const {
  return batch == o.batch && in_channels == o.in_channels && height == o.height &&
         width == o.width && out_channels == o.out_channels && kernel_h == o.kernel_h &&
         kernel_w == o.kernel_w && stride_h == o.stride_h && stride_w == o.stride_w &&
         pad_h == o.pad_h && pad_w == o.pad_w && dilation_h == o.dilation_h &&
         dilation_w == o.dilation_w && groups == o.groups && dtype == o.dtype &&
         channels_last == o.channels_last;
}

namespace {
std::mutex& defaults_mutex() {
  static std::mutex m;
  return m;
}
ConvAlgorithmOptions& defaults() {
  static ConvAlgorithmOptions options;
  return options;
}
}  // namespace

ConvAlgorithmOptions default_conv_algorithm_options() {
  std::lock_guard<std::mutex> lock(defaults_mutex());
  return defaults();
}

void set_default_conv_algorithm_options(const ConvAlgorithmOptions& options) {
  std::lock_guard<std::mutex> lock(defaults_mutex());
  defaults() = options;
  // GEMMs follow cudnn.benchmark's analogue until their own options are set.
  follow_conv_algorithm_search(options.search == ConvAlgorithmSearch::Benchmark
                                   ? GemmAlgorithmSearch::Benchmark
                                   : GemmAlgorithmSearch::Heuristic);
}

Conv2d::Conv2d(std::int64_t in_channels, std::int64_t out_channels,
               std::pair<std::int64_t, std::int64_t> kernel,
               std::pair<std::int64_t, std::int64_t> stride,
               std::pair<std::int64_t, std::int64_t> padding,
               std::pair<std::int64_t, std::int64_t> dilation, std::int64_t groups, bool bias)
    : in_channels_(in_channels),
      out_channels_(out_channels),
      kernel_h_(kernel.first),
      kernel_w_(kernel.second),
      stride_h_(stride.first),
      stride_w_(stride.second),
      pad_h_(padding.first),
      pad_w_(padding.second),
      dilation_h_(dilation.first),
      dilation_w_(dilation.second),
      groups_(groups),
      algorithm_options_(default_conv_algorithm_options()) {
  if (in_channels <= 0 || out_channels <= 0 || groups <= 0 || in_channels % groups != 0 ||
      out_channels % groups != 0) {
    throw InputError("Conv2d: in_channels " + std::to_string(in_channels) + " and out_channels " +
                     std::to_string(out_channels) + " must be positive multiples of groups " +
                     std::to_string(groups));
  }
  if (kernel_h_ <= 0 || kernel_w_ <= 0 || stride_h_ <= 0 || stride_w_ <= 0 || pad_h_ < 0 ||
      pad_w_ < 0 || dilation_h_ <= 0 || dilation_w_ <= 0) {
    throw InputError("Conv2d: kernel, stride and dilation must be positive, padding non-negative");
  }
  weight_ = &add_parameter("weight", {out_channels, in_channels / groups, kernel_h_, kernel_w_});
  if (bias) bias_ = &add_parameter("bias", {out_channels}, /*no_weight_decay=*/true);
  if (!ParameterShapesOnly::active()) reset_parameters(0);
}

Conv2dGeometry Conv2d::geometry(const Shape& input, DType dtype, bool channels_last) const {
  KILN_CHECK(input.size() == 4,
             "Conv2d " + name() + ": expected (N, C, H, W), got " + shape_str(input));
  Conv2dGeometry g;
  g.batch = input[0];
  g.in_channels = input[1];
  g.height = input[2];
  g.width = input[3];
  g.out_channels = out_channels_;
  g.kernel_h = kernel_h_;
  g.kernel_w = kernel_w_;
  g.stride_h = stride_h_;
  g.stride_w = stride_w_;
  g.pad_h = pad_h_;
  g.pad_w = pad_w_;
  g.dilation_h = dilation_h_;
  g.dilation_w = dilation_w_;
  g.groups = groups_;
  g.dtype = dtype;
  g.channels_last = channels_last;
  return g;
}

Shape Conv2d::output_shape(const Shape& input) const {
  Conv2dGeometry g = geometry(input, DType::F32, false);
  if (input[1] != in_channels_ || g.out_height() <= 0 || g.out_width() <= 0) {
    throw InputError("Conv2d " + name() + ": input " + shape_str(input) + " does not fit " +
                     std::to_string(in_channels_) + " channels and a " + std::to_string(kernel_h_) +
                     "x" + std::to_string(kernel_w_) + " kernel");
  }
  return {input[0], out_channels_, g.out_height(), g.out_width()};
}

double Conv2d::forward_flops(const Shape& input) const {
  Shape out = output_shape(input);
  return 2.0 * static_cast<double>(shape_numel(out)) *
         static_cast<double>(in_channels_ / groups_ * kernel_h_ * kernel_w_);
}

void Conv2d::reset_parameters(std::uint64_t seed) {
  // kaiming_uniform(a=sqrt(5)) reduces to U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
  double bound =
      1.0 / std::sqrt(static_cast<double>(in_channels_ / groups_ * kernel_h_ * kernel_w_));
  ops::fill_uniform(weight_->value, -bound, bound, seed, 0);
  if (bias_) ops::fill_uniform(bias_->value, -bound, bound, seed, std::uint64_t{1} << 40);
}

Tensor Conv2d::forward_impl(Context& ctx, const Tensor& x) {
  output_shape(x.shape());  // validates
  saved_channels_last_ = ctx.run.channels_last;
  saved_input_dtype_ = x.dtype();
  if (x.device().is_cuda()) return forward_cuda(ctx, x);
  Tensor y = forward_cpu(to_physical(x, false));
  return ctx.run.channels_last ? from_physical(to_physical(y, true), true) : y;
}

Tensor Conv2d::backward_impl(Context& ctx, const Tensor& dy) {
  KILN_CHECK(saved_x_.defined(), "Conv2d " + name() + ": backward without forward");
  if (dy.device().is_cuda()) return backward_cuda(ctx, dy);
  Tensor dx = backward_cpu(to_physical(dy, false));
  if (!dx.defined()) return dx;
  return saved_channels_last_ ? from_physical(to_physical(dx, true), true) : dx;
}

// ---- CPU: im2col + GEMM ------------------------------------------------------------------------
// col is (C*R*S, N*OH*OW): row (c, r, s), column (n, oh, ow), so one GEMM per group gives the
// output for the whole batch as (K, N*OH*OW).

namespace {

template <typename T>
void im2col(const T* x, const Conv2dGeometry& g, T* col) {
  const std::int64_t oh_n = g.out_height(), ow_n = g.out_width(), plane = oh_n * ow_n;
  const std::int64_t columns = g.batch * plane;
  for (std::int64_t c = 0; c < g.in_channels; ++c) {
    for (std::int64_t r = 0; r < g.kernel_h; ++r) {
      for (std::int64_t s = 0; s < g.kernel_w; ++s) {
        T* row = col + ((c * g.kernel_h + r) * g.kernel_w + s) * columns;
        for (std::int64_t n = 0; n < g.batch; ++n) {
          const T* xp = x + (n * g.in_channels + c) * g.height * g.width;
          for (std::int64_t oh = 0; oh < oh_n; ++oh) {
            T* dst = row + n * plane + oh * ow_n;
            std::int64_t ih = oh * g.stride_h - g.pad_h + r * g.dilation_h;
            if (ih < 0 || ih >= g.height) {
              for (std::int64_t ow = 0; ow < ow_n; ++ow) dst[ow] = T(0);
              continue;
            }
            const T* src = xp + ih * g.width;
            std::int64_t iw = s * g.dilation_w - g.pad_w;
            for (std::int64_t ow = 0; ow < ow_n; ++ow, iw += g.stride_w) {
              dst[ow] = (iw >= 0 && iw < g.width) ? src[iw] : T(0);
            }
          }
        }
      }
    }
  }
}

template <typename T>
void col2im(const T* col, const Conv2dGeometry& g, T* dx) {
  const std::int64_t oh_n = g.out_height(), ow_n = g.out_width(), plane = oh_n * ow_n;
  const std::int64_t columns = g.batch * plane;
  std::fill(dx, dx + g.batch * g.in_channels * g.height * g.width, T(0));
  for (std::int64_t c = 0; c < g.in_channels; ++c) {
    for (std::int64_t r = 0; r < g.kernel_h; ++r) {
      for (std::int64_t s = 0; s < g.kernel_w; ++s) {
        const T* row = col + ((c * g.kernel_h + r) * g.kernel_w + s) * columns;
        for (std::int64_t n = 0; n < g.batch; ++n) {
          T* xp = dx + (n * g.in_channels + c) * g.height * g.width;
          for (std::int64_t oh = 0; oh < oh_n; ++oh) {
            std::int64_t ih = oh * g.stride_h - g.pad_h + r * g.dilation_h;
            if (ih < 0 || ih >= g.height) continue;
            const T* src = row + n * plane + oh * ow_n;
            T* dst = xp + ih * g.width;
            std::int64_t iw = s * g.dilation_w - g.pad_w;
            for (std::int64_t ow = 0; ow < ow_n; ++ow, iw += g.stride_w) {
              if (iw >= 0 && iw < g.width) dst[iw] += src[ow];
            }
          }
        }
      }
    }
  }
}

// (K, N*P) <-> (N, K, P): the GEMM's output order and the activation order.
template <typename T>
void kn_to_nk(const T* src, std::int64_t k_n, std::int64_t n_n, std::int64_t p, const T* bias,
              T* dst) {
  for (std::int64_t n = 0; n < n_n; ++n) {
    for (std::int64_t k = 0; k < k_n; ++k) {
      const T* s = src + k * n_n * p + n * p;
      T* d = dst + (n * k_n + k) * p;
      T b = bias ? bias[k] : T(0);
      for (std::int64_t i = 0; i < p; ++i) d[i] = s[i] + b;
    }
  }
}

template <typename T>
void nk_to_kn(const T* src, std::int64_t k_n, std::int64_t n_n, std::int64_t p, T* dst) {
  for (std::int64_t n = 0; n < n_n; ++n) {
    for (std::int64_t k = 0; k < k_n; ++k) {
      const T* s = src + (n * k_n + k) * p;
      std::copy(s, s + p, dst + k * n_n * p + n * p);
    }
  }
}

// Runs fn(T{}) with T = double for f64 and float otherwise (the CPU compute types).
template <typename Fn>
void dispatch_real(DType dtype, Fn fn) {
  if (dtype == DType::F64) {
    fn(double{});
  } else {
    fn(float{});
  }
}

DType cpu_compute_dtype(DType t) {
  return t == DType::F64 ? DType::F64 : DType::F32;
}

}  // namespace

Tensor Conv2d::forward_cpu(const Tensor& x_nchw) {
  DType cd = cpu_compute_dtype(x_nchw.dtype());
  Tensor x = x_nchw.to(cd).contiguous();  // (N, C, H, W)
  Conv2dGeometry g = geometry(x.shape(), cd, false);
  const std::int64_t plane = g.out_height() * g.out_width(), columns = g.batch * plane;
  const std::int64_t crs_g = in_channels_ / groups_ * kernel_h_ * kernel_w_,
                     k_g = out_channels_ / groups_;
  Tensor col = Tensor::empty({in_channels_ * kernel_h_ * kernel_w_, columns}, cd);
  Tensor out_kn = Tensor::empty({out_channels_, columns}, cd);  // (K, N*OH*OW)
  Tensor w = weight_->value.to(cd).contiguous().view({out_channels_, crs_g});
  dispatch_real(cd, [&](auto tag) {
    using T = decltype(tag);
    im2col(x.data<T>(), g, col.data<T>());
  });
  for (std::int64_t grp = 0; grp < groups_; ++grp) {
    Tensor out_g = out_kn.slice(0, grp * k_g, (grp + 1) * k_g);
    ops::gemm(false, false, 1.0, w.slice(0, grp * k_g, (grp + 1) * k_g),
              col.slice(0, grp * crs_g, (grp + 1) * crs_g), 0.0, out_g);
  }
  Tensor y = Tensor::empty({g.batch, out_channels_, g.out_height(), g.out_width()}, cd);
  Tensor b = bias_ ? bias_->value.to(cd).contiguous() : Tensor();
  dispatch_real(cd, [&](auto tag) {
    using T = decltype(tag);
    kn_to_nk(out_kn.data<T>(), out_channels_, g.batch, plane,
             bias_ ? b.data<T>() : static_cast<const T*>(nullptr), y.data<T>());
  });
  saved_x_ = x;
  saved_geometry_ = g;
  // Keeping col saves backward an im2col; above 64 MiB (large CPU ResNets) it is recomputed.
  saved_col_ = training() && col.nbytes() <= (std::size_t{64} << 20) ? col : Tensor();
  return y.to(saved_input_dtype_);
}

Tensor Conv2d::backward_cpu(const Tensor& dy_nchw) {
  const Conv2dGeometry& g = saved_geometry_;
  DType cd = g.dtype;
  Tensor dy = dy_nchw.to(cd).contiguous();  // (N, K, OH, OW)
  const std::int64_t plane = g.out_height() * g.out_width(), columns = g.batch * plane;
  const std::int64_t crs_g = in_channels_ / groups_ * kernel_h_ * kernel_w_,
                     k_g = out_channels_ / groups_;
  Tensor dy_kn = Tensor::empty({out_channels_, columns}, cd);  // (K, N*OH*OW)
  dispatch_real(cd, [&](auto tag) {
    using T = decltype(tag);
    nk_to_kn(dy.data<T>(), out_channels_, g.batch, plane, dy_kn.data<T>());
  });
  if (bias_) {
    Tensor db = ops::reduce_rows(dy_kn, ops::Reduction::Sum);  // (K)
    ops::axpy(1.0, db.to(bias_->grad.dtype()), bias_->grad);
  }
  Tensor col = saved_col_;
  saved_col_ = Tensor();
  if (!col.defined()) {
    col = Tensor::empty({in_channels_ * kernel_h_ * kernel_w_, columns}, cd);
    dispatch_real(cd, [&](auto tag) {
      using T = decltype(tag);
      im2col(saved_x_.data<T>(), g, col.data<T>());
    });
  }
  // Weight gradient straight into the accumulator when it has the compute dtype.
  Tensor& grad = weight_->grad;
  bool direct = grad.dtype() == cd && grad.is_contiguous();
  Tensor dw =
      direct ? grad.view({out_channels_, crs_g}) : Tensor::zeros({out_channels_, crs_g}, cd);
  Tensor w = weight_->value.to(cd).contiguous().view({out_channels_, crs_g});
  const bool want_dx = input_gradient();
  Tensor dcol = want_dx ? Tensor::empty(col.shape(), cd) : Tensor();
  for (std::int64_t grp = 0; grp < groups_; ++grp) {
    Tensor dy_g = dy_kn.slice(0, grp * k_g, (grp + 1) * k_g);  // (K/g, N*P)
    Tensor dw_g = dw.slice(0, grp * k_g, (grp + 1) * k_g);     // (K/g, CRS/g)
    ops::gemm(false, true, 1.0, dy_g, col.slice(0, grp * crs_g, (grp + 1) * crs_g), 1.0, dw_g);
    if (!want_dx) continue;
    Tensor dcol_g = dcol.slice(0, grp * crs_g, (grp + 1) * crs_g);
    ops::gemm(true, false, 1.0, w.slice(0, grp * k_g, (grp + 1) * k_g), dy_g, 0.0, dcol_g);
  }
  if (!direct) ops::axpy(1.0, dw.view(grad.shape()).to(grad.dtype()), grad);
  if (!want_dx) return Tensor();
  Tensor dx = Tensor::empty(saved_x_.shape(), cd);
  dispatch_real(cd, [&](auto tag) {
    using T = decltype(tag);
    col2im(dcol.data<T>(), g, dx.data<T>());
  });
  return dx.to(saved_input_dtype_);
}

// ---- CUDA: cuDNN (layers/cuda/conv2d.cc) -------------------------------------------------------

namespace {
// GEMM-like work runs in the policy's matmul dtype (O1 casts fp32 activations to half).
DType cuda_compute_dtype(const Context& ctx, DType input) {
  if (is_half(input)) return input;
  KILN_CHECK(input == DType::F32, "Conv2d on CUDA runs in f32, f16 or bf16, not f64");
  return is_half(ctx.run.precision.matmul) ? ctx.run.precision.matmul : DType::F32;
}
}  // namespace

Tensor Conv2d::compute_weight(const Context& ctx, DType dtype, bool channels_last) {
  const Tensor& w = weight_->value;
  if (w.dtype() == dtype) {
    return channels_last ? w.permute({0, 2, 3, 1}).contiguous() : w.contiguous();
  }
  // A cast to half: once per optimizer update, as Apex O1 does.
  return weight_cache_.get(w, dtype, ctx.weights_version, channels_last);
}

void Conv2d::accumulate_weight_gradient(const Tensor& dw, bool channels_last) {
  Tensor& grad = weight_->grad;
  Tensor dw_kcrs = (channels_last ? dw.permute({0, 3, 1, 2}) : dw).to(grad.dtype()).contiguous();
  ops::axpy(1.0, dw_kcrs, grad);
}

Tensor Conv2d::forward_cuda(Context& ctx, const Tensor& x) {
  const bool cl = ctx.run.channels_last;
  DType cd = cuda_compute_dtype(ctx, x.dtype());
  Conv2dGeometry g = geometry(x.shape(), cd, cl);
  std::string why;
  if (!cudnn_conv::can_implement(g, &why)) {
    throw Error("Conv2d " + name() + ": cuDNN cannot run " + g.str() + ": " + why);
  }
  last_algorithms_ = cudnn_conv::setup(g, algorithm_options_);
  Tensor xp = to_physical(x, cl).to(cd);
  Tensor w = compute_weight(ctx, cd, cl);
  Shape y_shape = cl ? Shape{g.batch, g.out_height(), g.out_width(), out_channels_}
                     : Shape{g.batch, out_channels_, g.out_height(), g.out_width()};
  Tensor yp = Tensor::empty(y_shape, cd, x.device());
  cudnn_conv::forward(g, last_algorithms_, xp, w, yp);
  if (bias_) cudnn_conv::add_bias(yp, bias_->value.to(cd), cl);
  saved_x_ = xp;
  saved_geometry_ = g;
  return from_physical(yp.to(x.dtype()), cl);
}

Tensor Conv2d::backward_cuda(Context& ctx, const Tensor& dy) {
  const Conv2dGeometry& g = saved_geometry_;
  const bool cl = g.channels_last;
  const DType cd = g.dtype;
  Tensor dyp = to_physical(dy, cl).to(cd);
  Tensor w = compute_weight(ctx, cd, cl);
  Tensor dxp;
  if (input_gradient()) {
    dxp = Tensor::empty(saved_x_.shape(), cd, dy.device());
    cudnn_conv::backward_data(g, last_algorithms_, dyp, w, dxp);
  }

  Tensor& grad = weight_->grad;
  if (!cl && grad.dtype() == cd && grad.is_contiguous()) {
    cudnn_conv::backward_filter(g, last_algorithms_, saved_x_, dyp, grad, 1.0);
  } else {
    Tensor dw = Tensor::empty(w.shape(), cd, dy.device());
    cudnn_conv::backward_filter(g, last_algorithms_, saved_x_, dyp, dw, 0.0);
    accumulate_weight_gradient(dw, cl);
  }
  if (bias_) {
    // (N*OH*OW, K) columns for NHWC; (N, K, OH*OW) rows then columns for NCHW.
    Tensor db = cl ? ops::reduce_cols(dyp.view({-1, out_channels_}), ops::Reduction::Sum)
                   : ops::reduce_cols(ops::reduce_rows(dyp.view({g.batch * out_channels_, -1}),
                                                       ops::Reduction::Sum)
                                          .view({g.batch, out_channels_}),
                                      ops::Reduction::Sum);
    ops::axpy(1.0, db.to(bias_->grad.dtype()), bias_->grad);
  }
  if (!dxp.defined()) return dxp;
  return from_physical(dxp.to(saved_input_dtype_), cl);
}

}  // namespace kiln
