// BERT for masked language modelling, HuggingFace BertForMaskedLM's layout and parameter names:
//   ids (B, T) I64 -> bert.embeddings (word + position + token type, LayerNorm, dropout)
//   -> bert.encoder.layer.N (post-LN blocks) -> cls.predictions.transform (dense, GELU, LayerNorm)
//   -> decoder tied to the word embeddings + cls.predictions.bias -> logits (B, T, vocab).
// Token type ids are all zero; position ids are 0..T-1. Init as HuggingFace: N(0, 0.02) weights,
// zero biases, LayerNorm 1/0, the padding row (id 0) of the word embeddings zero.
// Gradient contract: parameter gradients accumulated (+=); the tied decoder adds into the word
// embedding's gradient before the embedding's own backward (which fires on_grad_ready for it).

#include <memory>
#include <utility>

#include "core/ops.h"
#include "layers/attention.h"
#include "layers/embedding.h"
#include "layers/layernorm.h"
#include "layers/linear.h"
#include "layers/models/model.h"
#include "layers/tied_decoder.h"
#include "layers/transformer_block.h"

namespace kiln {
namespace {

constexpr double kBertLayerNormEps = 1e-12;

class BertEmbeddings : public Layer {
 public:
  BertEmbeddings(const ModelOptions& o)
      : max_positions_(o.max_position_embeddings), hidden_(o.hidden_size) {
    word_ = &add_child("word_embeddings",
                       std::make_unique<Embedding>(o.vocab_size, o.hidden_size, /*padding_idx=*/0));
    position_ = &add_child("position_embeddings",
                           std::make_unique<Embedding>(o.max_position_embeddings, o.hidden_size));
    token_type_ = &add_child("token_type_embeddings",
                             std::make_unique<Embedding>(o.type_vocab_size, o.hidden_size));
    norm_ = &add_child("LayerNorm", std::make_unique<LayerNorm>(o.hidden_size, kBertLayerNormEps));
    dropout_ = &add_child("dropout", std::make_unique<Dropout>(o.dropout));
  }
  std::string type() const override { return "BertEmbeddings"; }
  Shape output_shape(const Shape& input) const override { return {input[0], input[1], hidden_}; }
  Embedding& word() { return *word_; }

 protected:
  Tensor forward_impl(Context& ctx, const Tensor& ids) override {  // (B, T) -> (B, T, E)
    KILN_CHECK(ids.dim() == 2, "BertEmbeddings: expected ids (B, T), got " + ids.str());
    std::int64_t b = ids.size(0), t = ids.size(1);
    if (t > max_positions_)
      throw InputError("BERT: sequence length " + std::to_string(t) + " exceeds max positions " +
                       std::to_string(max_positions_));
    if (!position_ids_.defined() || position_ids_.shape() != ids.shape() ||
        position_ids_.device() != ids.device()) {
      std::vector<std::int64_t> pos(static_cast<std::size_t>(b * t));
      for (std::int64_t i = 0; i < b * t; ++i) pos[static_cast<std::size_t>(i)] = i % t;
      position_ids_ = Tensor::from_vector(pos, {b, t}).to(ids.device());
      token_type_ids_ = Tensor::zeros({b, t}, DType::I64, ids.device());
    }
    Tensor e = word_->forward(ctx, ids);
    ops::add(e, position_->forward(ctx, position_ids_), e);
    ops::add(e, token_type_->forward(ctx, token_type_ids_), e);
    return dropout_->forward(ctx, norm_->forward(ctx, e));
  }
  Tensor backward_impl(Context& ctx, const Tensor& dy) override {
    Tensor de = norm_->backward(ctx, dropout_->backward(ctx, dy));
    word_->backward(ctx, de);
    position_->backward(ctx, de);
    token_type_->backward(ctx, de);
    return Tensor();  // ids have no gradient
  }

