#include "layers/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "core/cpu/element.h"
#include "core/ops.h"
#include "layers/cuda/attention_cuda.h"
#include "layers/cuda/linear_cuda.h"
#include "layers/dropout.h"
#include "layers/linear.h"

namespace kiln {

// ---------------------------------------------------------------------------------------------
// Shared helpers.

namespace transformer_ops {

DType matmul_dtype(const Context& ctx, DType activation) {
  if (activation == DType::F64 || is_half(activation)) return activation;
  return is_half(ctx.run.precision.matmul) ? ctx.run.precision.matmul : DType::F32;
}

DType activation_dtype(const Context& ctx, DType parameter_dtype) {
  return parameter_dtype == DType::F64 ? DType::F64 : ctx.run.precision.activation;
}

void add_bias(Tensor& y, const Tensor& bias) {
  KILN_CHECK(y.dim() == 2 && y.is_contiguous() && bias.numel() == y.size(1),
             "add_bias: expected contiguous (rows, C) and (C), got " + y.str() + ", " + bias.str());
  Tensor b = bias.to(y.device()).contiguous();
  if (y.device().is_cuda()) {
    DeviceGuard guard(y.device());
    cuda::add_bias(y, b);
    return;
  }
  std::int64_t rows = y.size(0), cols = y.size(1);
  KILN_DISPATCH_FLOATING(y.dtype(), T, {
    KILN_DISPATCH_FLOATING(b.dtype(), B, {
      T* py = y.data<T>();
      const B* pb = b.data<B>();
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t c = 0; c < cols; ++c)
          py[r * cols + c] = cpu::store<T>(cpu::load(py[r * cols + c]) + cpu::load(pb[c]));
    });
  });
}

void accumulate_bias_grad(const Tensor& dy, Tensor& bias_grad) {
  Tensor d = dy.contiguous();
  if (d.device().is_cuda() && bias_grad.is_contiguous() && bias_grad.device() == d.device()) {
    DeviceGuard guard(d.device());
    cuda::accumulate_bias_grad(d, bias_grad);
    return;
  }
  Tensor sums = ops::reduce_cols(d.view({-1, bias_grad.numel()}), ops::Reduction::Sum);
  ops::accumulate(bias_grad, sums);
}

}  // namespace transformer_ops

// ---------------------------------------------------------------------------------------------
// MultiHeadSelfAttention.

