#include "layers/transformer_block.h"

#include "core/ops.h"

namespace kiln {

// HuggingFace BertLayer is the defaults with these sizes; the other presets start from it.
TransformerBlockConfig TransformerBlockConfig::bert(std::int64_t hidden, std::int64_t heads,
                                                    std::int64_t intermediate, double dropout) {
  TransformerBlockConfig c;
  c.hidden = hidden;
  c.heads = heads;
  c.intermediate = intermediate;
  c.dropout = dropout;
  c.attention_dropout = dropout;
  return c;
}

TransformerBlockConfig TransformerBlockConfig::vit(std::int64_t hidden, std::int64_t heads,
                                                   std::int64_t intermediate, double dropout) {
  TransformerBlockConfig c = bert(hidden, heads, intermediate, dropout);
  c.attention_dropout = 0.0;
  c.layer_norm_eps = 1e-6;
  c.pre_norm = true;
  c.mlp_inner_dropout = true;
  c.qkv_layout = QkvLayout::FusedQKV;
  c.attention_name = "self_attention";
  c.attention_norm_name = "ln_1";
  c.mlp_in_name = "mlp.0";
  c.mlp_out_name = "mlp.3";
  c.mlp_norm_name = "ln_2";
  return c;
}

TransformerBlockConfig TransformerBlockConfig::gpt2(std::int64_t hidden, std::int64_t heads,
                                                    std::int64_t intermediate, double dropout) {
  TransformerBlockConfig c = bert(hidden, heads, intermediate, dropout);
  c.layer_norm_eps = 1e-5;
  c.pre_norm = true;
  c.qkv_layout = QkvLayout::FusedConv1D;
  c.causal = true;
  c.mlp_activation = Activation::GELU;
  c.recompute_mlp_activation = true;
  c.attention_name = "attn";
  c.attention_norm_name = "ln_1";
  c.mlp_in_name = "mlp.c_fc";
  c.mlp_out_name = "mlp.c_proj";
  c.mlp_norm_name = "ln_2";
  return c;
}

TransformerBlock::TransformerBlock(const TransformerBlockConfig& config) : config_(config) {
  const auto& c = config_;
  auto norm = [&] { return std::make_unique<LayerNorm>(c.hidden, c.layer_norm_eps); };
  // Registration order follows the reference's parameter order.
  if (c.pre_norm) norm1_ = &add_child(c.attention_norm_name, norm());
  attention_ = &add_child(c.attention_name,
                          std::make_unique<MultiHeadSelfAttention>(
                              c.hidden, c.heads, c.attention_dropout, c.qkv_layout, c.causal));
  if (!c.pre_norm) norm1_ = &add_child(c.attention_norm_name, norm());
  if (c.pre_norm) norm2_ = &add_child(c.mlp_norm_name, norm());
  mlp_in_ = &add_child(c.mlp_in_name,
                       std::make_unique<Linear>(c.hidden, c.intermediate, true, c.mlp_activation));
  mlp_out_ = &add_child(c.mlp_out_name, std::make_unique<Linear>(c.intermediate, c.hidden));
  if (c.qkv_layout == QkvLayout::FusedConv1D) {
    mlp_in_->weight().stored_transposed = true;
    mlp_out_->weight().stored_transposed = true;
  }
  if (!c.pre_norm) norm2_ = &add_child(c.mlp_norm_name, norm());
  if (!c.mlp_inner_dropout) mlp_out_->take_input_from(mlp_in_);
  attention_output_dropout_ =
      &add_child("attention_output_dropout", std::make_unique<Dropout>(c.dropout));
  if (c.mlp_inner_dropout)
    mlp_inner_dropout_ = &add_child("mlp_inner_dropout", std::make_unique<Dropout>(c.dropout));
  mlp_output_dropout_ = &add_child("mlp_output_dropout", std::make_unique<Dropout>(c.dropout));
  attention_->use_fp8(c.fp8);
  mlp_in_->use_fp8(c.fp8);
  mlp_out_->use_fp8(c.fp8);
}

double TransformerBlock::forward_flops(const Shape& input) const {
  Shape inner = input;
  inner.back() = config_.intermediate;
  return attention_->forward_flops(input) + mlp_in_->forward_flops(input) +
         mlp_out_->forward_flops(inner);
}

namespace {

// a + b in a's shape and dtype.
Tensor sum(const Tensor& a, const Tensor& b) {
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  ops::add(a.contiguous(), b.to(a.dtype()).contiguous().view(a.shape()), out);
  return out;
}

}  // namespace

Tensor TransformerBlock::forward_impl(Context& ctx, const Tensor& x) {
  KILN_CHECK(x.dim() == 3 && x.size(2) == config_.hidden,
             "TransformerBlock " + name() + ": expected (B, T, " + std::to_string(config_.hidden) +
                 "), got " + x.str());
  auto mlp = [&](const Tensor& h) {
    Tensor f = mlp_in_->forward(ctx, h);
    if (mlp_inner_dropout_) f = mlp_inner_dropout_->forward(ctx, f);
    Tensor y = mlp_out_->forward(ctx, f);
    recomputed_mlp_ = config_.recompute_mlp_activation && !mlp_inner_dropout_ && ctx.training &&
                      mlp_in_->can_recompute_output();
    if (recomputed_mlp_) mlp_out_->drop_saved_input();
    return mlp_output_dropout_->forward(ctx, y);
  };
  if (config_.pre_norm) {
    Tensor a =
        attention_output_dropout_->forward(ctx, attention_->forward(ctx, norm1_->forward(ctx, x)));
    // h = x + a and LN2(h) in one pass; y = h + mlp(LN2(h)) in c_proj's GEMM epilogue when no
    // dropout stands between them.
    norm2_->add_to_next_input(a);
    Tensor n = norm2_->forward(ctx, x);
    const Tensor& h = norm2_->residual_sum();
    if (!ctx.training || mlp_output_dropout_->p() == 0.0) {
      mlp_out_->add_to_next_output(h);
      return mlp(n);  // (B, T, E)
    }
    return sum(h, mlp(n));  // (B, T, E)
  }
  Tensor a = attention_output_dropout_->forward(ctx, attention_->forward(ctx, x));
  Tensor h = norm1_->forward(ctx, sum(x, a));   // (B, T, E)
  return norm2_->forward(ctx, sum(h, mlp(h)));  // (B, T, E)
}

Tensor TransformerBlock::backward_impl(Context& ctx, const Tensor& dy) {
  auto mlp_backward = [&](const Tensor& d) {
    if (recomputed_mlp_) mlp_out_->restore_saved_input(mlp_in_->recompute_output());
    Tensor g = mlp_out_->backward(ctx, mlp_output_dropout_->backward(ctx, d));
    if (mlp_inner_dropout_) g = mlp_inner_dropout_->backward(ctx, g);
    return mlp_in_->backward(ctx, g);
  };
  auto attention_backward = [&](const Tensor& d) {
    return attention_->backward(ctx, attention_output_dropout_->backward(ctx, d));
  };
  if (config_.pre_norm) {
    // Each LayerNorm's backward adds the residual path's gradient to its dx.
    Tensor dm = mlp_backward(dy);
    norm2_->add_to_next_dx(dy);
    Tensor dh = norm2_->backward(ctx, dm);
    Tensor da = attention_backward(dh);
    norm1_->add_to_next_dx(dh);
    return norm1_->backward(ctx, da);
  }
  Tensor ds2 = norm2_->backward(ctx, dy);
  Tensor dh = sum(ds2, mlp_backward(ds2));
  Tensor ds1 = norm1_->backward(ctx, dh);
  return sum(ds1, attention_backward(ds1));
}

Tensor TransformerStack::forward(Context& ctx, Tensor h) const {
  for (TransformerBlock* block : blocks_) h = block->forward(ctx, h);
  return h;
}

Tensor TransformerStack::backward(Context& ctx, Tensor g) const {
  for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) g = (*it)->backward(ctx, g);
  return g;
}

double TransformerStack::forward_flops(const Shape& input) const {
  double f = 0;
  for (const TransformerBlock* block : blocks_) f += block->forward_flops(input);
  return f;
}

}  // namespace kiln
