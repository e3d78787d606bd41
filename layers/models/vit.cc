// ViT-B/16, torchvision vit_b_16's layout and parameter names:
//   images (B, C, H, W) -> conv_proj (16x16 stride 16, as patch extraction + GEMM with the conv
//   weight (E, C, 16, 16)) -> (B, L, E) -> prepend class_token, + encoder.pos_embedding
//   (1, L+1, E) -> encoder.dropout -> encoder.layers.encoder_layer_N (pre-LN blocks)
//   -> encoder.ln -> token 0 -> heads.head -> logits (B, classes).
// Sizes come from ModelOptions (hidden_size, num_layers, num_heads, intermediate_size,
// image_size, image_channels, num_classes, dropout; torchvision's vit_b_16 has dropout 0).
// Init as torchvision, except that conv_proj's truncated normal is a plain normal
// N(0, 1/fan_in): class_token 0, pos_embedding N(0, 0.02), MLP xavier_uniform weights and
// N(0, 1e-6) biases, attention as nn.MultiheadAttention, LayerNorm 1/0, heads.head zero.
// Gradient contract: parameter gradients accumulated (+=); the image gradient is written (=).

#include <cmath>
#include <memory>
#include <utility>

#include "core/ops.h"
#include "layers/attention.h"
#include "layers/layernorm.h"
#include "layers/linear.h"
#include "layers/models/model.h"
#include "layers/transformer_block.h"

namespace kiln {
namespace {

constexpr std::int64_t kPatch = 16;
constexpr double kVitLayerNormEps = 1e-6;

// Non-overlapping patch convolution: (B, C, H, W) -> (B, (H/P)*(W/P), E).
class PatchEmbedding : public Layer {
 public:
  PatchEmbedding(std::int64_t channels, std::int64_t hidden, std::int64_t patch)
      : channels_(channels), hidden_(hidden), patch_(patch) {
    weight_ = &add_parameter("weight", {hidden, channels, patch, patch});
    bias_ = &add_parameter("bias", {hidden}, /*no_weight_decay=*/true);
    if (!ParameterShapesOnly::active()) PatchEmbedding::reset_parameters(0);
  }
  std::string type() const override { return "PatchEmbedding"; }
  Shape output_shape(const Shape& in) const override {
    return {in[0], (in[2] / patch_) * (in[3] / patch_), hidden_};
  }
  double forward_flops(const Shape& in) const override {
    return 2.0 * static_cast<double>(shape_numel(output_shape(in))) *
           static_cast<double>(channels_ * patch_ * patch_);
  }
  // PyTorch's Conv2d default: U(+-1/sqrt(fan_in)).
  void reset_parameters(std::uint64_t seed) override {
    double bound = 1.0 / std::sqrt(static_cast<double>(channels_ * patch_ * patch_));
    ops::fill_uniform(weight_->value, -bound, bound, seed * 2 + 1);
    ops::fill_uniform(bias_->value, -bound, bound, seed * 2 + 2);
  }
  Parameter& weight() { return *weight_; }
  Parameter& bias() { return *bias_; }