namespace {

// Scores (BH, Tq, Tk): row r is query r % Tq of batch r / (heads * Tq). Causal rows are aligned
// to the bottom right: query i sits at position Tk - Tq + i and sees keys j <= Tk - Tq + i (the
// KV cache path's new tokens after `past` cached ones; Tq == Tk is plain causal attention).
// Masked keys, keys in the future and dropped entries get 0.
template <typename S, typename T>
void softmax_forward_rows(const S* scores, const float* mask, std::int64_t rows, std::int64_t tq,
                          std::int64_t tk, std::int64_t heads, bool causal,
                          const std::int32_t* starts, double p, std::uint64_t key,
                          std::uint64_t stream, T* probs, T* dropped) {
  S scale = static_cast<S>(1.0 / (1.0 - p));
  for (std::int64_t r = 0; r < rows; ++r) {
    const S* s = scores + r * tk;
    const float* m = mask ? mask + (r / (heads * tq)) * tk : nullptr;
    const std::int64_t visible = causal ? std::min(tk, tk - tq + r % tq + 1) : tk;
    const std::int64_t first = starts ? starts[(r / (heads * tq)) * tq + r % tq] : 0;
    auto attended = [&](std::int64_t j) {
      return j >= first && j < visible && (!m || m[j] != 0.0f);
    };
    S max = -std::numeric_limits<S>::infinity();
    for (std::int64_t j = 0; j < tk; ++j)
      if (attended(j)) max = std::max(max, s[j]);
    S sum = 0;
    for (std::int64_t j = 0; j < tk; ++j)
      if (attended(j)) sum += std::exp(s[j] - max);
    for (std::int64_t j = 0; j < tk; ++j) {
      S prob = (sum > 0 && attended(j)) ? std::exp(s[j] - max) / sum : S(0);
      probs[r * tk + j] = cpu::store<T>(prob);
      if (dropped) {
        bool keep = dropout_keep(key, stream, static_cast<std::uint64_t>(r * tk + j), p);
        dropped[r * tk + j] = cpu::store<T>(keep ? prob * scale : S(0));
      }
    }
  }
}

template <typename S, typename T>
void softmax_backward_rows(const S* d_dropped, const T* probs, std::int64_t rows, std::int64_t t,
                           double p, bool dropout, std::uint64_t key, std::uint64_t stream,
                           T* dscores) {
  S scale = static_cast<S>(1.0 / (1.0 - p));
  std::vector<S> dprob(static_cast<std::size_t>(t));
  for (std::int64_t r = 0; r < rows; ++r) {
    S dot = 0;
    for (std::int64_t j = 0; j < t; ++j) {
      S d = d_dropped[r * t + j];
      if (dropout)
        d = dropout_keep(key, stream, static_cast<std::uint64_t>(r * t + j), p) ? d * scale : S(0);
      dprob[j] = d;
      dot += d * static_cast<S>(cpu::load(probs[r * t + j]));
    }
    for (std::int64_t j = 0; j < t; ++j) {
      S prob = static_cast<S>(cpu::load(probs[r * t + j]));
      dscores[r * t + j] = cpu::store<T>(prob * (dprob[j] - dot));
    }
  }
}

// (N, parts*E) token-major rows -> (parts, B*H, T, d) head-major, and back: the unfused path's
// layout. CUDA uses one kernel each way; the CPU uses strided copies.
Tensor to_heads(const Tensor& src, std::int64_t parts, std::int64_t b, std::int64_t t,
                std::int64_t h, std::int64_t d) {
  Tensor out = Tensor::empty({parts, b * h, t, d}, src.dtype(), src.device());
  if (src.device().is_cuda()) {
    DeviceGuard guard(src.device());
    cuda::to_heads(src, parts, b, t, h, d, out);
    return out;
  }
  out.view({parts, b, h, t, d}).copy_from(src.view({b, t, parts, h, d}).permute({2, 0, 3, 1, 4}));
  return out;
}

Tensor from_heads(const Tensor& src, std::int64_t parts, std::int64_t b, std::int64_t t,
                  std::int64_t h, std::int64_t d) {
  Tensor out = Tensor::empty({b * t, parts * h * d}, src.dtype(), src.device());
  if (src.device().is_cuda()) {
    DeviceGuard guard(src.device());
    cuda::from_heads(src, parts, b, t, h, d, out);
    return out;
  }
  out.view({b, t, parts, h, d}).copy_from(src.view({parts, b, h, t, d}).permute({1, 3, 0, 2, 4}));
  return out;
}

// The fused kernel serves CUDA half activations with d = 64; KILN_ATTENTION_UNFUSED=1 forces
// the unfused path, to compare the two (read at each call, so a test can switch within a process).
bool use_fused_attention(Device dev, DType mm, std::int64_t b, std::int64_t h, std::int64_t d,
                         std::int64_t t) {
  const char* unfused = std::getenv("KILN_ATTENTION_UNFUSED");
  return dev.is_cuda() && (unfused == nullptr || std::strcmp(unfused, "0") == 0) &&
         cuda::flash_attention_supported(mm, b, h, /*kv_heads=*/h, d, t);
}

// y (rows, out) = x w^T + bias: on CUDA one cuBLASLt GEMM with the bias in its epilogue (the bias
// cast to y's dtype once per weights version), elsewhere a GEMM and a bias pass.
// With `fp8` (precision.fp8), the GEMM in FP8 where the projection says so.
void project(const Context& ctx, const Tensor& x, const Tensor& w, const Parameter& bias,
             WeightCastCache& bias_cache, Tensor& y, Fp8Projection* fp8) {
  if (y.device().is_cuda()) {
    DeviceGuard guard(y.device());
    Tensor saved;
    std::int64_t saved_ld = 0;
    std::optional<cuda::Fp8Forward> operands;
    if (fp8 != nullptr && fp8->begin_forward(ctx, x.size(0), x.size(1), w.size(0)))
      operands = cuda::fp8_forward_operands(*fp8, x, w, ctx.recomputing);
    cuda::linear_forward(x, w, bias_cache.get(bias.value, y.dtype(), ctx.weights_version),
                         Activation::None, y, saved, saved_ld, Tensor(),
                         operands ? &*operands : nullptr);
    return;
  }
  project_forward(fp8, ctx, x, w, y);
  transformer_ops::add_bias(y, bias.value);
}

// project's backward: weight.grad += dy^T x, bias.grad += column sums of dy, dx = dy w. On CUDA
// Linear's backward: the bias gradient in the weight-gradient GEMM's epilogue (BGRADB).
void project_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Parameter& weight,
                      Parameter& bias, Tensor& dx, Fp8Projection* fp8) {
  if (dy.device().is_cuda()) {
    DeviceGuard guard(dy.device());
    cuda::linear_backward(x, w, dy, Activation::None, Tensor(), 0, weight.grad, &bias.grad, dx,
                          nullptr, fp8 != nullptr && fp8->active() ? fp8 : nullptr);
    return;
  }
  transformer_ops::accumulate_bias_grad(dy, bias.grad);
  kiln::project_backward(fp8, x, w, dy, weight.grad, dx);
}

}  // namespace

