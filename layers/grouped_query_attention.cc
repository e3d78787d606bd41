#include "layers/grouped_query_attention.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "core/ops.h"
#include "layers/attention.h"
#include "layers/cuda/attention_cuda.h"

namespace kiln {
namespace {

GroupedQueryAttentionConfig completed(GroupedQueryAttentionConfig c) {
  KILN_CHECK(c.hidden > 0 && c.heads > 0 && c.kv_heads > 0 && c.heads % c.kv_heads == 0,
             "GroupedQueryAttention: heads " + std::to_string(c.heads) +
                 " must be a positive multiple of kv_heads " + std::to_string(c.kv_heads));
  if (c.head_dim <= 0) {
    KILN_CHECK(c.hidden % c.heads == 0, "GroupedQueryAttention: hidden " +
                                            std::to_string(c.hidden) + " is not a multiple of " +
                                            "heads " + std::to_string(c.heads));
    c.head_dim = c.hidden / c.heads;
  }
  return c;
}

// The fused paths (cuDNN's attention, else Kiln's flash kernels where they serve the shape) take
// CUDA half activations; KILN_ATTENTION_UNFUSED=1 forces the unfused path and
// KILN_ATTENTION_CUDNN=0 the flash kernels (read at each call, so a test can compare them).
bool fused_attention_wanted(Device dev, DType mm) {
  const char* unfused = std::getenv("KILN_ATTENTION_UNFUSED");
  return dev.is_cuda() && is_half(mm) && (unfused == nullptr || std::strcmp(unfused, "0") == 0);
}

// (N, X d) token-major rows <-> (B*X, T, d) head-major.
Tensor rows_to_heads(const Tensor& rows, std::int64_t b, std::int64_t t, std::int64_t x,
                     std::int64_t d) {
  return rows.contiguous()
      .view({b, t, x, d})
      .permute({0, 2, 1, 3})
      .contiguous()
      .view({b * x, t, d});
}
Tensor heads_to_rows(const Tensor& heads, std::int64_t b, std::int64_t t, std::int64_t x,
                     std::int64_t d) {
  return heads.view({b, x, t, d}).permute({0, 2, 1, 3}).contiguous().view({b * t, x * d});
}

// kv (B, H_kv, T', d) -> (B*H, T', d), key/value head j serving query heads j*g .. j*g + g - 1.
Tensor repeat_groups(const Tensor& kv, std::int64_t group) {
  const std::int64_t b = kv.size(0), hkv = kv.size(1), t = kv.size(2), d = kv.size(3);
  Tensor out = Tensor::empty({b, hkv, group, t, d}, kv.dtype(), kv.device());
  for (std::int64_t j = 0; j < group; ++j) out.select(2, j).copy_from(kv);
  return out.view({b * hkv * group, t, d});
}

}  // namespace

Tensor GroupedQueryAttention::stacked_weight(DType dtype) const {
  return stack_rows({&weights_[0]->value, &weights_[1]->value, &weights_[2]->value}, dtype);
}

GroupedQueryAttention::GroupedQueryAttention(const GroupedQueryAttentionConfig& config,
                                             std::shared_ptr<const RotaryEmbedding> rotary)
    : config_(completed(config)), rotary_(std::move(rotary)) {
  const auto& c = config_;
  if (!rotary_) rotary_ = std::make_shared<RotaryEmbedding>(c.head_dim, c.max_positions, c.rotary);
  KILN_CHECK(rotary_->head_dim() == c.head_dim,
             "GroupedQueryAttention: the rotary table's head_dim " +
                 std::to_string(rotary_->head_dim()) + " is not " + std::to_string(c.head_dim));
  const std::int64_t rows[3] = {c.heads * c.head_dim, c.kv_heads * c.head_dim,
                                c.kv_heads * c.head_dim};
  const char* names[3] = {"q_proj", "k_proj", "v_proj"};
  for (int i = 0; i < 3; ++i) {
    weights_.push_back(&add_parameter(std::string(names[i]) + ".weight", {rows[i], c.hidden}));
    if (c.qkv_bias)
      biases_.push_back(&add_parameter(std::string(names[i]) + ".bias", {rows[i]}, true));
  }
  out_weight_ = &add_parameter("o_proj.weight", {c.hidden, c.heads * c.head_dim});
  if (!ParameterShapesOnly::active()) GroupedQueryAttention::reset_parameters(0);
  const std::int64_t ins[4] = {c.hidden, c.hidden, c.hidden, c.heads * c.head_dim};
  const std::int64_t outs[4] = {rows[0], rows[1], rows[2], c.hidden};
  const char* all[4] = {"q_proj", "k_proj", "v_proj", "o_proj"};
  for (int i = 0; i < 4; ++i)
    if (c.lora.targets_module(all[i]))
      adapters_[i] = &add_child(all[i], std::make_unique<LowRankAdapter>(ins[i], outs[i], c.lora));
}

void GroupedQueryAttention::use_fp8(const Fp8Settings& settings) {
  if (!settings.enabled) return;
  const Shape shape = Fp8Projection::state_shape(settings);
  fp8_qkv_ = std::make_unique<Fp8Projection>(add_buffer("fp8_qkv_scaling", shape), settings);
  fp8_out_ = std::make_unique<Fp8Projection>(add_buffer("fp8_out_scaling", shape), settings);
}

double GroupedQueryAttention::forward_flops(const Shape& input) const {
  if (input.size() != 3) return 0;
  const double b = static_cast<double>(input[0]), t = static_cast<double>(input[1]);
  const double e = static_cast<double>(config_.hidden);
  const double q = static_cast<double>(config_.heads * config_.head_dim);
  const double kv = static_cast<double>(config_.kv_heads * config_.head_dim);
  // The projections, then q k^T and P v (causal attention computes about half of them; the
  // count is the dense one, as for GPT-2).
  return 2 * b * t * e * (2 * q + 2 * kv) + 2 * 2 * b * t * t * q;
}

void GroupedQueryAttention::reset_parameters(std::uint64_t seed) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(config_.hidden));
  std::uint64_t stream = seed * 1000003ull;
  for (Parameter* p : weights_) ops::fill_uniform(p->value, -bound, bound, ++stream);
  for (Parameter* p : biases_) ops::fill_uniform(p->value, -bound, bound, ++stream);
  const double out_bound = 1.0 / std::sqrt(static_cast<double>(config_.heads * config_.head_dim));
  ops::fill_uniform(out_weight_->value, -out_bound, out_bound, ++stream);
}

