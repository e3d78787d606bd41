// The llama family for causal language modelling, transformers' LlamaForCausalLM and
// Qwen2ForCausalLM layout and names:
//   ids (B, T) I64 -> model.embed_tokens -> model.layers.N (pre-norm decoder layers)
//   -> model.norm -> lm_head (tied to model.embed_tokens, or a Linear of its own) -> (B, T, V)
// A decoder layer: h = x + self_attn(input_layernorm(x)); y = h + mlp(post_attention_layernorm(h))
// with RMSNorm, grouped-query causal attention with rotary positions and the SwiGLU MLP. The
// residual additions ride in post_attention_layernorm's pass and in down_proj's GEMM epilogue.
// Init as transformers: N(0, initializer_range 0.02) weights and embeddings, zero biases,
// RMSNorm 1. With Context::kv_cache the input holds only new tokens, at positions past..past+T-1.
// With model.lora (ModelOptions::lora), LoRA adapters on the projections it names (PEFT's names:
// model.layers.N.self_attn.q_proj.lora_A.weight) and every other parameter frozen.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/ops.h"
#include "layers/attention.h"
#include "layers/embedding.h"
#include "layers/grouped_query_attention.h"
#include "layers/layernorm.h"
#include "layers/linear.h"
#include "layers/models/model.h"
#include "layers/swiglu_mlp.h"
#include "layers/tied_decoder.h"

namespace kiln {
namespace {

class LlamaDecoderLayer : public Layer {
 public:
  LlamaDecoderLayer(const ModelOptions& o, const GroupedQueryAttentionConfig& attention,
                    std::shared_ptr<const RotaryEmbedding> rotary) {
    input_norm_ = &add_child("input_layernorm",
                             std::make_unique<RMSNorm>(o.hidden_size, o.llama.rms_norm_eps));
    attention_ = &add_child("self_attn",
                            std::make_unique<GroupedQueryAttention>(attention, std::move(rotary)));
    post_norm_ = &add_child("post_attention_layernorm",
                            std::make_unique<RMSNorm>(o.hidden_size, o.llama.rms_norm_eps));
    mlp_ =
        &add_child("mlp", std::make_unique<SwiGluMlp>(o.hidden_size, o.intermediate_size, o.lora));
    attention_->use_fp8(o.fp8);
    mlp_->use_fp8(o.fp8);
  }
  std::string type() const override { return "LlamaDecoderLayer"; }
  Shape output_shape(const Shape& input) const override { return input; }
  double forward_flops(const Shape& input) const override {
    return attention_->forward_flops(input) + mlp_->forward_flops(input);
  }

 protected:
  Tensor forward_impl(Context& ctx, const Tensor& x) override {
    Tensor a = attention_->forward(ctx, input_norm_->forward(ctx, x));
    post_norm_->add_to_next_input(a);  // h = x + a, normalised in the same pass
    Tensor n = post_norm_->forward(ctx, x);
    mlp_->down_proj().add_to_next_output(post_norm_->residual_sum());  // y = h + mlp(n)
    return mlp_->forward(ctx, n);
  }
  Tensor backward_impl(Context& ctx, const Tensor& dy) override {
    Tensor dm = mlp_->backward(ctx, dy);
    post_norm_->add_to_next_dx(dy);
    Tensor dh = post_norm_->backward(ctx, dm);
    Tensor da = attention_->backward(ctx, dh);
    input_norm_->add_to_next_dx(dh);
    return input_norm_->backward(ctx, da);
  }