namespace transformer_ops {

void attention_softmax(const Tensor& scores, const Tensor& mask, std::int64_t heads, bool causal,
                       const Tensor& document_starts, double p, std::uint64_t key,
                       std::uint64_t stream, const std::uint64_t* stream_source, Tensor& probs,
                       Tensor& dropped) {
  if (document_starts.defined()) {
    KILN_CHECK(scores.size(1) == scores.size(2) && document_starts.dtype() == DType::I32 &&
                   document_starts.is_contiguous() && document_starts.device() == scores.device() &&
                   document_starts.numel() * heads == scores.size(0) * scores.size(1),
               "attention_softmax: document starts " + document_starts.str() +
                   " do not match scores " + scores.str());
  }
  if (scores.device().is_cuda()) {
    DeviceGuard guard(scores.device());
    cuda::attention_softmax_forward(scores, mask, heads, causal, document_starts, p, key, stream,
                                    stream_source, probs, dropped);
    return;
  }
  if (stream_source != nullptr) stream = *stream_source;
  const std::int64_t tq = scores.size(1), tk = scores.size(2);
  KILN_DISPATCH_FLOATING(probs.dtype(), T, {
    using S = typename cpu::Compute<T>::type;
    softmax_forward_rows<S, T>(
        scores.data<S>(), mask.defined() ? mask.data<float>() : nullptr, scores.size(0) * tq, tq,
        tk, heads, causal,
        document_starts.defined() ? document_starts.data<std::int32_t>() : nullptr, p, key, stream,
        probs.data<T>(), dropped.defined() ? dropped.data<T>() : nullptr);
  });
}

void attention_softmax_backward(const Tensor& d_dropped, const Tensor& probs, double p,
                                std::uint64_t key, const std::uint64_t* stream_source,
                                Tensor& dscores) {
  if (d_dropped.device().is_cuda()) {
    DeviceGuard guard(d_dropped.device());
    cuda::attention_softmax_backward(d_dropped, probs, p, key, 0, stream_source, dscores);
    return;
  }
  const bool dropout = p > 0.0;
  const std::uint64_t stream = dropout ? *stream_source : 0;
  const std::int64_t t = probs.size(-1);
  KILN_DISPATCH_FLOATING(probs.dtype(), T, {
    using S = typename cpu::Compute<T>::type;
    softmax_backward_rows<S, T>(d_dropped.data<S>(), probs.data<T>(), probs.numel() / t, t, p,
                                dropout, key, stream, dscores.data<T>());
  });
}

}  // namespace transformer_ops