Tensor GroupedQueryAttention::forward_impl(Context& ctx, const Tensor& x) {
  const auto& c = config_;
  KILN_CHECK(x.dim() == 3 && x.size(2) == c.hidden && is_floating(x.dtype()),
             "GroupedQueryAttention " + name() + ": expected floating (B, T, " +
                 std::to_string(c.hidden) + "), got " + x.str());
  const std::int64_t b = x.size(0), t = x.size(1), n = b * t;
  const Device dev = x.device();
  activation_ = x.dtype();
  const DType mm = transformer_ops::matmul_dtype(ctx, activation_);
  batch_ = b;
  tokens_ = t;

  // [q | k | v] = x [Wq; Wk; Wv]^T (+ b), one packed row per token, one GEMM.
  x_mm_ = x.contiguous().view({n, c.hidden}).to(mm);
  Tensor qkv = Tensor::empty({n, width()}, mm, dev);
  project_forward(fp8_qkv_.get(), ctx, x_mm_, stacked_weight(mm), qkv);
  if (!biases_.empty()) {
    const Tensor bq = biases_[0]->value.view({-1, 1}), bk = biases_[1]->value.view({-1, 1}),
                 bv = biases_[2]->value.view({-1, 1});
    Tensor bias = stack_rows({&bq, &bk, &bv}, biases_[0]->value.dtype()).view({width()});
    transformer_ops::add_bias(qkv, bias);
  }
  for (std::int64_t i = 0, lo = 0; i < 3; lo += weights_[i]->value.size(0), ++i) {
    if (adapters_[i] == nullptr) continue;
    adapters_[i]->add_to_next_output(qkv.slice(1, lo, lo + weights_[i]->value.size(0)));
    adapters_[i]->forward(ctx, x_mm_);
  }
  const std::int64_t past = ctx.call.kv_cache != nullptr ? ctx.call.kv_cache->past : 0;
  document_starts_ = ctx.call.document_starts;
  if (document_starts_.defined()) {
    if (ctx.call.kv_cache != nullptr)
      throw InputError("GroupedQueryAttention " + name() +
                       ": packed documents (document starts) are not supported with a KV cache "
                       "(generation); give one sequence per row");
    KILN_CHECK(document_starts_.dtype() == DType::I32 && document_starts_.dim() == 2 &&
                   document_starts_.size(0) == b && document_starts_.size(1) == t &&
                   document_starts_.device() == dev,
               "GroupedQueryAttention " + name() + ": document starts " + document_starts_.str() +
                   " must be I32 (" + std::to_string(b) + ", " + std::to_string(t) + ") on " +
                   dev.str());
    document_starts_ = document_starts_.contiguous();
    rotary_->apply(qkv, c.heads + c.kv_heads, t, document_starts_, /*inverse=*/false);
  } else {
    rotary_->apply(qkv, c.heads + c.kv_heads, t, past, /*inverse=*/false);
  }

  Tensor context;
  if (ctx.call.kv_cache != nullptr) {
    context = cached_attention(ctx, qkv);
    release_saved();
  } else {
    KILN_CHECK(!ctx.call.attention_mask.defined(),
               "GroupedQueryAttention " + name() + ": an attention_mask is not supported");
    qkv_ = qkv;
    lse_ = Tensor();
    q_ = k_ = v_ = probs_ = Tensor();
    bool fused = false;
    cudnn_fused_ = false;
    if (fused_attention_wanted(dev, mm)) {
      DeviceGuard guard(dev);
      context_ = Tensor::empty({n, c.heads * c.head_dim}, mm, dev);
      lse_ = Tensor::empty({b * c.heads, t}, DType::F32, dev);
      // Packed documents go to the flash kernels (d = 64) or the unfused path: cuDNN's graphs
      // here take no per-query document mask.
      cudnn_fused_ = !document_starts_.defined() &&
                     cuda::cudnn_attention_forward(qkv, b, c.heads, c.kv_heads, /*causal=*/true,
                                                   context_, lse_);
      fused = cudnn_fused_;
      // Where cuDNN declines (or KILN_ATTENTION_CUDNN=0), the flash kernels read the packed GQA
      // rows as they are; lse_ then holds their log2-domain statistics.
      if (!fused && cuda::flash_attention_supported(mm, b, c.heads, c.kv_heads, c.head_dim, t)) {
        cuda::flash_attention_forward(qkv, b, c.heads, c.kv_heads, Tensor(), document_starts_,
                                      /*causal=*/true, 0.0, 0, 0, nullptr, context_, lse_);
        fused = true;
      }
      if (!fused) lse_ = Tensor();
    }
    if (!fused) context_ = unfused_forward(qkv);
    context = context_;
  }
  Tensor y = Tensor::empty({n, c.hidden}, activation_, dev);
  project_forward(fp8_out_.get(), ctx, context,
                  out_cache_.get(out_weight_->value, mm, ctx.weights_version), y);
  if (adapters_[3] != nullptr) {
    adapters_[3]->add_to_next_output(y);
    adapters_[3]->forward(ctx, context);
  }
  return y.view({b, t, c.hidden});
}