 protected:
  Tensor forward_impl(Context& ctx, const Tensor& x) override {
    KILN_CHECK(x.dim() == 4 && x.size(1) == channels_,
               "conv_proj: expected (B, " + std::to_string(channels_) + ", H, W), got " + x.str());
    if (x.size(2) % patch_ != 0 || x.size(3) % patch_ != 0)
      throw InputError("ViT: image size " + std::to_string(x.size(2)) + "x" +
                       std::to_string(x.size(3)) + " is not a multiple of the patch size " +
                       std::to_string(patch_));
    image_shape_ = x.shape();
    std::int64_t b = x.size(0), hp = x.size(2) / patch_, wp = x.size(3) / patch_;
    std::int64_t k = channels_ * patch_ * patch_, n = b * hp * wp;
    DType act = transformer_ops::activation_dtype(ctx, weight_->value.dtype());
    DType mm = transformer_ops::matmul_dtype(ctx, act);
    // (B, C, Hp, P, Wp, P) -> (B, Hp, Wp, C, P, P): rows in the conv weight's (c, kh, kw) order.
    patches_ = x.to(mm)
                   .contiguous()
                   .view({b, channels_, hp, patch_, wp, patch_})
                   .permute({0, 2, 4, 1, 3, 5})
                   .contiguous()
                   .view({n, k});
    Tensor y = Tensor::empty({n, hidden_}, act, x.device());
    ops::gemm(false, true, 1.0, patches_,
              cache_.get(weight_->value, mm, ctx.weights_version).view({hidden_, k}), 0.0, y);
    transformer_ops::add_bias(y, bias_->value);
    activation_ = act;
    return y.view({b, hp * wp, hidden_});
  }
  Tensor backward_impl(Context& ctx, const Tensor& dy) override {
    std::int64_t b = image_shape_[0], hp = image_shape_[2] / patch_, wp = image_shape_[3] / patch_;
    std::int64_t k = channels_ * patch_ * patch_, n = b * hp * wp;
    DType mm = patches_.dtype();
    Tensor dy2 = dy.contiguous().view({n, hidden_});
    Tensor dy_mm = dy2.to(mm);
    transformer_ops::accumulate_bias_grad(dy2, bias_->grad);
    Tensor grad2 = weight_->grad.view({hidden_, k});
    ops::gemm_accumulate(true, false, dy_mm, patches_, grad2);
    Tensor dpatches = Tensor::empty({n, k}, activation_, dy.device());
    ops::gemm(false, false, 1.0, dy_mm,
              cache_.get(weight_->value, mm, ctx.weights_version).view({hidden_, k}), 0.0,
              dpatches);
    return dpatches.view({b, hp, wp, channels_, patch_, patch_})
        .permute({0, 3, 1, 4, 2, 5})
        .contiguous()
        .view(image_shape_);
  }

 private:
  std::int64_t channels_, hidden_, patch_;
  Parameter* weight_;
  Parameter* bias_;
  WeightCastCache cache_;
  Tensor patches_;  // (N, C*P*P) in the matmul dtype
  Shape image_shape_;
  DType activation_ = DType::F32;
};

class VisionTransformer : public Layer {
 public:
  explicit VisionTransformer(const ModelOptions& o)
      : image_size_(o.image_size), hidden_(o.hidden_size), classes_(o.num_classes) {
    std::int64_t side = o.image_size / kPatch;
    tokens_ = side * side + 1;
    class_token_ = &add_parameter("class_token", {1, 1, hidden_});
    conv_proj_ = &add_child("conv_proj",
                            std::make_unique<PatchEmbedding>(o.image_channels, hidden_, kPatch));
    pos_embedding_ = &add_parameter("encoder.pos_embedding", {1, tokens_, hidden_});
    dropout_ = &add_child("encoder.dropout", std::make_unique<Dropout>(o.dropout));
    layers_.build(
        o.num_layers,
        TransformerBlockConfig::vit(hidden_, o.num_heads, o.intermediate_size, o.dropout),
        o.recompute_blocks, [this](int i, std::unique_ptr<TransformerBlock> block) -> auto& {
          return add_child("encoder.layers.encoder_layer_" + std::to_string(i), std::move(block));
        });
    norm_ = &add_child("encoder.ln", std::make_unique<LayerNorm>(hidden_, kVitLayerNormEps));
    head_ = &add_child("heads.head", std::make_unique<Linear>(hidden_, classes_));
  }
  std::string type() const override { return "VisionTransformer"; }
  Shape output_shape(const Shape& input) const override { return {input[0], classes_}; }
  double forward_flops(const Shape& input) const override {
    Shape h = {input[0], tokens_, hidden_};
    double f = conv_proj_->forward_flops(input) + head_->forward_flops({input[0], hidden_});
    for (const TransformerBlock* l : layers_.blocks()) f += l->forward_flops(h);
    return f;
  }
  void reset_parameters(std::uint64_t seed) override {
    Layer::reset_parameters(seed);  // children's PyTorch defaults (attention, LayerNorm)
    std::uint64_t stream = seed * 7919ull + 17;
    double fan_in = static_cast<double>(conv_proj_->weight().value.numel() / hidden_);
    ops::fill_normal(conv_proj_->weight().value, 0.0, std::sqrt(1.0 / fan_in), ++stream);
    conv_proj_->bias().value.fill(0.0);
    class_token_->value.fill(0.0);
    ops::fill_normal(pos_embedding_->value, 0.0, 0.02, ++stream);
    for (TransformerBlock* l : layers_.blocks()) {
      for (Linear* lin : {&l->mlp_in(), &l->mlp_out()}) {
        double bound =
            std::sqrt(6.0 / static_cast<double>(lin->in_features() + lin->out_features()));
        ops::fill_uniform(lin->weight().value, -bound, bound, ++stream);
        ops::fill_normal(lin->bias()->value, 0.0, 1e-6, ++stream);
      }
    }
    head_->weight().value.fill(0.0);
    head_->bias()->value.fill(0.0);
  }