MultiHeadSelfAttention::MultiHeadSelfAttention(std::int64_t hidden, std::int64_t heads,
                                               double attention_dropout, QkvLayout layout,
                                               bool causal)
    : hidden_(hidden),
      heads_(heads),
      dropout_(attention_dropout),
      layout_(layout),
      causal_(causal) {
  KILN_CHECK(hidden > 0 && heads > 0 && hidden % heads == 0,
             "MultiHeadSelfAttention: hidden " + std::to_string(hidden) +
                 " must be a positive multiple of heads " + std::to_string(heads));
  KILN_CHECK(attention_dropout >= 0.0 && attention_dropout < 1.0,
             "MultiHeadSelfAttention: dropout must be in [0, 1)");
  head_dim_ = hidden / heads;
  if (layout == QkvLayout::SeparateQKV) {
    for (const char* part : {"query", "key", "value"}) {
      std::string base = std::string("self.") + part;
      qkv_weights_.push_back(&add_parameter(base + ".weight", {hidden, hidden}));
      qkv_biases_.push_back(&add_parameter(base + ".bias", {hidden}, /*no_weight_decay=*/true));
    }
    out_weight_ = &add_parameter("output.dense.weight", {hidden, hidden});
    out_bias_ = &add_parameter("output.dense.bias", {hidden}, true);
  } else if (layout == QkvLayout::FusedQKV) {
    qkv_weights_.push_back(&add_parameter("in_proj_weight", {3 * hidden, hidden}));
    qkv_biases_.push_back(&add_parameter("in_proj_bias", {3 * hidden}, true));
    out_weight_ = &add_parameter("out_proj.weight", {hidden, hidden});
    out_bias_ = &add_parameter("out_proj.bias", {hidden}, true);
  } else {
    qkv_weights_.push_back(&add_parameter("c_attn.weight", {3 * hidden, hidden}));
    qkv_biases_.push_back(&add_parameter("c_attn.bias", {3 * hidden}, true));
    out_weight_ = &add_parameter("c_proj.weight", {hidden, hidden});
    out_bias_ = &add_parameter("c_proj.bias", {hidden}, true);
    qkv_weights_[0]->stored_transposed = true;
    out_weight_->stored_transposed = true;
  }
  qkv_cache_.resize(qkv_weights_.size());
  if (!ParameterShapesOnly::active()) MultiHeadSelfAttention::reset_parameters(0);
}

void MultiHeadSelfAttention::use_fp8(const Fp8Settings& settings) {
  if (!settings.enabled) return;
  const Shape shape = Fp8Projection::state_shape(settings);
  // Separate q/k/v projections (BERT) keep their three GEMMs in the GEMM dtype.
  if (layout_ != QkvLayout::SeparateQKV)
    fp8_qkv_ = std::make_unique<Fp8Projection>(add_buffer("fp8_qkv_scaling", shape), settings);
  fp8_out_ = std::make_unique<Fp8Projection>(add_buffer("fp8_out_scaling", shape), settings);
}

double MultiHeadSelfAttention::forward_flops(const Shape& input) const {
  if (input.size() != 3) return 0;
  double b = static_cast<double>(input[0]), t = static_cast<double>(input[1]);
  double e = static_cast<double>(hidden_);
  return 4 * 2 * b * t * e * e + 2 * 2 * b * t * t * e;
}