Tensor GroupedQueryAttention::unfused_forward(const Tensor& qkv) {
  const auto& c = config_;
  const std::int64_t b = batch_, t = tokens_, h = c.heads, hkv = c.kv_heads, d = c.head_dim;
  const DType mm = qkv.dtype();
  const DType sd = mm == DType::F64 ? DType::F64 : DType::F32;
  const Device dev = qkv.device();
  q_ = rows_to_heads(qkv.slice(1, 0, h * d), b, t, h, d);
  auto kv = [&](std::int64_t lo) {
    Tensor heads = rows_to_heads(qkv.slice(1, lo, lo + hkv * d), b, t, hkv, d);
    return repeat_groups(heads.view({b, hkv, t, d}), h / hkv);
  };
  k_ = kv(h * d);
  v_ = kv((h + hkv) * d);
  Tensor scores = Tensor::empty({b * h, t, t}, sd, dev);
  ops::gemm_batched(false, true, 1.0 / std::sqrt(static_cast<double>(d)), q_, k_, 0.0, scores);
  probs_ = Tensor::empty({b * h, t, t}, mm, dev);
  Tensor no_dropout;
  transformer_ops::attention_softmax(scores, Tensor(), h, /*causal=*/true, document_starts_, 0.0, 0,
                                     0, nullptr, probs_, no_dropout);
  Tensor context_heads = Tensor::empty({b * h, t, d}, mm, dev);
  ops::gemm_batched(false, false, 1.0, probs_, v_, 0.0, context_heads);
  return heads_to_rows(context_heads, b, t, h, d);
}

