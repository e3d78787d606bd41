#pragma once
// Causal self-attention with grouped-query heads and rotary positions (transformers'
// LlamaAttention / Qwen2Attention):
//   x (B, T, E) -> q = x Wq^T (+ bq)  (B*T, H d),  k, v = x Wk^T, x Wv^T (+ b)  (B*T, H_kv d)
//   q, k rotated (RotaryEmbedding, positions 0..T-1, or past..past+T-1 with a KV cache)
//   query head i attends key/value head i / (H / H_kv), causally, scale 1/sqrt(d)
//   y = context Wo^T  (no output bias)
// Parameters as transformers names them: q_proj.weight (H d, E), k_proj.weight, v_proj.weight
// (H_kv d, E), o_proj.weight (E, H d); with qkv_bias (Qwen2) q_proj.bias, k_proj.bias,
// v_proj.bias. No attention dropout (Llama's and Qwen2's attention_dropout is 0).
// The projections write one packed row per token, [q | k | v], which the rotation updates in place
// and cuDNN's fused attention reads as it is (CUDA, half activations, d a multiple of 8 up to 128;
// K and V are never replicated). Where cuDNN declines the shape or KILN_ATTENTION_CUDNN=0, Kiln's
// flash kernels read the same rows (d = 64; dK and dV summed over each group in a fixed order).
// Elsewhere (CPU, f32/f64, other d, KILN_ATTENTION_UNFUSED=1) the unfused path: scores in memory,
// K and V repeated per query head (as transformers' repeat_kv), their gradients summed back over
// the group.
// Packed documents (ctx.call.document_starts): rotary positions restart at each document's first
// token and a query attends only to its own document; served by the flash kernels (d = 64) or the
// unfused path, never cuDNN's; refused with a KV cache.
// With config.lora, LoRA adapters (layers/lora.h) add into the packed rows before the rotation
// and into the output: q_proj.lora_A.weight, ... as PEFT names them.
// Gradient contract: parameter gradients are accumulated (+=), frozen ones skipped; dx is
// written (=).

#include <cstdint>
#include <memory>
#include <vector>

#include "layers/fp8_projection.h"
#include "layers/layer.h"
#include "layers/lora.h"
#include "layers/rotary.h"
#include "layers/weight_cast_cache.h"

namespace kiln {

struct GroupedQueryAttentionConfig {
  std::int64_t hidden = 0;
  std::int64_t heads = 0;
  std::int64_t kv_heads = 0;  // divides heads
  std::int64_t head_dim = 0;  // hidden / heads unless given
  bool qkv_bias = false;
  std::int64_t max_positions = 0;
  RotaryOptions rotary;
  LoraOptions lora;  // adapters on q_proj, k_proj, v_proj, o_proj as its targets name them
};

class GroupedQueryAttention : public Layer {
 public:
  // `rotary`: the model's one table shared by its layers; null: this layer's own, from config.
  explicit GroupedQueryAttention(const GroupedQueryAttentionConfig& config,
                                 std::shared_ptr<const RotaryEmbedding> rotary = nullptr);
  std::string type() const override { return "GroupedQueryAttention"; }
  Shape output_shape(const Shape& input) const override { return input; }
  double forward_flops(const Shape& input) const override;
  // nn.Linear's default init (the model's reset_parameters overrides it).
  void reset_parameters(std::uint64_t seed) override;
  const GroupedQueryAttentionConfig& config() const { return config_; }
  // precision.fp8: the packed q/k/v and the o projections in FP8 in training (their scaling
  // states the buffers fp8_qkv_scaling and fp8_out_scaling).
  void use_fp8(const Fp8Settings& settings);

 protected:
  Tensor forward_impl(Context& ctx, const Tensor& x) override;
  Tensor backward_impl(Context& ctx, const Tensor& dy) override;
  void release_saved() override {
    if (fp8_qkv_) fp8_qkv_->release_saved();
    if (fp8_out_) fp8_out_->release_saved();
    x_mm_ = Tensor();
    qkv_ = Tensor();
    lse_ = Tensor();
    q_ = k_ = v_ = probs_ = Tensor();
    context_ = Tensor();
    document_starts_ = Tensor();
  }

 private:
  std::int64_t width() const { return (config_.heads + 2 * config_.kv_heads) * config_.head_dim; }
  // [Wq; Wk; Wv] (width, hidden) in `dtype`, made at each use (stack_rows).
  Tensor stacked_weight(DType dtype) const;
  // The unfused path: context (N, H d) from the rotated packed rows, saving q_, k_, v_, probs_.
  Tensor unfused_forward(const Tensor& qkv);
  // dqkv (N, width) from dcontext (N, H d) through the saved probabilities.
  void unfused_backward(const Tensor& dcontext, Tensor& dqkv);
  // Generation with ctx.call.kv_cache: the context of the new tokens, their keys and values
  // written to the cache first (entries (B*H_kv, capacity, d)).
  Tensor cached_attention(const Context& ctx, const Tensor& qkv);

  GroupedQueryAttentionConfig config_;
  std::shared_ptr<const RotaryEmbedding> rotary_;
  std::vector<Parameter*> weights_;  // q, k, v
  std::vector<Parameter*> biases_;   // q, k, v (qkv_bias only)
  Parameter* out_weight_;
  std::unique_ptr<Fp8Projection> fp8_qkv_, fp8_out_;
  WeightCastCache out_cache_;
  LowRankAdapter* adapters_[4] = {};  // q, k, v, o (null: none)
  // Saved by forward for backward.
  Tensor x_mm_;       // (N, E) in the matmul dtype
  Tensor qkv_;        // (N, width), rotated
  Tensor lse_;        // (B*H, T) fp32: defined iff a fused path ran (cuDNN's or the flash kernels)
  Tensor q_, k_, v_;  // unfused: (B*H, T, d), k and v repeated per query head
  Tensor probs_;      // unfused: (B*H, T, T)
  Tensor context_;    // (N, H d)
  Tensor document_starts_;  // (B, T) I32: the forward's CallInputs::document_starts, or undefined
  // The fused path was cuDNN's attention (lse_ its natural-log statistics), not the flash kernels.
  bool cudnn_fused_ = false;
  DType activation_ = DType::F32;
  std::int64_t batch_ = 0, tokens_ = 0;
};

}  // namespace kiln