void MultiHeadSelfAttention::reset_parameters(std::uint64_t seed) {
  double linear_bound = 1.0 / std::sqrt(static_cast<double>(hidden_));
  std::uint64_t stream = seed * 1000003ull;
  if (layout_ == QkvLayout::SeparateQKV) {
    for (std::size_t i = 0; i < 3; ++i) {
      ops::fill_uniform(qkv_weights_[i]->value, -linear_bound, linear_bound, ++stream);
      ops::fill_uniform(qkv_biases_[i]->value, -linear_bound, linear_bound, ++stream);
    }
    ops::fill_uniform(out_bias_->value, -linear_bound, linear_bound, ++stream);
  } else {
    double xavier = std::sqrt(6.0 / static_cast<double>(hidden_ + 3 * hidden_));
    ops::fill_uniform(qkv_weights_[0]->value, -xavier, xavier, ++stream);
    qkv_biases_[0]->value.fill(0.0);
    out_bias_->value.fill(0.0);
  }
  ops::fill_uniform(out_weight_->value, -linear_bound, linear_bound, ++stream);
}

Tensor MultiHeadSelfAttention::forward_impl(Context& ctx, const Tensor& x) {
  KILN_CHECK(x.dim() == 3 && x.size(2) == hidden_,
             "MultiHeadSelfAttention " + name() + ": expected (B, T, " + std::to_string(hidden_) +
                 "), got " + x.str());
  KILN_CHECK(is_floating(x.dtype()),
             "MultiHeadSelfAttention " + name() + ": floating input expected");
  const std::int64_t b = x.size(0), t = x.size(1), e = hidden_, h = heads_, d = head_dim_;
  const std::int64_t n = b * t;
  Device dev = x.device();
  activation_ = x.dtype();
  DType mm = transformer_ops::matmul_dtype(ctx, activation_);
  batch_ = b;
  tokens_ = t;

  // qkv = x W^T + b  (N, 3E)
  x_mm_ = x.contiguous().view({n, e}).to(mm);
  Tensor qkv = Tensor::empty({n, 3 * e}, mm, dev);
  if (layout_ != QkvLayout::SeparateQKV) {
    const Tensor& w = qkv_cache_[0].get(qkv_weights_[0]->value, mm, ctx.weights_version);
    project(ctx, x_mm_, w, *qkv_biases_[0], qkv_bias_cache_, qkv, fp8_qkv_.get());
  } else {
    Tensor qkv_bias = Tensor::empty({3 * e}, qkv_biases_[0]->value.dtype(), dev);
    for (std::size_t i = 0; i < 3; ++i) {
      const Tensor& w = qkv_cache_[i].get(qkv_weights_[i]->value, mm, ctx.weights_version);
      std::int64_t lo = static_cast<std::int64_t>(i) * e;
      Tensor part = qkv.slice(1, lo, lo + e);
      ops::gemm(false, true, 1.0, x_mm_, w, 0.0, part);
      qkv_bias.slice(0, lo, lo + e).copy_from(qkv_biases_[i]->value);
    }
    transformer_ops::add_bias(qkv, qkv_bias);
  }

  if (ctx.call.kv_cache != nullptr) {
    // Generation: nothing is saved for backward, which then reports a backward before forward.
    Tensor context = cached_attention(ctx, qkv);  // (N, E)
    release_saved();
    Tensor y = Tensor::empty({n, e}, activation_, dev);
    project(ctx, context, out_cache_.get(out_weight_->value, mm, ctx.weights_version), *out_bias_,
            out_bias_cache_, y, nullptr);
    return y.view({b, t, e});
  }

  if (ctx.call.document_starts.defined())
    throw InputError("MultiHeadSelfAttention " + name() +
                     ": packed documents (data.document_boundary_token) need rotary positions "
                     "(the llama family); this model's positions cannot restart per document");
  Tensor mask;
  if (ctx.call.attention_mask.defined()) {
    KILN_CHECK(ctx.call.attention_mask.dim() == 2 && ctx.call.attention_mask.size(0) == b &&
                   ctx.call.attention_mask.size(1) == t,
               "MultiHeadSelfAttention " + name() + ": attention_mask " +
                   ctx.call.attention_mask.str() + " does not match input " + x.str());
    mask = ctx.call.attention_mask.to(dev, DType::F32).contiguous();
  }
  dropout_active_ = ctx.training && dropout_ > 0.0;
  dropout_key_ = dropout_key(ctx.run.seed, layer_id());
  dropout_stream_source_ = ctx.step.step;
  KILN_CHECK(!dropout_active_ || dropout_stream_source_ != nullptr,
             "MultiHeadSelfAttention " + name() +
                 ": dropout in training without the step counter (Context::step.step)");
  double p = dropout_active_ ? dropout_ : 0.0;
  lse_ = Tensor();
  mask_ = Tensor();
  qkv_ = Tensor();
  if (use_fused_attention(dev, mm, b, h, d, t)) {
    DeviceGuard guard(dev);
    qkv_ = qkv;
    q_ = k_ = v_ = probs_ = dropped_probs_ = Tensor();
    context_ = Tensor::empty({n, e}, mm, dev);
    lse_ = Tensor::empty({b * h, t}, DType::F32, dev);
    mask_ = mask;
    cudnn_fused_ = !mask.defined() && p == 0.0 &&
                   cuda::cudnn_attention_forward(qkv_, b, h, h, causal_, context_, lse_);
    if (!cudnn_fused_)
      cuda::flash_attention_forward(qkv_, b, h, /*kv_heads=*/h, mask, Tensor(), causal_, p,
                                    dropout_key_, dropout_stream_, dropout_stream_source_, context_,
                                    lse_);
  } else {
    // (B, T, 3, H, d) -> (3, B*H, T, d)
    Tensor heads_major = to_heads(qkv, 3, b, t, h, d);
    q_ = heads_major.select(0, 0);
    k_ = heads_major.select(0, 1);
    v_ = heads_major.select(0, 2);
    context_ = from_heads(unfused_forward(mask, p), 1, b, t, h, d);  // (N, E)
  }

  // y = ctx W_o^T + b_o
  Tensor y = Tensor::empty({n, e}, activation_, dev);
  project(ctx, context_, out_cache_.get(out_weight_->value, mm, ctx.weights_version), *out_bias_,
          out_bias_cache_, y, fp8_out_.get());
  return y.view({b, t, e});
}