Tensor GroupedQueryAttention::backward_impl(Context& ctx, const Tensor& dy) {
  const auto& c = config_;
  KILN_CHECK(context_.defined(), "GroupedQueryAttention " + name() + ": backward before forward");
  const std::int64_t b = batch_, t = tokens_, n = b * t;
  KILN_CHECK(dy.numel() == n * c.hidden, "GroupedQueryAttention " + name() + ": dy " + dy.str() +
                                             " does not match the forward input");
  const Device dev = dy.device();
  const DType mm = context_.dtype();
  const DType sd = mm == DType::F64 ? DType::F64 : DType::F32;
  Tensor dy_mm = dy.contiguous().view({n, c.hidden}).to(mm);

  // y = context Wo^T.
  Tensor dcontext = Tensor::empty({n, c.heads * c.head_dim}, mm, dev);
  Tensor no_grad;
  project_backward(fp8_out_.get(), context_,
                   out_cache_.get(out_weight_->value, mm, ctx.weights_version), dy_mm,
                   out_weight_->frozen ? no_grad : out_weight_->grad, dcontext);
  if (adapters_[3] != nullptr) {
    adapters_[3]->add_to_next_dx(dcontext);
    adapters_[3]->backward(ctx, dy_mm);
  }

  Tensor dqkv = Tensor::empty({n, width()}, mm, dev);
  if (lse_.defined() && cudnn_fused_) {
    DeviceGuard guard(dev);
    cuda::cudnn_attention_backward(qkv_, context_, dcontext, lse_, b, c.heads, c.kv_heads,
                                   /*causal=*/true, dqkv);
  } else if (lse_.defined()) {
    DeviceGuard guard(dev);
    cuda::flash_attention_backward(qkv_, context_, dcontext, lse_, Tensor(), document_starts_, b,
                                   c.heads, c.kv_heads,
                                   /*causal=*/true, 0.0, 0, 0, nullptr, dqkv);
  } else {
    unfused_backward(dcontext, dqkv);
  }
  if (document_starts_.defined()) {
    rotary_->apply(dqkv, c.heads + c.kv_heads, t, document_starts_, /*inverse=*/true);
  } else {
    rotary_->apply(dqkv, c.heads + c.kv_heads, t, 0, /*inverse=*/true);
  }

  // The projections: one GEMM each for the stacked weight's gradient and for dx; the weight and
  // bias gradients then go to their parts.
  // Frozen projections (LoRA's base) are frozen together: no weight or bias gradient.
  const bool trained = !weights_[0]->frozen;
  Tensor bias_sums;
  if (!biases_.empty() && trained) {
    bias_sums = Tensor::zeros({width()}, sd, dev);
    transformer_ops::accumulate_bias_grad(dqkv, bias_sums);
  }
  Tensor dw;
  if (trained) dw = Tensor::zeros({width(), c.hidden}, weights_[0]->grad.dtype(), dev);
  Tensor dx = Tensor::empty({n, c.hidden}, activation_, dev);
  project_backward(fp8_qkv_.get(), x_mm_, stacked_weight(mm), dqkv, dw, dx);
  std::int64_t lo = 0;
  for (std::size_t i = 0; i < 3 && trained; ++i) {
    const std::int64_t rows = weights_[i]->value.size(0);
    ops::accumulate(weights_[i]->grad, dw.slice(0, lo, lo + rows));
    if (bias_sums.defined()) ops::accumulate(biases_[i]->grad, bias_sums.slice(0, lo, lo + rows));
    lo += rows;
  }

  for (std::int64_t i = 0, lo = 0; i < 3; lo += weights_[i]->value.size(0), ++i) {
    if (adapters_[i] == nullptr) continue;
    adapters_[i]->add_to_next_dx(dx);
    adapters_[i]->backward(ctx, dqkv.slice(1, lo, lo + weights_[i]->value.size(0)));
  }
  return dx.view({b, t, c.hidden});
}