 protected:
  Tensor forward_impl(Context& ctx, const Tensor& x) override {  // (B, C, H, W) -> (B, classes)
    KILN_CHECK(x.dim() == 4, "ViT: expected images (B, C, H, W), got " + x.str());
    if (x.size(2) != image_size_ || x.size(3) != image_size_)
      throw InputError("ViT: expected " + std::to_string(image_size_) + "x" +
                       std::to_string(image_size_) + " images, got " + x.str());
    std::int64_t b = x.size(0);
    Tensor patches = conv_proj_->forward(ctx, x);  // (B, L, E)
    Tensor tokens = Tensor::empty({b, tokens_, hidden_}, patches.dtype(), x.device());
    tokens.slice(1, 1, tokens_).copy_from(patches);
    Tensor cls = class_token_->value.view({1, hidden_});
    Tensor pos = pos_embedding_->value.to(patches.dtype()).view({tokens_, hidden_});
    for (std::int64_t i = 0; i < b; ++i) {
      Tensor sample = tokens.select(0, i);  // (L+1, E)
      sample.slice(0, 0, 1).copy_from(cls);
      ops::axpy(1.0, pos, sample);
    }
    Tensor h = dropout_->forward(ctx, tokens);
    h = layers_.forward(ctx, std::move(h));
    h = norm_->forward(ctx, h);
    batch_ = b;
    return head_->forward(ctx, h.select(1, 0).contiguous());  // (B, classes)
  }
  Tensor backward_impl(Context& ctx, const Tensor& dy) override {
    Tensor dcls = head_->backward(ctx, dy);  // (B, E)
    Tensor dh = Tensor::zeros({batch_, tokens_, hidden_}, dcls.dtype(), dcls.device());
    dh.select(1, 0).copy_from(dcls);
    dh = norm_->backward(ctx, dh);
    dh = layers_.backward(ctx, std::move(dh));
    Tensor dtokens = dropout_->backward(ctx, dh).contiguous();  // (B, L+1, E)
    // pos_embedding gets the batch sum; the class token gets its row 0.
    Tensor sums = ops::reduce_cols(dtokens.view({batch_, tokens_ * hidden_}), ops::Reduction::Sum);
    ops::accumulate(pos_embedding_->grad, sums);
    ops::accumulate(class_token_->grad, sums.slice(0, 0, hidden_));
    return conv_proj_->backward(ctx, dtokens.slice(1, 1, tokens_).contiguous());
  }

 private:
  std::int64_t image_size_, hidden_, classes_, tokens_;
  std::int64_t batch_ = 0;
  Parameter* class_token_;
  Parameter* pos_embedding_;
  PatchEmbedding* conv_proj_;
  Dropout* dropout_;
  TransformerStack layers_;  // encoder.layers.encoder_layer_N
  LayerNorm* norm_;
  Linear* head_;
};

}  // namespace

Model make_vit_b16(const ModelOptions& options) {
  if (options.image_size <= 0 || options.image_size % kPatch != 0)
    throw InputError("vit_b16: image_size " + std::to_string(options.image_size) +
                     " must be a positive multiple of the patch size 16 (224 for ImageNet)");
  if (options.hidden_size % options.num_heads != 0)
    throw InputError("vit_b16: hidden_size " + std::to_string(options.hidden_size) +
                     " is not a multiple of num_heads " + std::to_string(options.num_heads));
  return image_model(std::make_unique<VisionTransformer>(options), options);
}

}  // namespace kiln