Tensor MultiHeadSelfAttention::unfused_forward(const Tensor& mask, double p) {
  const std::int64_t b = batch_, t = tokens_, h = heads_, d = head_dim_;
  Device dev = q_.device();
  DType mm = q_.dtype();
  DType sd = mm == DType::F64 ? DType::F64 : DType::F32;
  // S = q k^T / sqrt(d)  (BH, T, T)
  Tensor scores = Tensor::empty({b * h, t, t}, sd, dev);
  ops::gemm_batched(false, true, 1.0 / std::sqrt(static_cast<double>(d)), q_, k_, 0.0, scores);
  probs_ = Tensor::empty({b * h, t, t}, mm, dev);
  dropped_probs_ = dropout_active_ ? Tensor::empty({b * h, t, t}, mm, dev) : Tensor();
  transformer_ops::attention_softmax(scores, mask, h, causal_, Tensor(), p, dropout_key_,
                                     dropout_stream_, dropout_stream_source_, probs_,
                                     dropped_probs_);
  if (!dropout_active_) dropped_probs_ = probs_;

  // ctx = P' v  (BH, T, d)
  Tensor context_heads = Tensor::empty({b * h, t, d}, mm, dev);
  ops::gemm_batched(false, false, 1.0, dropped_probs_, v_, 0.0, context_heads);
  return context_heads;
}