void GroupedQueryAttention::unfused_backward(const Tensor& dcontext, Tensor& dqkv) {
  const auto& c = config_;
  const std::int64_t b = batch_, t = tokens_, h = c.heads, hkv = c.kv_heads, d = c.head_dim;
  const std::int64_t group = h / hkv;
  const DType mm = q_.dtype();
  const DType sd = mm == DType::F64 ? DType::F64 : DType::F32;
  const Device dev = q_.device();
  Tensor dcontext_heads = rows_to_heads(dcontext, b, t, h, d);
  // Through P v.
  Tensor dprobs = Tensor::empty({b * h, t, t}, sd, dev);
  ops::gemm_batched(false, true, 1.0, dcontext_heads, v_, 0.0, dprobs);
  Tensor dv = Tensor::empty({b * h, t, d}, mm, dev);
  ops::gemm_batched(true, false, 1.0, probs_, dcontext_heads, 0.0, dv);
  // Through the softmax and S = q k^T / sqrt(d).
  Tensor dscores = Tensor::empty({b * h, t, t}, mm, dev);
  transformer_ops::attention_softmax_backward(dprobs, probs_, 0.0, 0, nullptr, dscores);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  Tensor dq = Tensor::empty({b * h, t, d}, mm, dev);
  ops::gemm_batched(false, false, scale, dscores, k_, 0.0, dq);
  Tensor dk = Tensor::empty({b * h, t, d}, mm, dev);
  ops::gemm_batched(true, false, scale, dscores, q_, 0.0, dk);
  // The repeated keys' and values' gradients summed over their query group, in the statistics'
  // dtype, then packed into the rows.
  auto group_sum = [&](const Tensor& repeated) {
    Tensor by_group = repeated.view({b, hkv, group, t, d});
    Tensor sum = by_group.select(2, 0).contiguous().to(sd);
    for (std::int64_t j = 1; j < group; ++j)
      ops::add(sum, by_group.select(2, j).contiguous().to(sd), sum);
    return sum.to(mm).view({b * hkv, t, d});
  };
  dqkv.slice(1, 0, h * d).copy_from(heads_to_rows(dq, b, t, h, d));
  dqkv.slice(1, h * d, (h + hkv) * d).copy_from(heads_to_rows(group_sum(dk), b, t, hkv, d));
  dqkv.slice(1, (h + hkv) * d, (h + 2 * hkv) * d)
      .copy_from(heads_to_rows(group_sum(dv), b, t, hkv, d));
}

Tensor GroupedQueryAttention::cached_attention(const Context& ctx, const Tensor& qkv) {
  const auto& c = config_;
  const std::int64_t b = qkv.size(0) / tokens_, t = tokens_, h = c.heads, hkv = c.kv_heads,
                     d = c.head_dim;
  KILN_CHECK(!ctx.training,
             "GroupedQueryAttention " + name() +
                 ": the KV cache path is for inference (ctx.training must be false)");
  KvCache& cache = *ctx.call.kv_cache;
  const std::int64_t past = cache.past, total = past + t;
  if (past < 0 || total > cache.capacity)
    throw InputError("GroupedQueryAttention " + name() + ": positions [" + std::to_string(past) +
                     ", " + std::to_string(total) + ") exceed the KV cache's capacity " +
                     std::to_string(cache.capacity));
  const DType mm = qkv.dtype();
  const Device dev = qkv.device();
  const Shape entry_shape{b * hkv, cache.capacity, d};
  auto [it, fresh] = cache.entries.try_emplace(layer_id());
  Tensor& keys = it->second.first;
  Tensor& values = it->second.second;
  if (fresh) {
    KILN_CHECK(past == 0,
               "GroupedQueryAttention " + name() +
                   ": the KV cache has no entry for this layer but past = " + std::to_string(past));
    keys = Tensor::empty(entry_shape, mm, dev);
    values = Tensor::empty(entry_shape, mm, dev);
  }
  for (const Tensor* entry : {&keys, &values})
    KILN_CHECK(entry->shape() == entry_shape && entry->dtype() == mm && entry->device() == dev,
               "GroupedQueryAttention " + name() + ": KV cache entry " + entry->str() +
                   " does not match (B*H_kv, capacity, d) = " + shape_str(entry_shape));
  auto store = [&](Tensor& entry, std::int64_t lo) {
    Tensor fresh_heads = rows_to_heads(qkv.slice(1, lo, lo + hkv * d), b, t, hkv, d);
    entry.view({b, hkv, cache.capacity, d})
        .slice(2, past, total)
        .copy_from(fresh_heads.view({b, hkv, t, d}));
  };
  store(keys, h * d);
  store(values, (h + hkv) * d);
  auto cached = [&](const Tensor& entry) {
    return repeat_groups(entry.view({b, hkv, cache.capacity, d}).slice(2, 0, total), h / hkv);
  };
  Tensor q = rows_to_heads(qkv.slice(1, 0, h * d), b, t, h, d);
  const DType sd = mm == DType::F64 ? DType::F64 : DType::F32;
  Tensor scores = Tensor::empty({b * h, t, total}, sd, dev);
  ops::gemm_batched(false, true, 1.0 / std::sqrt(static_cast<double>(d)), q, cached(keys), 0.0,
                    scores);
  Tensor probs = Tensor::empty({b * h, t, total}, mm, dev), no_dropout;
  transformer_ops::attention_softmax(scores, Tensor(), h, /*causal=*/true, Tensor(), 0.0, 0, 0,
                                     nullptr, probs, no_dropout);
  Tensor context_heads = Tensor::empty({b * h, t, d}, mm, dev);
  ops::gemm_batched(false, false, 1.0, probs, cached(values), 0.0, context_heads);
  return heads_to_rows(context_heads, b, t, h, d);
}

}  // namespace kiln