 private:
  RMSNorm* input_norm_;
  GroupedQueryAttention* attention_;
  RMSNorm* post_norm_;
  SwiGluMlp* mlp_;
};

class LlamaForCausalLM : public HeadedLanguageModel {
 public:
  explicit LlamaForCausalLM(const ModelOptions& o)
      : vocab_(o.vocab_size), hidden_(o.hidden_size), max_positions_(o.max_positions) {
    GroupedQueryAttentionConfig attention;
    attention.hidden = o.hidden_size;
    attention.heads = o.num_heads;
    attention.kv_heads = o.llama.num_kv_heads > 0 ? o.llama.num_kv_heads : o.num_heads;
    attention.head_dim = o.llama.head_dim;
    attention.qkv_bias = o.llama.qkv_bias;
    attention.max_positions = o.max_positions;
    attention.rotary.theta = o.llama.rope_theta;
    attention.rotary.llama3_factor = o.llama.rope_llama3_factor;
    attention.rotary.low_freq_factor = o.llama.rope_low_freq_factor;
    attention.rotary.high_freq_factor = o.llama.rope_high_freq_factor;
    attention.rotary.original_max_positions = o.llama.rope_original_max_positions;
    attention.lora = o.lora;
    const std::int64_t head_dim =
        attention.head_dim > 0 ? attention.head_dim : o.hidden_size / o.num_heads;
    auto rotary = std::make_shared<RotaryEmbedding>(head_dim, o.max_positions, attention.rotary);

    embed_ =
        &add_child("model.embed_tokens", std::make_unique<Embedding>(o.vocab_size, o.hidden_size));
    for (int i = 0; i < o.num_layers; ++i) {
      LlamaDecoderLayer& layer =
          add_child("model.layers." + std::to_string(i),
                    std::make_unique<LlamaDecoderLayer>(o, attention, rotary));
      layer.set_recompute(o.recompute_blocks);
      layers_.push_back(&layer);
    }
    norm_ =
        &add_child("model.norm", std::make_unique<RMSNorm>(o.hidden_size, o.llama.rms_norm_eps));
    if (o.llama.tie_embeddings) {
      head_ = &add_child("lm_head", std::make_unique<TiedDecoder>(&embed_->weight(), vocab_,
                                                                  hidden_, /*bias=*/false));
    } else {
      head_ = &add_child("lm_head", std::make_unique<Linear>(hidden_, vocab_, /*bias=*/false));
    }
    if (o.lora.enabled()) {
      for (Parameter* p : parameters()) {
        p->frozen = !is_lora_parameter(p->name);
        if (p->frozen) p->grad = Tensor();
      }
    }
  }
  std::string type() const override { return "LlamaForCausalLM"; }
  Shape output_shape(const Shape& input) const override { return {input[0], input[1], vocab_}; }
  double forward_flops(const Shape& input) const override {
    Shape h = {input[0], input[1], hidden_};
    double f = head_->forward_flops(h);
    for (const Layer* layer : layers_) f += layer->forward_flops(h);
    return f;
  }
  void reset_parameters(std::uint64_t seed) override {
    std::uint64_t index = 0;
    std::uint64_t adapter = 0;  // the adapters' own count: the base initialises as without them
    for (Parameter* p : parameters()) {
      if (is_lora_parameter(p->name)) {
        reset_lora_parameter(*p, (seed * 7919ull + 0x10Aull) * 1000003ull + ++adapter);
        continue;
      }
      ++index;
      const bool norm =
          p->name.find("layernorm") != std::string::npos || p->name.rfind("model.norm", 0) == 0;
      if (p->value.dim() == 1) {
        p->value.fill(norm ? 1.0 : 0.0);
      } else {
        ops::fill_normal(p->value, 0.0, 0.02, seed * 1000003ull + index);
      }
    }
  }

 protected:
  Tensor forward_body(Context& ctx, const Tensor& ids) override {  // (B, T) -> (B, T, E)
    KILN_CHECK(ids.dim() == 2, "llama: expected ids (B, T), got " + ids.str());
    const std::int64_t past = ctx.call.kv_cache ? ctx.call.kv_cache->past : 0;
    if (past + ids.size(1) > max_positions_)
      throw InputError("llama: " + std::to_string(past + ids.size(1)) +
                       " positions exceed max_positions " + std::to_string(max_positions_));
    Tensor h = embed_->forward(ctx, ids);
    for (Layer* layer : layers_) h = layer->forward(ctx, h);
    return norm_->forward(ctx, h);
  }
  void backward_body(Context& ctx, const Tensor& dh) override {
    Tensor g = norm_->backward(ctx, dh);
    for (auto it = layers_.rbegin(); it != layers_.rend(); ++it) g = (*it)->backward(ctx, g);
    embed_->backward(ctx, g);  // after a tied head's: it fires on_grad_ready for the sum
  }

 private:
  std::int64_t vocab_, hidden_, max_positions_;
  Embedding* embed_;
  std::vector<LlamaDecoderLayer*> layers_;
  RMSNorm* norm_;
};

}  // namespace

Model make_llama(const ModelOptions& o) {
  if (o.seq_len <= 0 || o.seq_len > o.max_positions)
    throw InputError("llama: seq_len " + std::to_string(o.seq_len) +
                     " must be in [1, max_positions = " + std::to_string(o.max_positions) + "]");
  if (o.llama.head_dim <= 0 && o.hidden_size % o.num_heads != 0)
    throw InputError("llama: hidden_size " + std::to_string(o.hidden_size) +
                     " is not a multiple of num_heads " + std::to_string(o.num_heads));
  const int kv = o.llama.num_kv_heads > 0 ? o.llama.num_kv_heads : o.num_heads;
  if (o.num_heads % kv != 0)
    throw InputError("llama: num_heads " + std::to_string(o.num_heads) +
                     " is not a multiple of num_kv_heads " + std::to_string(kv));
  const int head_dim = o.llama.head_dim > 0 ? o.llama.head_dim : o.hidden_size / o.num_heads;
  if (head_dim % 2 != 0)
    throw InputError("llama: head_dim " + std::to_string(head_dim) +
                     " must be even (rotary positions rotate pairs)");
  return token_model(std::make_unique<LlamaForCausalLM>(o), o, Task::CausalLM);
}

}  // namespace kiln