Tensor MultiHeadSelfAttention::backward_impl(Context& ctx, const Tensor& dy) {
  KILN_CHECK(context_.defined(), "MultiHeadSelfAttention " + name() + ": backward before forward");
  const std::int64_t b = batch_, t = tokens_, e = hidden_, h = heads_, d = head_dim_;
  const std::int64_t n = b * t;
  KILN_CHECK(dy.numel() == n * e, "MultiHeadSelfAttention " + name() + ": dy " + dy.str() +
                                      " does not match the forward input");
  Device dev = dy.device();
  DType mm = context_.dtype();
  DType sd = mm == DType::F64 ? DType::F64 : DType::F32;
  Tensor dy2 = dy.contiguous().view({n, e});
  Tensor dy_mm = dy2.to(mm);

  // Output projection.
  Tensor dcontext = Tensor::empty({n, e}, mm, dev);
  project_backward(context_, out_cache_.get(out_weight_->value, mm, ctx.weights_version), dy_mm,
                   *out_weight_, *out_bias_, dcontext, fp8_out_.get());
  double p = dropout_active_ ? dropout_ : 0.0;
  Tensor dqkv;  // (N, 3E)
  if (lse_.defined()) {
    DeviceGuard guard(dev);
    dqkv = Tensor::empty({n, 3 * e}, mm, dev);
    if (cudnn_fused_) {
      cuda::cudnn_attention_backward(qkv_, context_, dcontext, lse_, b, h, h, causal_, dqkv);
    } else {
      cuda::flash_attention_backward(qkv_, context_, dcontext, lse_, mask_, Tensor(), b, h,
                                     /*kv_heads=*/h, causal_, p, dropout_key_, dropout_stream_,
                                     dropout_stream_source_, dqkv);
    }
  } else {
    Tensor dcontext_heads = to_heads(dcontext, 1, b, t, h, d).view({b * h, t, d});
    Tensor dqkv_heads = Tensor::empty({3, b * h, t, d}, mm, dev);
    Tensor dq = dqkv_heads.select(0, 0), dk = dqkv_heads.select(0, 1), dv = dqkv_heads.select(0, 2);
    unfused_backward(dcontext_heads, p, dq, dk, dv);
    dqkv = from_heads(dqkv_heads, 3, b, t, h, d);
  }

  // Input projections.
  Tensor dx = Tensor::empty({n, e}, activation_, dev);
  if (layout_ != QkvLayout::SeparateQKV) {
    project_backward(x_mm_, qkv_cache_[0].get(qkv_weights_[0]->value, mm, ctx.weights_version),
                     dqkv, *qkv_weights_[0], *qkv_biases_[0], dx, fp8_qkv_.get());
  } else {
    Tensor bias_sums = Tensor::zeros({3 * e}, sd, dev);  // (3E)
    transformer_ops::accumulate_bias_grad(dqkv, bias_sums);
    for (std::size_t i = 0; i < 3; ++i) {
      std::int64_t lo = static_cast<std::int64_t>(i) * e;
      Tensor part = dqkv.slice(1, lo, lo + e);
      ops::accumulate(qkv_biases_[i]->grad, bias_sums.slice(0, lo, lo + e));
      ops::gemm_accumulate(true, false, part, x_mm_, qkv_weights_[i]->grad);
      ops::gemm(false, false, 1.0, part,
                qkv_cache_[i].get(qkv_weights_[i]->value, mm, ctx.weights_version),
                i == 0 ? 0.0 : 1.0, dx);
    }
  }
  return dx.view({b, t, e});
}

void MultiHeadSelfAttention::unfused_backward(const Tensor& dcontext_heads, double p, Tensor& dq,
                                              Tensor& dk, Tensor& dv) {
  const std::int64_t b = batch_, t = tokens_, h = heads_, d = head_dim_;
  Device dev = q_.device();
  DType mm = q_.dtype();
  DType sd = mm == DType::F64 ? DType::F64 : DType::F32;
  // Through P' v.
  Tensor d_dropped = Tensor::empty({b * h, t, t}, sd, dev);
  ops::gemm_batched(false, true, 1.0, dcontext_heads, v_, 0.0, d_dropped);
  ops::gemm_batched(true, false, 1.0, dropped_probs_, dcontext_heads, 0.0, dv);

  // Through dropout and softmax.
  Tensor dscores = Tensor::empty({b * h, t, t}, mm, dev);
  transformer_ops::attention_softmax_backward(d_dropped, probs_, p, dropout_key_,
                                              dropout_active_ ? dropout_stream_source_ : nullptr,
                                              dscores);

  // Through S = q k^T / sqrt(d).
  double scale = 1.0 / std::sqrt(static_cast<double>(d));
  ops::gemm_batched(false, false, scale, dscores, k_, 0.0, dq);
  ops::gemm_batched(true, false, scale, dscores, q_, 0.0, dk);
}

