// GPT-2 for causal language modelling, transformers' GPT2LMHeadModel's layout and names:
//   ids (B, T) I64 -> transformer.wte + transformer.wpe (positions 0..T-1), transformer.drop
//   -> transformer.h.N (pre-LN blocks, causal attention, GELU tanh) -> transformer.ln_f
//   -> lm_head tied to transformer.wte (no bias) -> logits (B, T, vocab).
// The Conv1D weights (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) are kept as (out, in) and
// stored transposed, (in, out), in files (Parameter::stored_transposed).
// Init as transformers: N(0, 0.02) weights and embeddings, zero biases, LayerNorm 1 and 0, and
// the residual projections (c_proj) N(0, 0.02 / sqrt(2 * layers)).
// With Context::kv_cache the input holds only new tokens, at positions past..past+T-1.

#include <array>
#include <cmath>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "core/ops.h"
#include "layers/attention.h"
#include "layers/embedding.h"
#include "layers/layernorm.h"
#include "layers/models/model.h"
#include "layers/tied_decoder.h"
#include "layers/transformer_block.h"

namespace kiln {
namespace {

constexpr double kGptLayerNormEps = 1e-5;

class Gpt2LMHeadModel : public HeadedLanguageModel {
 public:
  explicit Gpt2LMHeadModel(const ModelOptions& o)
      : vocab_(o.vocab_size), hidden_(o.hidden_size), max_positions_(o.max_positions) {
    wte_ = &add_child("transformer.wte", std::make_unique<Embedding>(o.vocab_size, o.hidden_size));
    wpe_ =
        &add_child("transformer.wpe", std::make_unique<Embedding>(o.max_positions, o.hidden_size));
    drop_ = &add_child("transformer.drop", std::make_unique<Dropout>(o.dropout));
    TransformerBlockConfig block =
        TransformerBlockConfig::gpt2(o.hidden_size, o.num_heads, o.intermediate_size, o.dropout);
    block.fp8 = o.fp8;
    block.recompute_mlp_activation = !o.keep_mlp_activation;
    blocks_.build(
        o.num_layers, block,
        o.recompute_blocks, [this](int i, std::unique_ptr<TransformerBlock> block) -> auto& {
          return add_child("transformer.h." + std::to_string(i), std::move(block));
        });
    ln_f_ = &add_child("transformer.ln_f",
                       std::make_unique<LayerNorm>(o.hidden_size, kGptLayerNormEps));
    lm_head_ = &add_child(
        "lm_head", std::make_unique<TiedDecoder>(&wte_->weight(), vocab_, hidden_, /*bias=*/false));
    head_ = lm_head_;
  }
  std::string type() const override { return "GPT2LMHeadModel"; }
  Shape output_shape(const Shape& input) const override { return {input[0], input[1], vocab_}; }
  double forward_flops(const Shape& input) const override {
    Shape h = {input[0], input[1], hidden_};
    return blocks_.forward_flops(h) + lm_head_->forward_flops(h);
  }
  void reset_parameters(std::uint64_t seed) override {
    const double residual_std =
        0.02 / std::sqrt(2.0 * static_cast<double>(blocks_.blocks().size()));
    std::uint64_t index = 0;
    for (Parameter* p : parameters()) {
      ++index;
      const std::string& n = p->name;
      auto ends_with = [&](const std::string& s) {
        return n.size() >= s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0;
      };
      if (p->value.dim() == 1) {
        p->value.fill(n.find(".ln_") != std::string::npos && ends_with(".weight") ? 1.0 : 0.0);
      } else {
        ops::fill_normal(p->value, 0.0, ends_with("c_proj.weight") ? residual_std : 0.02,
                         seed * 1000003ull + index);
      }
    }
  }

 protected:
  Tensor forward_body(Context& ctx, const Tensor& ids) override {  // (B, T) -> (B, T, E)
    KILN_CHECK(ids.dim() == 2, "GPT-2: expected ids (B, T), got " + ids.str());
    const std::int64_t b = ids.size(0), t = ids.size(1);
    const std::int64_t past = ctx.call.kv_cache ? ctx.call.kv_cache->past : 0;
    if (past + t > max_positions_)
      throw InputError("GPT-2: " + std::to_string(past + t) + " positions exceed max_positions " +
                       std::to_string(max_positions_));
    Tensor& positions = position_ids_[{past, b, t}];
    if (!positions.defined() || positions.device() != ids.device()) {
      std::vector<std::int64_t> pos(static_cast<std::size_t>(b * t));
      for (std::int64_t i = 0; i < b * t; ++i) pos[static_cast<std::size_t>(i)] = past + i % t;
      positions = Tensor::from_vector(pos, {b, t}).to(ids.device());
    }
    Tensor h = wte_->forward(ctx, ids);
    ops::add(h, wpe_->forward(ctx, positions), h);
    h = drop_->forward(ctx, h);
    return ln_f_->forward(ctx, blocks_.forward(ctx, std::move(h)));
  }
  void backward_body(Context& ctx, const Tensor& dh) override {
    Tensor g = ln_f_->backward(ctx, dh);
    g = drop_->backward(ctx, blocks_.backward(ctx, std::move(g)));
    wpe_->backward(ctx, g);
    wte_->backward(ctx, g);  // after lm_head's: it fires on_grad_ready for the summed gradient
  }

 private:
  std::int64_t vocab_, hidden_, max_positions_;
  Embedding* wte_;
  Embedding* wpe_;
  Dropout* drop_;
  TransformerStack blocks_;  // transformer.h.N
  LayerNorm* ln_f_;
  TiedDecoder* lm_head_;
  std::map<std::array<std::int64_t, 3>, Tensor> position_ids_;  // by (past, B, T)
};

}  // namespace

Model make_gpt2(const ModelOptions& options) {
  if (options.seq_len <= 0 || options.seq_len > options.max_positions)
    throw InputError("GPT-2: seq_len " + std::to_string(options.seq_len) +
                     " must be in [1, max_positions = " + std::to_string(options.max_positions) +
                     "]");
  if (options.hidden_size % options.num_heads != 0)
    throw InputError("GPT-2: hidden_size " + std::to_string(options.hidden_size) +
                     " is not a multiple of num_heads " + std::to_string(options.num_heads));
  return token_model(std::make_unique<Gpt2LMHeadModel>(options), options, Task::CausalLM);
}

}  // namespace kiln
