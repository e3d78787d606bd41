#pragma once
// A transformer encoder block: self-attention and a GELU MLP, each with a residual connection,
// layer-normalised after (post-LN, BERT) or before (pre-LN, ViT):
//   post-LN: h = LN1(x + drop(attn(x)));      y = LN2(h + drop(W2 gelu(W1 h)))
//   pre-LN:  h = x + drop(attn(LN1(x)));      y = h + drop(W2 drop'(gelu(W1 LN2(h))))
//   x, y (B, T, hidden). drop' (ViT's dropout between the MLP linears) only when mlp_inner_dropout.
// Gradient contract: parameter gradients are accumulated (+=); dx is written (=).
// Child names are configurable so that parameter names match the reference implementation.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "layers/attention.h"
#include "layers/dropout.h"
#include "layers/layer.h"
#include "layers/layernorm.h"
#include "layers/linear.h"

namespace kiln {

struct TransformerBlockConfig {
  std::int64_t hidden = 768;
  std::int64_t heads = 12;
  std::int64_t intermediate = 3072;
  double dropout = 0.1;            // on the attention output and the MLP output
  double attention_dropout = 0.1;  // on the attention probabilities
  double layer_norm_eps = 1e-12;
  bool pre_norm = false;
  bool mlp_inner_dropout = false;
  QkvLayout qkv_layout = QkvLayout::SeparateQKV;
  bool causal = false;                              // query i attends keys j <= i (GPT)
  Activation mlp_activation = Activation::GELUErf;  // GPT-2: GELU's tanh form
  // The MLP's activation output is recomputed in backward from the pre-activation the first
  // linear keeps (Linear::recompute_output) instead of kept twice (GPT-2, unless train.recompute
  // is KEEP_ALL; where it can: CUDA O2/O3).
  bool recompute_mlp_activation = false;
  // precision.fp8: the attention's and the MLP's projections in FP8 in training.
  Fp8Settings fp8;
  // Child names: the prefixes of their parameters.
  std::string attention_name = "attention";
  std::string attention_norm_name = "attention.output.LayerNorm";
  std::string mlp_in_name = "intermediate.dense";
  std::string mlp_out_name = "output.dense";
  std::string mlp_norm_name = "output.LayerNorm";

  // HuggingFace BertLayer: post-LN, eps 1e-12, separate q/k/v, dropout everywhere.
  static TransformerBlockConfig bert(std::int64_t hidden, std::int64_t heads,
                                     std::int64_t intermediate, double dropout);
  // torchvision EncoderBlock: pre-LN (ln_1, ln_2), eps 1e-6, nn.MultiheadAttention's fused
  // in_proj, mlp.0 / mlp.3, no attention dropout.
  static TransformerBlockConfig vit(std::int64_t hidden, std::int64_t heads,
                                    std::int64_t intermediate, double dropout);
  // transformers' GPT2Block: pre-LN (ln_1, ln_2), eps 1e-5, causal attention with Conv1D c_attn
  // and c_proj, mlp.c_fc / mlp.c_proj (weights stored_transposed), GELU tanh, dropout everywhere
  // (resid_pdrop = attn_pdrop).
  static TransformerBlockConfig gpt2(std::int64_t hidden, std::int64_t heads,
                                     std::int64_t intermediate, double dropout);
};

class TransformerBlock : public Layer {
 public:
  explicit TransformerBlock(const TransformerBlockConfig& config);
  std::string type() const override { return "TransformerBlock"; }
  Shape output_shape(const Shape& input) const override { return input; }
  double forward_flops(const Shape& input) const override;

  const TransformerBlockConfig& config() const { return config_; }
  MultiHeadSelfAttention& attention() { return *attention_; }
  LayerNorm& attention_norm() { return *norm1_; }
  LayerNorm& mlp_norm() { return *norm2_; }
  Linear& mlp_in() { return *mlp_in_; }
  Linear& mlp_out() { return *mlp_out_; }

 protected:
  Tensor forward_impl(Context& ctx, const Tensor& x) override;
  Tensor backward_impl(Context& ctx, const Tensor& dy) override;

 private:
  TransformerBlockConfig config_;
  MultiHeadSelfAttention* attention_;
  LayerNorm* norm1_;
  LayerNorm* norm2_;
  Linear* mlp_in_;
  Linear* mlp_out_;
  Dropout* attention_output_dropout_;
  Dropout* mlp_inner_dropout_ = nullptr;
  Dropout* mlp_output_dropout_;
  bool recomputed_mlp_ = false;  // the last forward dropped mlp_out's input (see the config)
};

// A model's stack of blocks: forward runs them first to last, backward last to first. The
// blocks are the model's own children, so their parameter names carry the model's prefixes; the
// model registers each one through the `add` it passes to build().
class TransformerStack {
 public:
  // Makes `count` blocks of `config`, recomputed in backward when `recompute`;
  // add(i, std::unique_ptr<TransformerBlock>) registers block i as the model's child and returns
  // a reference to it.
  template <typename Add>
  void build(int count, const TransformerBlockConfig& config, bool recompute, Add&& add) {
    for (int i = 0; i < count; ++i) {
      TransformerBlock& block = add(i, std::make_unique<TransformerBlock>(config));
      block.set_recompute(recompute);
      blocks_.push_back(&block);
    }
  }
  Tensor forward(Context& ctx, Tensor h) const;    // (B, T, hidden)
  Tensor backward(Context& ctx, Tensor g) const;   // (B, T, hidden)
  double forward_flops(const Shape& input) const;  // the blocks' sum, first to last
  const std::vector<TransformerBlock*>& blocks() const { return blocks_; }

 private:
  std::vector<TransformerBlock*> blocks_;
};

}  // namespace kiln