Tensor MultiHeadSelfAttention::cached_attention(const Context& ctx, const Tensor& qkv) {
  const std::int64_t b = batch_, t = tokens_, h = heads_, d = head_dim_;
  KILN_CHECK(causal_, "MultiHeadSelfAttention " + name() +
                          ": a KV cache is for causal attention; this layer is not causal");
  KILN_CHECK(!ctx.training,
             "MultiHeadSelfAttention " + name() +
                 ": the KV cache path is for inference (ctx.training must be false)");
  if (ctx.call.attention_mask.defined())
    throw InputError("MultiHeadSelfAttention " + name() +
                     ": attention_mask is not supported with a KV cache");
  KvCache& cache = *ctx.call.kv_cache;
  const std::int64_t past = cache.past, total = past + t;
  if (past < 0 || total > cache.capacity)
    throw InputError("MultiHeadSelfAttention " + name() + ": positions [" + std::to_string(past) +
                     ", " + std::to_string(total) + ") exceed the KV cache's capacity " +
                     std::to_string(cache.capacity));
  const DType mm = qkv.dtype();
  const Device dev = qkv.device();
  const Shape entry_shape{b * h, cache.capacity, d};
  auto [it, fresh] = cache.entries.try_emplace(layer_id());
  Tensor& keys = it->second.first;
  Tensor& values = it->second.second;
  if (fresh) {
    KILN_CHECK(past == 0, "MultiHeadSelfAttention " + name() + ": the KV cache has no entry for " +
                              "this layer but past = " + std::to_string(past));
    keys = Tensor::empty(entry_shape, mm, dev);
    values = Tensor::empty(entry_shape, mm, dev);
  }
  for (const Tensor* entry : {&keys, &values}) {
    KILN_CHECK(entry->shape() == entry_shape && entry->dtype() == mm && entry->device() == dev,
               "MultiHeadSelfAttention " + name() + ": KV cache entry " + entry->str() +
                   " does not match (B*H, capacity, d) = " + shape_str(entry_shape) + " in " +
                   dtype_name(mm));
  }

  // (N, 3E) -> (3, B*H, T, d); the new keys and values go to positions [past, past + T).
  Tensor heads_major = to_heads(qkv, 3, b, t, h, d);
  keys.slice(1, past, total).copy_from(heads_major.select(0, 1));
  values.slice(1, past, total).copy_from(heads_major.select(0, 2));
  Tensor q = heads_major.select(0, 0);  // (BH, T, d)

  // S = q k^T / sqrt(d) over every cached key (BH, T, past + T); new query i sees keys
  // 0..past + i (the softmax's bottom-right causal alignment).
  DType sd = mm == DType::F64 ? DType::F64 : DType::F32;
  Tensor scores = Tensor::empty({b * h, t, total}, sd, dev);
  ops::gemm_batched(false, true, 1.0 / std::sqrt(static_cast<double>(d)), q,
                    keys.slice(1, 0, total), 0.0, scores);
  Tensor probs = Tensor::empty({b * h, t, total}, mm, dev), no_dropout;
  transformer_ops::attention_softmax(scores, Tensor(), h, /*causal=*/true, Tensor(), 0.0, 0, 0,
                                     nullptr, probs, no_dropout);
  Tensor context_heads = Tensor::empty({b * h, t, d}, mm, dev);  // (BH, T, d)
  ops::gemm_batched(false, false, 1.0, probs, values.slice(1, 0, total), 0.0, context_heads);
  return from_heads(context_heads, 1, b, t, h, d);  // (N, E)
}

}  // namespace kiln