 private:
  std::int64_t max_positions_, hidden_;
  Embedding* word_;
  Embedding* position_;
  Embedding* token_type_;
  LayerNorm* norm_;
  Dropout* dropout_;
  Tensor position_ids_, token_type_ids_;  // (B, T), cached per shape and device
};

class BertForMaskedLM : public Layer {
 public:
  explicit BertForMaskedLM(const ModelOptions& o) : vocab_(o.vocab_size), hidden_(o.hidden_size) {
    embeddings_ = &add_child("bert.embeddings", std::make_unique<BertEmbeddings>(o));
    layers_.build(
        o.num_layers,
        TransformerBlockConfig::bert(o.hidden_size, o.num_heads, o.intermediate_size, o.dropout),
        o.recompute_blocks, [this](int i, std::unique_ptr<TransformerBlock> block) -> auto& {
          return add_child("bert.encoder.layer." + std::to_string(i), std::move(block));
        });
    transform_ = &add_child(
        "cls.predictions.transform.dense",
        std::make_unique<Linear>(o.hidden_size, o.hidden_size, true, Activation::GELUErf));
    transform_norm_ = &add_child("cls.predictions.transform.LayerNorm",
                                 std::make_unique<LayerNorm>(o.hidden_size, kBertLayerNormEps));
    decoder_ = &add_child(
        "cls.predictions",
        std::make_unique<TiedDecoder>(&embeddings_->word().weight(), vocab_, hidden_, true));
  }
  std::string type() const override { return "BertForMaskedLM"; }
  Shape output_shape(const Shape& input) const override { return {input[0], input[1], vocab_}; }
  double forward_flops(const Shape& input) const override {
    Shape h = {input[0], input[1], hidden_};
    return layers_.forward_flops(h) + transform_->forward_flops(h) + decoder_->forward_flops(h);
  }
  // HuggingFace's _init_weights: N(0, 0.02) for linear and embedding weights, zero biases,
  // LayerNorm 1 and 0, the padding row zero.
  void reset_parameters(std::uint64_t seed) override {
    std::uint64_t index = 0;
    for (Parameter* p : parameters()) {
      ++index;
      const std::string& n = p->name;
      auto ends_with = [&](const std::string& s) {
        return n.size() >= s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0;
      };
      if (ends_with("LayerNorm.weight")) {
        p->value.fill(1.0);
      } else if (ends_with("bias")) {
        p->value.fill(0.0);
      } else {
        ops::fill_normal(p->value, 0.0, 0.02, seed * 1000003ull + index);
      }
    }
    embeddings_->word().weight().value.select(0, 0).fill(0.0);
  }

 protected:
  Tensor forward_impl(Context& ctx, const Tensor& ids) override {  // (B, T) -> (B, T, V)
    Tensor h = embeddings_->forward(ctx, ids);
    h = layers_.forward(ctx, std::move(h));
    h = transform_norm_->forward(ctx, transform_->forward(ctx, h));
    return decoder_->forward(ctx, h);
  }
  Tensor backward_impl(Context& ctx, const Tensor& dy) override {
    Tensor g =
        transform_->backward(ctx, transform_norm_->backward(ctx, decoder_->backward(ctx, dy)));
    return embeddings_->backward(ctx, layers_.backward(ctx, std::move(g)));
  }

 private:
  std::int64_t vocab_, hidden_;
  BertEmbeddings* embeddings_;
  TransformerStack layers_;  // bert.encoder.layer.N
  Linear* transform_;
  LayerNorm* transform_norm_;
  TiedDecoder* decoder_;
};

}  // namespace

Model make_bert(const ModelOptions& options) {
  KILN_CHECK(options.seq_len > 0, "BERT: seq_len must be positive");
  if (options.seq_len > options.max_position_embeddings)
    throw InputError("BERT: seq_len " + std::to_string(options.seq_len) +
                     " exceeds max_position_embeddings " +
                     std::to_string(options.max_position_embeddings));
  if (options.hidden_size % options.num_heads != 0)
    throw InputError("BERT: hidden_size " + std::to_string(options.hidden_size) +
                     " is not a multiple of num_heads " + std::to_string(options.num_heads));
  return token_model(std::make_unique<BertForMaskedLM>(options), options, Task::MaskedLM);
}

}  // namespace kiln
