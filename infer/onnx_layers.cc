#include "infer/onnx_layers.h"

#include <cmath>
#include <functional>
#include <map>
#include <type_traits>

#include "core/check.h"
#include "layers/activations.h"
#include "layers/attention.h"
#include "layers/batchnorm.h"
#include "layers/conv2d.h"
#include "layers/embedding.h"
#include "layers/layernorm.h"
#include "layers/linear.h"
#include "layers/pooling.h"
#include "layers/reshape.h"
#include "layers/transformer_block.h"

namespace kiln::infer {
namespace {

using Exporter = std::function<OnnxValue(OnnxGraphBuilder&, Layer&, const OnnxValue&)>;

// Where a node came from: the layer's dotted name (the type for the unnamed root).
std::string where(const Layer& layer) {
  return layer.name().empty() ? layer.type() : layer.name();
}

std::string full_name(const Layer& parent, const std::string& local) {
  return parent.name().empty() ? local : parent.name() + "." + local;
}

template <typename L>
L& as(Layer& layer) {
  auto* l = dynamic_cast<L*>(&layer);
  if (l == nullptr) {
    throw InputError("ONNX export: layer '" + where(layer) + "' of type " + layer.type() +
                     " is not the class its exporter expects");
  }
  return *l;
}

// The child `local` of a model-specific layer (whose class is private to its model's file).
Layer& child(Layer& parent, const std::string& local) {
  const std::string want = full_name(parent, local);
  for (Layer* c : parent.children()) {
    if (c->name() == want) return *c;
  }
  throw InputError("ONNX export: " + parent.type() + " '" + where(parent) + "' has no child '" +
                   local + "'; its exporter (infer/onnx_layers.cc) no longer matches the model");
}

// The parameter `local` of `layer` or of one of its children, by its full (checkpoint) name.
Parameter& param(Layer& layer, const std::string& local) {
  const std::string want = full_name(layer, local);
  for (Parameter* p : layer.parameters()) {
    if (p->name == want) return *p;
  }
  throw InputError("ONNX export: " + layer.type() + " '" + where(layer) + "' has no parameter '" +
                   want + "'; its exporter (infer/onnx_layers.cc) no longer matches the model");
}

std::string cast(OnnxGraphBuilder& g, const std::string& x, std::int32_t to,
                 const std::string& hint) {
  return g.node1("Cast", {x}, hint, {onnx_int("to", to)});
}

// The GELU of Kiln's layers/activations.h: the exact erf form, or the tanh form computed as
// x * sigmoid(2u) exactly as Kiln does. Opset 20 has Gelu itself.
std::string gelu(OnnxGraphBuilder& g, const std::string& x, GeluForm form,
                 const std::string& hint) {
  if (g.opset() >= 20) {
    return g.node1("Gelu", {x}, hint,
                   {onnx_string("approximate", form == GeluForm::Erf ? "none" : "tanh")});
  }
  if (form == GeluForm::Erf) {  // 0.5 x (1 + erf(x / sqrt 2))
    std::string e = g.node1(
        "Erf", {g.node1("Mul", {x, g.scalar(hint + "/inv_sqrt2", 0.70710678118654752440)}, hint)},
        hint);
    std::string one_plus = g.node1("Add", {e, g.scalar(hint + "/one", 1.0)}, hint);
    std::string xs = g.node1("Mul", {x, one_plus}, hint);
    return g.node1("Mul", {xs, g.scalar(hint + "/half", 0.5)}, hint);
  }
  // x * sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3))
  std::string x3 = g.node1("Mul", {g.node1("Mul", {x, x}, hint), x}, hint);
  std::string inner =
      g.node1("Add", {x, g.node1("Mul", {x3, g.scalar(hint + "/c", 0.044715)}, hint)}, hint);
  std::string z =
      g.node1("Mul", {inner, g.scalar(hint + "/2k", 2.0 * 0.79788456080286535588)}, hint);
  return g.node1("Mul", {x, g.node1("Sigmoid", {z}, hint)}, hint);
}

std::string activation(OnnxGraphBuilder& g, Activation a, const std::string& x,
                       const std::string& hint) {
  switch (a) {
    case Activation::ReLU:
      return g.node1("Relu", {x}, hint);
    case Activation::GELU:
      return gelu(g, x, GeluForm::Tanh, hint);
    case Activation::GELUErf:
      return gelu(g, x, GeluForm::Erf, hint);
    default:
      return x;
  }
}

// x W^T + b for x of any rank >= 2: Gemm for matrices, MatMul with the transposed weight above.
std::string affine(OnnxGraphBuilder& g, const OnnxValue& x, const Parameter& weight,
                   const Parameter* bias, const std::string& hint) {
  const std::string w = g.weight(weight);
  if (x.shape.size() == 2) {
    std::vector<std::string> inputs = {x.name, w};
    if (bias) inputs.push_back(g.weight(*bias));
    return g.node1("Gemm", inputs, hint, {onnx_int("transB", 1)});
  }
  std::string wt = g.node1("Transpose", {w}, hint, {onnx_ints("perm", {1, 0})});
  std::string y = g.node1("MatMul", {x.name, wt}, hint);
  return bias ? g.node1("Add", {y, g.weight(*bias)}, hint) : y;
}

OnnxValue export_sequential(OnnxGraphBuilder& g, Layer& layer, const OnnxValue& x) {
  OnnxValue h = x;
  for (Layer* l : as<Sequential>(layer).layers()) h = export_layer(g, *l, h);
  return h;
}

OnnxValue export_linear(OnnxGraphBuilder& g, Layer& layer, const OnnxValue& x) {
  auto& l = as<Linear>(layer);
  const std::string hint = where(layer);
  std::string y = affine(g, x, l.weight(), l.bias(), hint);
  return {activation(g, l.activation(), y, hint), l.output_shape(x.shape)};
}

OnnxValue export_conv2d(OnnxGraphBuilder& g, Layer& layer, const OnnxValue& x) {
  auto& c = as<Conv2d>(layer);
  const Conv2dGeometry geo = c.geometry(x.shape, DType::F32, false);
  std::vector<std::string> inputs = {x.name, g.weight(c.weight())};
  if (c.bias()) inputs.push_back(g.weight(*c.bias()));
  std::string y = g.node1(
      "Conv", inputs, where(layer),
      {onnx_ints("kernel_shape", {geo.kernel_h, geo.kernel_w}),
       onnx_ints("strides", {geo.stride_h, geo.stride_w}),
       onnx_ints("pads", {geo.pad_h, geo.pad_w, geo.pad_h, geo.pad_w}),
       onnx_ints("dilations", {geo.dilation_h, geo.dilation_w}), onnx_int("group", geo.groups)});
  return {y, c.output_shape(x.shape)};
}

// Eval form: the running statistics (training_mode 0), then the fused ReLU if any.
OnnxValue export_batchnorm(OnnxGraphBuilder& g, Layer& layer, const OnnxValue& x) {
  auto& bn = as<BatchNorm2d>(layer);
  const std::string hint = where(layer);
  std::string y = g.node1("BatchNormalization",
                          {x.name, g.weight(bn.weight()), g.weight(bn.bias()),
                           g.weight(bn.running_mean()), g.weight(bn.running_var())},
                          hint, {onnx_float("epsilon", bn.eps())});
  if (bn.fused_relu()) y = g.node1("Relu", {y}, hint);
  return {y, x.shape};
}

OnnxValue export_relu(OnnxGraphBuilder& g, Layer& layer, const OnnxValue& x) {
  return {g.node1("Relu", {x.name}, where(layer)), x.shape};
}

OnnxValue export_gelu(OnnxGraphBuilder& g, Layer& layer, const OnnxValue& x) {
  return {gelu(g, x.name, as<GELU>(layer).form(), where(layer)), x.shape};
}

OnnxValue export_dropout(OnnxGraphBuilder&, Layer&, const OnnxValue& x) {
  return x;
}

template <typename Pool>
OnnxValue export_pool(OnnxGraphBuilder& g, Layer& layer, const OnnxValue& x) {
  auto& p = as<Pool>(layer);
  const bool max = std::is_same<Pool, MaxPool2d>::value;
  std::vector<onnx::AttributeProto> attributes = {
      onnx_ints("kernel_shape", {p.kernel(), p.kernel()}),
      onnx_ints("strides", {p.stride(), p.stride()}),
      onnx_ints("pads", {p.padding(), p.padding(), p.padding(), p.padding()})};
  if (!max) attributes.push_back(onnx_int("count_include_pad", 1));  // PyTorch's default
  std::string y = g.node1(max ? "MaxPool" : "AveragePool", {x.name}, where(layer), attributes);
  return {y, p.output_shape(x.shape)};
}

OnnxValue export_global_avg_pool(OnnxGraphBuilder& g, Layer& layer, const OnnxValue& x) {
  const std::string hint = where(layer);
  std::string y = g.node1("GlobalAveragePool", {x.name}, hint);
  return {g.node1("Flatten", {y}, hint, {onnx_int("axis", 1)}), layer.output_shape(x.shape)};
}

OnnxValue export_reshape(OnnxGraphBuilder& g, Layer& layer, const OnnxValue& x) {
  const std::string hint = where(layer);
  Shape out = layer.output_shape(x.shape);
  if (layer.type() == "Flatten") {
    return {g.node1("Flatten", {x.name}, hint, {onnx_int("axis", 1)}), out};
  }
  std::vector<std::int64_t> target = {0};  // the batch, copied
  target.insert(target.end(), out.begin() + 1, out.end());
  return {g.node1("Reshape", {x.name, g.int64s(hint + "/shape", target)}, hint), out};
}

OnnxValue export_layernorm(OnnxGraphBuilder& g, Layer& layer, const OnnxValue& x) {
  auto& ln = as<LayerNorm>(layer);
  // stash_type 1 (the default): mean and variance in fp32 also for fp16 inputs, as Kiln.
  std::string y =
      g.node1("LayerNormalization", {x.name, g.weight(ln.weight()), g.weight(ln.bias())},
              where(layer), {onnx_int("axis", -1), onnx_float("epsilon", ln.eps())});
  return {y, x.shape};
}

OnnxValue export_embedding(OnnxGraphBuilder& g, Layer& layer, const OnnxValue& ids) {
  auto& e = as<Embedding>(layer);
  return {g.node1("Gather", {g.weight(e.weight()), ids.name}, where(layer), {onnx_int("axis", 0)}),
          e.output_shape(ids.shape)};
}

// (B, T, E) -> (B, T, E): the projections, softmax(q k^T / sqrt(d)) v per head, the output
// projection. Under half the scores go through Softmax in fp32, as Kiln's mixed precision does.
OnnxValue export_attention(OnnxGraphBuilder& g, Layer& layer, const OnnxValue& x) {
  auto& a = as<MultiHeadSelfAttention>(layer);
  const std::string hint = where(layer);
  const std::int64_t e = a.hidden(), h = a.heads(), d = e / h;
  std::string q, k, v, out_w, out_b;
  if (a.layout() == QkvLayout::SeparateQKV) {
    q = affine(g, x, param(layer, "self.query.weight"), &param(layer, "self.query.bias"), hint);
    k = affine(g, x, param(layer, "self.key.weight"), &param(layer, "self.key.bias"), hint);
    v = affine(g, x, param(layer, "self.value.weight"), &param(layer, "self.value.bias"), hint);
  } else {
    std::string qkv =
        affine(g, x, param(layer, "in_proj_weight"), &param(layer, "in_proj_bias"), hint);
    auto parts = g.node("Split", {qkv, g.int64s(hint + "/split", {e, e, e})}, 3, hint,
                        {onnx_int("axis", -1)});
    q = parts[0];
    k = parts[1];
    v = parts[2];
  }
  const std::string heads_shape = g.int64s(hint + "/heads_shape", {0, 0, h, d});
  auto to_heads = [&](const std::string& t, std::vector<std::int64_t> perm) {
    return g.node1("Transpose", {g.node1("Reshape", {t, heads_shape}, hint)}, hint,
                   {onnx_ints("perm", perm)});
  };
  std::string qh = to_heads(q, {0, 2, 1, 3});  // (B, H, T, d)
  std::string kt = to_heads(k, {0, 2, 3, 1});  // (B, H, d, T)
  std::string vh = to_heads(v, {0, 2, 1, 3});  // (B, H, T, d)
  std::string scores = g.node1(
      "Mul", {g.node1("MatMul", {qh, kt}, hint), g.scalar(hint + "/scale", 1.0 / std::sqrt(d))},
      hint);  // (B, H, T, T)
  if (g.half()) scores = cast(g, scores, onnx::TensorProto::FLOAT, hint);
  std::string probs = g.node1("Softmax", {scores}, hint, {onnx_int("axis", -1)});
  if (g.half()) probs = cast(g, probs, onnx::TensorProto::FLOAT16, hint);
  std::string context = g.node1("MatMul", {probs, vh}, hint);  // (B, H, T, d)
  context = g.node1("Transpose", {context}, hint, {onnx_ints("perm", {0, 2, 1, 3})});
  context = g.node1("Reshape", {context, g.int64s(hint + "/merge_shape", {0, 0, e})}, hint);
  const bool separate = a.layout() == QkvLayout::SeparateQKV;
  Parameter& ow = param(layer, separate ? "output.dense.weight" : "out_proj.weight");
  Parameter& ob = param(layer, separate ? "output.dense.bias" : "out_proj.bias");
  return {affine(g, {context, x.shape}, ow, &ob, hint), x.shape};
}

// Post-LN (BERT) or pre-LN (ViT), dropouts gone.
OnnxValue export_transformer_block(OnnxGraphBuilder& g, Layer& layer, const OnnxValue& x) {
  auto& b = as<TransformerBlock>(layer);
  const std::string hint = where(layer);
  auto mlp = [&](const OnnxValue& h) {
    return export_layer(g, b.mlp_out(), export_layer(g, b.mlp_in(), h));
  };
  auto add = [&](const OnnxValue& p, const OnnxValue& q) {
    return OnnxValue{g.node1("Add", {p.name, q.name}, hint), p.shape};
  };
  if (b.config().pre_norm) {
    OnnxValue h = add(x, export_layer(g, b.attention(), export_layer(g, b.attention_norm(), x)));
    return add(h, mlp(export_layer(g, b.mlp_norm(), h)));
  }
  OnnxValue h = export_layer(g, b.attention_norm(), add(x, export_layer(g, b.attention(), x)));
  return export_layer(g, b.mlp_norm(), add(h, mlp(h)));
}

// ResNet's BasicBlock / Bottleneck (layers/models/resnet.cc): conv-bn pairs (ReLUs fused into
// all but the last batch norm), then relu(body + shortcut), the shortcut `downsample` or x.
OnnxValue export_resnet_block(OnnxGraphBuilder& g, Layer& layer, const OnnxValue& x) {
  const std::string hint = where(layer);
  OnnxValue h = x;
  Layer* downsample = nullptr;
  bool relu_seen = false;
  for (Layer* c : layer.children()) {
    if (c->name() == full_name(layer, "downsample")) {
      downsample = c;
    } else if (c->type() == "ReLU") {
      relu_seen = true;
    } else {
      h = export_layer(g, *c, h);
    }
  }
  if (!relu_seen) throw InputError("ONNX export: block '" + hint + "' has no final ReLU");
  OnnxValue shortcut = downsample ? export_layer(g, *downsample, x) : x;
  std::string sum = g.node1("Add", {h.name, shortcut.name}, hint);
  return {g.node1("Relu", {sum}, hint), h.shape};
}

// BERT's embeddings (layers/models/bert.cc): word + position (0..T-1) + token type (0), LayerNorm.
OnnxValue export_bert_embeddings(OnnxGraphBuilder& g, Layer& layer, const OnnxValue& ids) {
  const std::string hint = where(layer);
  const std::int64_t t = ids.shape.at(1);
  std::vector<std::int64_t> positions(static_cast<std::size_t>(t));
  for (std::int64_t i = 0; i < t; ++i) positions[static_cast<std::size_t>(i)] = i;
  OnnxValue word = export_layer(g, child(layer, "word_embeddings"), ids);  // (B, T, E)
  OnnxValue pos = export_layer(g, child(layer, "position_embeddings"),
                               {g.int64s(hint + "/position_ids", positions, {1, t}), {1, t}});
  std::vector<std::int64_t> zeros(static_cast<std::size_t>(t), 0);
  OnnxValue type = export_layer(g, child(layer, "token_type_embeddings"),
                                {g.int64s(hint + "/token_type_ids", zeros, {1, t}), {1, t}});
  std::string e = g.node1("Add", {word.name, pos.name}, hint);
  e = g.node1("Add", {e, type.name}, hint);
  return export_layer(g, child(layer, "LayerNorm"), {e, word.shape});
}

// BertForMaskedLM: embeddings, encoder layers, the prediction transform, and the decoder tied to
// the word embeddings (h W_word^T + cls.predictions.bias).
OnnxValue export_bert(OnnxGraphBuilder& g, Layer& layer, const OnnxValue& ids) {
  const std::string hint = where(layer);
  Layer& embeddings = child(layer, "bert.embeddings");
  OnnxValue h = export_layer(g, embeddings, ids);
  for (Layer* c : layer.children()) {
    if (c->type() == "TransformerBlock") h = export_layer(g, *c, h);
  }
  h = export_layer(g, child(layer, "cls.predictions.transform.dense"), h);
  h = export_layer(g, child(layer, "cls.predictions.transform.LayerNorm"), h);
  Parameter& word = param(embeddings, "word_embeddings.weight");  // (V, E)
  Parameter& bias = param(layer, "cls.predictions.bias");
  Shape out = h.shape;
  out.back() = word.value.size(0);
  return {affine(g, h, word, &bias, hint + "/cls.predictions"), out};
}

// ViT's patch convolution (16x16 stride 16): (B, C, H, W) -> (B, L, E), patches row by row.
OnnxValue export_patch_embedding(OnnxGraphBuilder& g, Layer& layer, const OnnxValue& x) {
  const std::string hint = where(layer);
  Parameter& w = param(layer, "weight");  // (E, C, P, P)
  const std::int64_t e = w.value.size(0), p = w.value.size(2);
  std::string y = g.node1("Conv", {x.name, g.weight(w), g.weight(param(layer, "bias"))}, hint,
                          {onnx_ints("kernel_shape", {p, p}), onnx_ints("strides", {p, p})});
  y = g.node1("Reshape", {y, g.int64s(hint + "/shape", {0, e, -1})}, hint);  // (B, E, L)
  y = g.node1("Transpose", {y}, hint, {onnx_ints("perm", {0, 2, 1})});
  return {y, layer.output_shape(x.shape)};
}

// torchvision's ViT: [class token; patches] + pos_embedding, encoder layers, ln, token 0, head.
OnnxValue export_vit(OnnxGraphBuilder& g, Layer& layer, const OnnxValue& x) {
  const std::string hint = where(layer);
  OnnxValue patches = export_layer(g, child(layer, "conv_proj"), x);  // (B, L, E)
  const std::int64_t e = patches.shape.at(2), tokens = patches.shape.at(1) + 1;
  // The class token (1, 1, E) repeated over the batch, whatever the batch is.
  std::string batch = g.node1("Slice",
                              {g.node1("Shape", {x.name}, hint), g.int64s(hint + "/zero", {0}),
                               g.int64s(hint + "/one", {1})},
                              hint);
  std::string cls_shape = g.node1("Concat", {batch, g.int64s(hint + "/cls_shape", {1, e})}, hint,
                                  {onnx_int("axis", 0)});
  std::string cls = g.node1("Expand", {g.weight(param(layer, "class_token")), cls_shape}, hint);
  std::string h = g.node1("Concat", {cls, patches.name}, hint, {onnx_int("axis", 1)});
  h = g.node1("Add", {h, g.weight(param(layer, "encoder.pos_embedding"))}, hint);
  OnnxValue v = {h, {patches.shape[0], tokens, e}};
  for (Layer* c : layer.children()) {
    if (c->type() == "TransformerBlock") v = export_layer(g, *c, v);
  }
  v = export_layer(g, child(layer, "encoder.ln"), v);
  std::string first = g.node1("Gather", {v.name, g.int64s(hint + "/token0", {0}, {})}, hint,
                              {onnx_int("axis", 1)});  // (B, E)
  return export_layer(g, child(layer, "heads.head"), {first, {v.shape[0], e}});
}

// Filled explicitly, not by static initialisers (STYLE.md practice 6).
const std::map<std::string, Exporter>& registry() {
  static const std::map<std::string, Exporter> table = {
      {"Sequential", export_sequential},
      {"ResNet", export_sequential},
      {"Linear", export_linear},
      {"Conv2d", export_conv2d},
      {"BatchNorm2d", export_batchnorm},
      {"BatchNorm2d+ReLU", export_batchnorm},
      {"ReLU", export_relu},
      {"GELU", export_gelu},
      {"Dropout", export_dropout},
      {"MaxPool2d", export_pool<MaxPool2d>},
      {"AvgPool2d", export_pool<AvgPool2d>},
      {"GlobalAvgPool", export_global_avg_pool},
      {"Flatten", export_reshape},
      {"Reshape", export_reshape},
      {"LayerNorm", export_layernorm},
      {"Embedding", export_embedding},
      {"MultiHeadSelfAttention", export_attention},
      {"TransformerBlock", export_transformer_block},
      {"BasicBlock", export_resnet_block},
      {"Bottleneck", export_resnet_block},
      {"BertEmbeddings", export_bert_embeddings},
      {"BertForMaskedLM", export_bert},
      {"PatchEmbedding", export_patch_embedding},
      {"VisionTransformer", export_vit},
  };
  return table;
}

}  // namespace

std::vector<std::string> onnx_layer_types() {
  std::vector<std::string> names;
  for (const auto& [name, exporter] : registry()) names.push_back(name);
  return names;
}

OnnxValue export_layer(OnnxGraphBuilder& graph, Layer& layer, const OnnxValue& x) {
  auto it = registry().find(layer.type());
  if (it == registry().end()) {
    std::string known;
    for (const auto& n : onnx_layer_types()) known += (known.empty() ? "" : ", ") + n;
    throw InputError("ONNX export: layer '" + where(layer) + "' of type " + layer.type() +
                     " has no exporter (exportable types: " + known + ")");
  }
  return it->second(graph, layer, x);
}

}  // namespace kiln::infer
