// Transformer layers on the CPU: finite-difference gradient checks in f64 for LayerNorm,
// Embedding, multi-head attention (masks, head counts, odd T, dropout, causal, every QKV layout),
// the transformer block, and tiny BERT / ViT / GPT-2 end to end; causal attention against plain
// loops; KV-cache decoding against the full causal forward; the exact parameter counts of
// bert_base and vit_b16; shapes and FLOP counts.

#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "core/ops.h"
#include "layers/attention.h"
#include "layers/embedding.h"
#include "layers/gradient_check.h"
#include "layers/layernorm.h"
#include "layers/models/model.h"
#include "layers/transformer_block.h"
#include "tests/layers/tiny_llama.h"

namespace kiln {
namespace {

Tensor random_tensor(const Shape& shape, std::uint64_t seed, DType dtype = DType::F64,
                     double bound = 1.0) {
  Tensor t = Tensor::empty(shape, DType::F64);
  ops::fill_uniform(t, -bound, bound, seed);
  return t.to(dtype);
}

// Every parameter to U(-bound, bound), so that no gradient is trivially zero (ViT's zero head).
void randomize_parameters(Layer& layer, std::uint64_t seed, double bound = 0.5) {
  for (Parameter* p : layer.parameters()) ops::fill_uniform(p->value, -bound, bound, ++seed);
}

using llama_test::f64_context;

void expect_gradients_ok(Layer& layer, Context& ctx, const Tensor& x, bool check_input = true) {
  GradientCheckOptions opt;
  opt.check_input = check_input;
  GradientCheckResult r = check_layer_gradients(layer, ctx, x, opt);
  EXPECT_TRUE(r.ok) << r.report;
  EXPECT_GT(r.checked, 0) << r.report;
  EXPECT_EQ(r.skipped, 0) << r.report;  // no kinks in these layers
}

// ---------------------------------------------------------------------------------------------
// LayerNorm

TEST(LayerNorm, NormalisesEachRow) {
  LayerNorm ln(16);
  Context ctx;
  Tensor x = random_tensor({3, 4, 16}, 1, DType::F32, 3.0);
  Tensor y = ln.forward(ctx, x);
  ASSERT_EQ(y.shape(), x.shape());
  auto v = y.to_vector<double>();
  for (int r = 0; r < 12; ++r) {
    double mean = 0, var = 0;
    for (int c = 0; c < 16; ++c) mean += v[r * 16 + c] / 16;
    for (int c = 0; c < 16; ++c) var += (v[r * 16 + c] - mean) * (v[r * 16 + c] - mean) / 16;
    EXPECT_NEAR(mean, 0.0, 1e-5);
    EXPECT_NEAR(var, 1.0, 1e-3);
  }
  EXPECT_TRUE(ln.weight().fp32_in_half && ln.weight().no_weight_decay);
  EXPECT_TRUE(ln.bias().fp32_in_half && ln.bias().no_weight_decay);
}

TEST(LayerNorm, GradientCheckF64) {
  for (double eps : {1e-5, 1e-12}) {
    LayerNorm ln(7, eps);
    ln.to(Device::cpu(), DType::F64);
    randomize_parameters(ln, 5);
    Context ctx = f64_context();
    expect_gradients_ok(ln, ctx, random_tensor({3, 5, 7}, 2));
  }
}

// The fused residual LayerNorm as a pre-norm block uses it: out = LN(x + delta) + (x + delta) / 2,
// delta a parameter; backward hands LN the residual path's gradient. The f64 check covers d/dx,
// d/ddelta and LN's parameters.
class ResidualNormProbe : public Layer {
 public:
  explicit ResidualNormProbe(std::int64_t cols, const Shape& shape) {
    norm_ = &add_child("norm", std::make_unique<LayerNorm>(cols, 1e-5));
    delta_ = &add_parameter("delta", shape);
  }
  std::string type() const override { return "ResidualNormProbe"; }
  Shape output_shape(const Shape& input) const override { return input; }

 protected:
  Tensor forward_impl(Context& ctx, const Tensor& x) override {
    norm_->add_to_next_input(delta_->value);
    Tensor y = norm_->forward(ctx, x);
    Tensor h = norm_->residual_sum();
    EXPECT_EQ(h.shape(), x.shape());
    Tensor out = h.clone();
    ops::scale(out, 0.5);
    ops::axpy(1.0, y, out);
    return out;
  }
  Tensor backward_impl(Context& ctx, const Tensor& dy) override {
    Tensor half = dy.clone();
    ops::scale(half, 0.5);
    norm_->add_to_next_dx(half);
    Tensor dh = norm_->backward(ctx, dy);
    ops::accumulate(delta_->grad, dh);
    return dh;
  }

 private:
  LayerNorm* norm_;
  Parameter* delta_;
};

TEST(LayerNorm, ResidualFusionGradientCheckF64) {
  ResidualNormProbe probe(7, {3, 5, 7});
  probe.to(Device::cpu(), DType::F64);
  randomize_parameters(probe, 11);
  Context ctx = f64_context();
  expect_gradients_ok(probe, ctx, random_tensor({3, 5, 7}, 12));
}

TEST(LayerNorm, ResidualFusionEqualsTheAdditionThenTheNorm) {
  // f32: the sum rounded, then normalised; dx = LN'(dy) + g, as the unfused block computes it.
  LayerNorm fused(33), plain(33);
  randomize_parameters(fused, 7);
  randomize_parameters(plain, 7);
  Context c;
  Tensor x = random_tensor({5, 33}, 3, DType::F32), delta = random_tensor({5, 33}, 4, DType::F32);
  Tensor dy = random_tensor({5, 33}, 5, DType::F32), g = random_tensor({5, 33}, 6, DType::F32);
  Tensor h = Tensor::empty({5, 33}, DType::F32);
  ops::add(x, delta, h);
  Tensor y_plain = plain.forward(c, h);
  Tensor dx_plain = Tensor::empty({5, 33}, DType::F32);
  ops::add(plain.backward(c, dy), g, dx_plain);
  fused.add_to_next_input(delta);
  Tensor y_fused = fused.forward(c, x);
  fused.add_to_next_dx(g);
  Tensor dx_fused = fused.backward(c, dy);
  EXPECT_EQ(fused.residual_sum().to_vector<float>(), h.to_vector<float>());
  EXPECT_EQ(y_fused.to_vector<float>(), y_plain.to_vector<float>());
  EXPECT_EQ(dx_fused.to_vector<float>(), dx_plain.to_vector<float>());
  EXPECT_EQ(fused.weight().grad.to_vector<float>(), plain.weight().grad.to_vector<float>());
  // Each applies to one call: the next pair is a plain LayerNorm.
  Tensor y_next = fused.forward(c, x);
  EXPECT_FALSE(fused.residual_sum().defined());
  EXPECT_EQ(y_next.to_vector<float>(), plain.forward(c, x).to_vector<float>());
}

TEST(LayerNorm, F32MatchesF64AndAccumulates) {
  LayerNorm a(33), b(33);
  randomize_parameters(a, 7);
  randomize_parameters(b, 7);
  b.to(Device::cpu(), DType::F64);
  Context c32, c64 = f64_context();
  Tensor x = random_tensor({5, 33}, 3);
  Tensor dy = random_tensor({5, 33}, 4);
  Tensor y32 = a.forward(c32, x.to(DType::F32)), y64 = b.forward(c64, x);
  Tensor dx32 = a.backward(c32, dy.to(DType::F32)), dx64 = b.backward(c64, dy);
  auto close = [](const Tensor& p, const Tensor& q, double tol) {
    auto u = p.to_vector<double>(), w = q.to_vector<double>();
    ASSERT_EQ(u.size(), w.size());
    for (std::size_t i = 0; i < u.size(); ++i) EXPECT_NEAR(u[i], w[i], tol) << i;
  };
  close(y32, y64, 1e-5);
  close(dx32, dx64, 1e-5);
  close(a.weight().grad, b.weight().grad, 1e-5);
  // Backward drops what forward saved: a second backward needs a second forward, and the pair
  // accumulates into the parameter gradients.
  EXPECT_THROW(b.backward(c64, dy), Error);
  Tensor g1 = b.bias().grad.clone();
  b.forward(c64, x);
  b.backward(c64, dy);
  auto once = g1.to_vector<double>(), twice = b.bias().grad.to_vector<double>();
  for (std::size_t i = 0; i < once.size(); ++i) EXPECT_NEAR(twice[i], 2 * once[i], 1e-12);
}

// ---------------------------------------------------------------------------------------------
// Embedding

TEST(Embedding, GradientCheckWithRepeatedIds) {
  Embedding emb(10, 6);
  emb.to(Device::cpu(), DType::F64);
  Context ctx = f64_context();
  Tensor ids = Tensor::from_vector<std::int64_t>({3, 1, 3, 9, 0, 3, 1, 5}, {2, 4});
  expect_gradients_ok(emb, ctx, ids, /*check_input=*/false);
}

TEST(Embedding, RepeatedIdsSumAndPaddingRowGetsNoGradient) {
  const std::int64_t pad = 2;
  Embedding emb(6, 4, pad);
  emb.to(Device::cpu(), DType::F64);
  for (double v : emb.weight().value.select(0, pad).to_vector<double>()) EXPECT_EQ(v, 0.0);
  Context ctx = f64_context();
  Tensor ids = Tensor::from_vector<std::int64_t>({4, 2, 4, 4, 0, 2}, {2, 3});
  Tensor y = emb.forward(ctx, ids);
  ASSERT_EQ(y.shape(), (Shape{2, 3, 4}));
  auto w = emb.weight().value.to_vector<double>();
  auto yv = y.to_vector<double>();
  for (int c = 0; c < 4; ++c) EXPECT_EQ(yv[c], w[4 * 4 + c]);
  Tensor dy = random_tensor({2, 3, 4}, 11);
  Tensor dx = emb.backward(ctx, dy);
  EXPECT_FALSE(dx.defined());
  auto d = dy.to_vector<double>(), g = emb.weight().grad.to_vector<double>();
  for (int c = 0; c < 4; ++c) {
    EXPECT_NEAR(g[4 * 4 + c], d[0 * 4 + c] + d[2 * 4 + c] + d[3 * 4 + c], 1e-12);
    EXPECT_NEAR(g[0 * 4 + c], d[4 * 4 + c], 1e-12);
    EXPECT_EQ(g[pad * 4 + c], 0.0);
    EXPECT_EQ(g[1 * 4 + c], 0.0);
  }
}

TEST(Embedding, OutOfRangeIdIsAnInputError) {
  Embedding emb(5, 3);
  Context ctx;
  EXPECT_THROW(emb.forward(ctx, Tensor::from_vector<std::int64_t>({1, 5}, {1, 2})), InputError);
  EXPECT_THROW(emb.forward(ctx, Tensor::from_vector<std::int64_t>({-1}, {1, 1})), InputError);
}

// ---------------------------------------------------------------------------------------------
// Attention

struct AttentionCase {
  int heads;
  int tokens;
  bool mask;
  bool dropout;
  QkvLayout layout;
  bool causal;
};

class AttentionGradient : public ::testing::TestWithParam<AttentionCase> {};

Tensor padding_mask(std::int64_t b, std::int64_t t) {
  // Batch 0 attends everywhere; batch i > 0 masks its last i keys.
  std::vector<double> m(static_cast<std::size_t>(b * t), 1.0);
  for (std::int64_t i = 1; i < b; ++i)
    for (std::int64_t j = t - i; j < t; ++j) m[static_cast<std::size_t>(i * t + j)] = 0.0;
  return Tensor::from_vector(m, {b, t});
}

TEST_P(AttentionGradient, MatchesFiniteDifferences) {
  AttentionCase c = GetParam();
  const std::int64_t hidden = 12, batch = 3;
  MultiHeadSelfAttention attn(hidden, c.heads, c.dropout ? 0.3 : 0.0, c.layout, c.causal);
  attn.to(Device::cpu(), DType::F64);
  randomize_parameters(attn, 21);
  Context ctx = f64_context();
  if (c.mask) ctx.call.attention_mask = padding_mask(batch, c.tokens);
  expect_gradients_ok(attn, ctx, random_tensor({batch, c.tokens, hidden}, 22));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, AttentionGradient,
    ::testing::Values(AttentionCase{1, 5, false, false, QkvLayout::SeparateQKV, false},
                      AttentionCase{2, 7, true, false, QkvLayout::SeparateQKV, false},
                      AttentionCase{3, 5, true, true, QkvLayout::SeparateQKV, false},
                      AttentionCase{4, 3, false, true, QkvLayout::FusedQKV, false},
                      AttentionCase{6, 7, true, false, QkvLayout::FusedQKV, false},
                      // Causal: alone, with the padding mask, with dropout, with both.
                      AttentionCase{2, 7, false, false, QkvLayout::FusedConv1D, true},
                      AttentionCase{3, 6, true, false, QkvLayout::FusedConv1D, true},
                      AttentionCase{4, 5, false, true, QkvLayout::SeparateQKV, true},
                      AttentionCase{6, 7, true, true, QkvLayout::FusedQKV, true}));

// y of a FusedConv1D attention layer named "attn" in plain loops: key j of query i is attended
// when mask[b][j] != 0 (mask empty: all) and, causal, j <= i; a query without keys gets a zero
// context.
std::vector<double> naive_attention(MultiHeadSelfAttention& attn, const Tensor& x,
                                    const std::vector<double>& mask, bool causal) {
  std::map<std::string, std::vector<double>> p;
  for (Parameter* q : attn.parameters()) p[q->name] = q->value.to_vector<double>();
  const std::vector<double>& w = p["attn.c_attn.weight"];  // (3E, E)
  const std::vector<double>& bias = p["attn.c_attn.bias"];
  const std::vector<double>& wo = p["attn.c_proj.weight"];  // (E, E)
  const std::vector<double>& bo = p["attn.c_proj.bias"];
  const std::int64_t b = x.size(0), t = x.size(1), e = x.size(2), h = attn.heads(), d = e / h;
  std::vector<double> xv = x.to_vector<double>();
  std::vector<double> qkv(static_cast<std::size_t>(b * t * 3 * e));
  for (std::int64_t r = 0; r < b * t; ++r)
    for (std::int64_t c = 0; c < 3 * e; ++c) {
      double sum = bias[static_cast<std::size_t>(c)];
      for (std::int64_t k = 0; k < e; ++k)
        sum += xv[static_cast<std::size_t>(r * e + k)] * w[static_cast<std::size_t>(c * e + k)];
      qkv[static_cast<std::size_t>(r * 3 * e + c)] = sum;
    }
  auto at = [&](std::int64_t batch, std::int64_t token, std::int64_t part, std::int64_t col) {
    return qkv[static_cast<std::size_t>((batch * t + token) * 3 * e + part * e + col)];
  };
  std::vector<double> context(static_cast<std::size_t>(b * t * e), 0.0);
  for (std::int64_t bb = 0; bb < b; ++bb)
    for (std::int64_t hh = 0; hh < h; ++hh)
      for (std::int64_t i = 0; i < t; ++i) {
        std::vector<double> s(static_cast<std::size_t>(t));
        std::vector<bool> on(static_cast<std::size_t>(t));
        double max = -INFINITY;
        for (std::int64_t j = 0; j < t; ++j) {
          on[j] = (mask.empty() || mask[static_cast<std::size_t>(bb * t + j)] != 0.0) &&
                  (!causal || j <= i);
          double dot = 0;
          for (std::int64_t k = 0; k < d; ++k)
            dot += at(bb, i, 0, hh * d + k) * at(bb, j, 1, hh * d + k);
          s[static_cast<std::size_t>(j)] = dot / std::sqrt(static_cast<double>(d));
          if (on[j]) max = std::max(max, s[static_cast<std::size_t>(j)]);
        }
        double sum = 0;
        for (std::int64_t j = 0; j < t; ++j)
          if (on[j]) sum += std::exp(s[static_cast<std::size_t>(j)] - max);
        for (std::int64_t j = 0; j < t; ++j) {
          if (!on[j]) continue;
          double prob = std::exp(s[static_cast<std::size_t>(j)] - max) / sum;
          for (std::int64_t k = 0; k < d; ++k)
            context[static_cast<std::size_t>((bb * t + i) * e + hh * d + k)] +=
                prob * at(bb, j, 2, hh * d + k);
        }
      }
  std::vector<double> y(static_cast<std::size_t>(b * t * e));
  for (std::int64_t r = 0; r < b * t; ++r)
    for (std::int64_t c = 0; c < e; ++c) {
      double sum = bo[static_cast<std::size_t>(c)];
      for (std::int64_t k = 0; k < e; ++k)
        sum +=
            context[static_cast<std::size_t>(r * e + k)] * wo[static_cast<std::size_t>(c * e + k)];
      y[static_cast<std::size_t>(r * e + c)] = sum;
    }
  return y;
}

TEST(Attention, CausalForwardMatchesNaiveReference) {
  const std::int64_t b = 3, t = 7, e = 12;
  MultiHeadSelfAttention attn(e, 3, 0.0, QkvLayout::FusedConv1D, /*causal=*/true);
  attn.set_name("attn");
  attn.to(Device::cpu(), DType::F64);
  randomize_parameters(attn, 23);
  ASSERT_TRUE(attn.causal());
  Tensor x = random_tensor({b, t, e}, 24, DType::F64, 2.0);
  for (bool masked : {false, true}) {
    Context ctx = f64_context();
    std::vector<double> mask;
    if (masked) {
      ctx.call.attention_mask = padding_mask(b, t);
      mask = ctx.call.attention_mask.to_vector<double>();
    }
    auto got = attn.forward(ctx, x).to_vector<double>();
    auto want = naive_attention(attn, x, mask, /*causal=*/true);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < got.size(); ++i)
      EXPECT_NEAR(got[i], want[i], 1e-12) << (masked ? "masked " : "") << i;
  }
  // The causal mask acts: the bidirectional reference differs.
  Context ctx = f64_context();
  auto got = attn.forward(ctx, x).to_vector<double>();
  auto bidirectional = naive_attention(attn, x, {}, /*causal=*/false);
  double diff = 0;
  for (std::size_t i = 0; i < got.size(); ++i) diff += std::fabs(got[i] - bidirectional[i]);
  EXPECT_GT(diff, 1e-3);
}

// y, dx and every parameter gradient of one forward and backward, flattened, in f64.
std::vector<double> attention_step(MultiHeadSelfAttention& attn, Context& ctx, const Tensor& x,
                                   const Tensor& dy) {
  for (Parameter* p : attn.parameters()) p->grad.zero();
  std::vector<double> all = attn.forward(ctx, x).to(DType::F64).to_vector<double>();
  for (double v : attn.backward(ctx, dy).to(DType::F64).to_vector<double>()) all.push_back(v);
  for (Parameter* p : attn.parameters())
    for (double v : p->grad.to(DType::F64).to_vector<double>()) all.push_back(v);
  return all;
}

TEST(Attention, DropoutStepCounterIsReadWhenRun) {
  // Context::step.step (CUDA graphs replay it) gives attention dropout the step at the address.
  const std::int64_t b = 2, t = 6, e = 8;
  for (bool causal : {false, true}) {
    MultiHeadSelfAttention attn(e, 2, 0.3, QkvLayout::FusedQKV, causal);
    randomize_parameters(attn, 41);
    Tensor x = random_tensor({b, t, e}, 42, DType::F32);
    Tensor dy = random_tensor({b, t, e}, 43, DType::F32);
    Context fixed;
    fixed.run.seed = 5;
    const std::uint64_t eleven = 11, twelve = 12;
    fixed.step.step = &eleven;
    fixed.call.attention_mask = padding_mask(b, t);
    std::vector<double> want11 = attention_step(attn, fixed, x, dy);
    fixed.step.step = &twelve;
    std::vector<double> want12 = attention_step(attn, fixed, x, dy);
    ASSERT_NE(want11, want12) << "causal " << causal;

    std::uint64_t step = 11;
    Context ctx = fixed;
    ctx.step.step = &step;
    EXPECT_EQ(attention_step(attn, ctx, x, dy), want11) << "causal " << causal;
    step = 12;  // changing the value at the address changes the mask
    EXPECT_EQ(attention_step(attn, ctx, x, dy), want12) << "causal " << causal;
  }
}

TEST(Attention, CausalOutputsDoNotDependOnLaterTokens) {
  const std::int64_t b = 2, t = 6, e = 8;
  MultiHeadSelfAttention attn(e, 2, 0.0, QkvLayout::SeparateQKV, /*causal=*/true);
  Context ctx;
  Tensor x = random_tensor({b, t, e}, 33, DType::F32);
  auto y1 = attn.forward(ctx, x).to_vector<float>();
  Tensor x2 = x.clone();
  x2.select(1, 4).copy_from(random_tensor({b, e}, 34, DType::F32, 5.0));  // token 4 changes
  auto y2 = attn.forward(ctx, x2).to_vector<float>();
  for (std::int64_t bb = 0; bb < b; ++bb)
    for (std::int64_t i = 0; i < t; ++i) {
      double diff = 0;
      for (std::int64_t c = 0; c < e; ++c) {
        std::size_t k = static_cast<std::size_t>((bb * t + i) * e + c);
        diff += std::fabs(y1[k] - y2[k]);
      }
      if (i < 4)
        EXPECT_EQ(diff, 0.0) << "batch " << bb << " query " << i;
      else
        EXPECT_GT(diff, 1e-4) << "batch " << bb << " query " << i;
    }
}

// Runs x (B, T, E) through `layer` once, then through a KV cache: a prompt of `prompt` tokens,
// then one token at a time; every decoded output must equal the full forward's at its position.
void expect_decode_matches_full(Layer& layer, Context ctx, const Tensor& x, std::int64_t prompt,
                                std::int64_t capacity, double tol) {
  ctx.training = false;
  const std::int64_t t = x.size(1);
  Tensor full = layer.forward(ctx, x);
  auto want = full.to_vector<double>();
  const std::int64_t row = full.numel() / (x.size(0) * t);  // values per token
  KvCache cache;
  cache.capacity = capacity;
  ctx.call.kv_cache = &cache;
  for (std::int64_t from = 0; from < t;) {
    const std::int64_t to = from == 0 ? prompt : from + 1;
    Tensor y = layer.forward(ctx, x.slice(1, from, to).contiguous());
    ASSERT_EQ(y.size(1), to - from);
    auto got = y.to_vector<double>();
    for (std::int64_t bb = 0; bb < x.size(0); ++bb)
      for (std::int64_t i = from; i < to; ++i)
        for (std::int64_t c = 0; c < row; ++c) {
          double g = got[static_cast<std::size_t>((bb * (to - from) + i - from) * row + c)];
          double w = want[static_cast<std::size_t>((bb * t + i) * row + c)];
          ASSERT_NEAR(g, w, tol) << "batch " << bb << " position " << i << " column " << c;
        }
    cache.past = to;
    from = to;
  }
  EXPECT_FALSE(cache.entries.empty());
}

TEST(Attention, KvCacheDecodeMatchesFullCausalForward) {
  for (QkvLayout layout : {QkvLayout::SeparateQKV, QkvLayout::FusedQKV, QkvLayout::FusedConv1D}) {
    MultiHeadSelfAttention attn(12, 3, 0.2, layout, /*causal=*/true);
    attn.to(Device::cpu(), DType::F64);
    randomize_parameters(attn, 35);
    expect_decode_matches_full(attn, f64_context(), random_tensor({2, 9, 12}, 36), 3, 11, 1e-12);
  }
  // f32 activations take the same path.
  MultiHeadSelfAttention attn(8, 2, 0.0, QkvLayout::FusedConv1D, true);
  randomize_parameters(attn, 37);
  expect_decode_matches_full(attn, Context(), random_tensor({1, 6, 8}, 38, DType::F32), 3, 6, 1e-5);
}

TEST(Attention, KvCacheMisuseIsAnError) {
  MultiHeadSelfAttention attn(8, 2, 0.0, QkvLayout::FusedConv1D, true);
  Context ctx;
  ctx.training = false;
  KvCache cache;
  cache.capacity = 4;
  ctx.call.kv_cache = &cache;
  Tensor x = random_tensor({1, 3, 8}, 39, DType::F32);
  Tensor y = attn.forward(ctx, x);
  ASSERT_EQ(cache.entries.size(), 1u);
  EXPECT_EQ(cache.entries.begin()->second.first.shape(), (Shape{2, 4, 4}));  // (B*H, capacity, d)
  EXPECT_THROW(attn.backward(ctx, y), Error);  // nothing saved for backward
  cache.past = 3;
  EXPECT_THROW(attn.forward(ctx, x), InputError);  // positions [3, 6) exceed capacity 4
  cache.past = 1;
  ctx.call.attention_mask = Tensor::full({1, 4}, 1.0, DType::F32);
  EXPECT_THROW(attn.forward(ctx, x), InputError);
  ctx.call.attention_mask = Tensor();
  ctx.training = true;
  EXPECT_THROW(attn.forward(ctx, x), Error);
  ctx.training = false;
  MultiHeadSelfAttention bidirectional(8, 2);
  EXPECT_THROW(bidirectional.forward(ctx, x), Error);
}

TEST(Attention, MaskedKeysDoNotInfluenceOutputs) {
  const std::int64_t b = 2, t = 5, e = 8;
  MultiHeadSelfAttention attn(e, 2);
  Context ctx;
  ctx.call.attention_mask = padding_mask(b, t);  // batch 1 masks key 4
  Tensor x = random_tensor({b, t, e}, 31, DType::F32);
  auto y1 = attn.forward(ctx, x).to_vector<float>();
  Tensor x2 = x.clone();
  x2.select(0, 1).select(0, 4).copy_from(random_tensor({e}, 32, DType::F32, 5.0));
  auto y2 = attn.forward(ctx, x2).to_vector<float>();
  for (std::int64_t j = 0; j < 4; ++j)  // batch 1, unmasked queries
    for (std::int64_t c = 0; c < e; ++c) {
      std::size_t i = static_cast<std::size_t>((1 * t + j) * e + c);
      EXPECT_FLOAT_EQ(y1[i], y2[i]);
    }
  // Without the mask the same change does reach the other queries.
  ctx.call.attention_mask = Tensor();
  auto z1 = attn.forward(ctx, x).to_vector<float>(), z2 = attn.forward(ctx, x2).to_vector<float>();
  double diff = 0;
  for (std::size_t i = static_cast<std::size_t>(t * e);
       i < static_cast<std::size_t>((2 * t - 1) * e); ++i)
    diff += std::fabs(z1[i] - z2[i]);
  EXPECT_GT(diff, 1e-4);
}

TEST(Attention, ParameterNamesAndFlops) {
  MultiHeadSelfAttention bert(8, 2), vit(8, 2, 0.0, QkvLayout::FusedQKV);
  bert.set_name("attention");
  vit.set_name("self_attention");
  std::map<std::string, Shape> names;
  for (Parameter* p : bert.parameters()) names[p->name] = p->value.shape();
  for (Parameter* p : vit.parameters()) names[p->name] = p->value.shape();
  EXPECT_EQ(names.size(), 12u);
  EXPECT_EQ(names["attention.self.query.weight"], (Shape{8, 8}));
  EXPECT_EQ(names["attention.self.value.bias"], (Shape{8}));
  EXPECT_EQ(names["attention.output.dense.weight"], (Shape{8, 8}));
  EXPECT_EQ(names["self_attention.in_proj_weight"], (Shape{24, 8}));
  EXPECT_EQ(names["self_attention.in_proj_bias"], (Shape{24}));
  EXPECT_EQ(names["self_attention.out_proj.bias"], (Shape{8}));
  EXPECT_DOUBLE_EQ(bert.forward_flops({2, 5, 8}), 8.0 * 10 * 64 + 4.0 * 2 * 25 * 8);
}

// ---------------------------------------------------------------------------------------------
// Transformer block

TEST(TransformerBlock, PostNormGradientCheck) {
  TransformerBlock block(TransformerBlockConfig::bert(8, 2, 12, 0.2));
  block.set_name("layer");
  block.to(Device::cpu(), DType::F64);
  randomize_parameters(block, 41);
  Context ctx = f64_context();
  ctx.call.attention_mask = padding_mask(2, 5);
  expect_gradients_ok(block, ctx, random_tensor({2, 5, 8}, 42));
}

TEST(TransformerBlock, PreNormGradientCheck) {
  TransformerBlock block(TransformerBlockConfig::vit(8, 4, 12, 0.2));
  block.to(Device::cpu(), DType::F64);
  randomize_parameters(block, 43);
  Context ctx = f64_context();
  expect_gradients_ok(block, ctx, random_tensor({2, 3, 8}, 44));
  block.set_name("encoder_layer_0");
  std::vector<std::string> names;
  for (Parameter* p : block.parameters()) names.push_back(p->name);
  std::vector<std::string> want = {"encoder_layer_0.ln_1.weight",
                                   "encoder_layer_0.ln_1.bias",
                                   "encoder_layer_0.self_attention.in_proj_weight",
                                   "encoder_layer_0.self_attention.in_proj_bias",
                                   "encoder_layer_0.self_attention.out_proj.weight",
                                   "encoder_layer_0.self_attention.out_proj.bias",
                                   "encoder_layer_0.ln_2.weight",
                                   "encoder_layer_0.ln_2.bias",
                                   "encoder_layer_0.mlp.0.weight",
                                   "encoder_layer_0.mlp.0.bias",
                                   "encoder_layer_0.mlp.3.weight",
                                   "encoder_layer_0.mlp.3.bias"};
  EXPECT_EQ(names, want);
}

// ---------------------------------------------------------------------------------------------
// Models

ModelOptions tiny_bert_options() {
  ModelOptions o;
  o.name = "bert_base";
  o.vocab_size = 13;
  o.hidden_size = 8;
  o.num_layers = 2;
  o.num_heads = 2;
  o.intermediate_size = 12;
  o.max_position_embeddings = 9;
  o.seq_len = 5;
  o.dropout = 0.1;
  return o;
}

ModelOptions tiny_vit_options() {
  ModelOptions o;
  o.name = "vit_b16";
  o.image_size = 32;
  o.image_channels = 3;
  o.num_classes = 5;
  o.hidden_size = 8;
  o.num_layers = 2;
  o.num_heads = 2;
  o.intermediate_size = 12;
  o.dropout = 0.1;
  return o;
}

TEST(Bert, TinyModelGradientCheck) {
  Model m = make_model(tiny_bert_options());
  EXPECT_EQ(m.sample_shape, (Shape{5}));
  EXPECT_EQ(m.input_dtype, DType::I64);
  EXPECT_EQ(m.task, Task::MaskedLM);
  EXPECT_EQ(m.num_outputs, 13);
  m.net->to(Device::cpu(), DType::F64);
  randomize_parameters(*m.net, 51);
  Context ctx = f64_context();
  // Id 0 is the padding row, which gets no gradient by design, so the input avoids it.
  Tensor ids = Tensor::from_vector<std::int64_t>({1, 5, 5, 12, 3, 7, 2, 9, 5, 11}, {2, 5});
  ctx.call.attention_mask = Tensor::from_vector<double>({1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, {2, 5});
  EXPECT_EQ(m.net->forward(ctx, ids).shape(), (Shape{2, 5, 13}));
  expect_gradients_ok(*m.net, ctx, ids, /*check_input=*/false);
}

TEST(Bert, DecoderIsTiedToTheWordEmbedding) {
  Model m = make_model(tiny_bert_options());
  std::map<std::string, Parameter*> by_name;
  for (Parameter* p : m.net->parameters()) by_name[p->name] = p;
  EXPECT_EQ(by_name.count("cls.predictions.decoder.weight"), 0u);
  ASSERT_EQ(by_name.count("cls.predictions.bias"), 1u);
  ASSERT_EQ(by_name.count("bert.embeddings.word_embeddings.weight"), 1u);
  EXPECT_EQ(by_name.count("bert.encoder.layer.1.attention.output.LayerNorm.weight"), 1u);
  EXPECT_EQ(by_name.count("bert.encoder.layer.1.intermediate.dense.weight"), 1u);
  EXPECT_EQ(by_name.count("cls.predictions.transform.LayerNorm.bias"), 1u);
  // HuggingFace init: the padding row is zero, LayerNorm weights one, biases zero.
  for (double v :
       by_name["bert.embeddings.word_embeddings.weight"]->value.select(0, 0).to_vector<double>())
    EXPECT_EQ(v, 0.0);
  for (double v : by_name["bert.embeddings.LayerNorm.weight"]->value.to_vector<double>())
    EXPECT_EQ(v, 1.0);
  // Changing the embedding changes the logits through the decoder as well as the input.
  Parameter* word = by_name["bert.embeddings.word_embeddings.weight"];
  Context ctx;
  ctx.training = false;
  Tensor ids = Tensor::from_vector<std::int64_t>({1, 2, 3}, {1, 3});
  auto before = m.net->forward(ctx, ids).to_vector<float>();
  word->value.select(0, 10).fill(0.5);  // id 10 is not in the input: only the decoder sees it
  auto after = m.net->forward(ctx, ids).to_vector<float>();
  for (int pos = 0; pos < 3; ++pos) {
    for (int v = 0; v < 13; ++v) {
      if (v == 10)
        EXPECT_NE(before[pos * 13 + v], after[pos * 13 + v]);
      else
        EXPECT_EQ(before[pos * 13 + v], after[pos * 13 + v]);
    }
  }
}

TEST(Vit, TinyModelGradientCheck) {
  Model m = make_model(tiny_vit_options());
  EXPECT_EQ(m.sample_shape, (Shape{3, 32, 32}));
  EXPECT_EQ(m.input_dtype, DType::F32);
  EXPECT_EQ(m.task, Task::Classification);
  EXPECT_EQ(m.num_outputs, 5);
  m.net->to(Device::cpu(), DType::F64);
  randomize_parameters(*m.net, 61);
  Context ctx = f64_context();
  Tensor images = random_tensor({2, 3, 32, 32}, 62);
  EXPECT_EQ(m.net->forward(ctx, images).shape(), (Shape{2, 5}));
  expect_gradients_ok(*m.net, ctx, images);
}

ModelOptions tiny_gpt2_options() {
  ModelOptions o;
  o.name = "gpt2";
  o.vocab_size = 17;
  o.hidden_size = 8;
  o.num_layers = 2;
  o.num_heads = 2;
  o.intermediate_size = 16;
  o.max_positions = 10;
  o.seq_len = 7;
  o.dropout = 0.1;
  return o;
}

TEST(Gpt2, TinyModelGradientCheck) {
  Model m = make_model(tiny_gpt2_options());
  EXPECT_EQ(m.task, Task::CausalLM);
  m.net->to(Device::cpu(), DType::F64);
  randomize_parameters(*m.net, 71);
  Context ctx = f64_context();
  Tensor ids =
      Tensor::from_vector<std::int64_t>({1, 5, 5, 16, 3, 7, 2, 9, 0, 11, 4, 4, 8, 13}, {2, 7});
  EXPECT_EQ(m.net->forward(ctx, ids).shape(), (Shape{2, 7, 17}));
  expect_gradients_ok(*m.net, ctx, ids, /*check_input=*/false);
}

TEST(Gpt2, KvCacheDecodeMatchesFullForward) {
  Model m = make_model(tiny_gpt2_options());
  m.net->to(Device::cpu(), DType::F64);
  randomize_parameters(*m.net, 73);
  Tensor ids = Tensor::from_vector<std::int64_t>(
      {1, 5, 5, 16, 3, 7, 2, 9, 0, 11, 4, 4, 8, 13, 6, 6}, {2, 8});
  expect_decode_matches_full(*m.net, f64_context(), ids, 3, 10, 1e-12);
}

TEST(Vit, WrongImageSizeIsAnInputError) {
  Model m = make_model(tiny_vit_options());
  Context ctx;
  EXPECT_THROW(m.net->forward(ctx, random_tensor({1, 3, 48, 48}, 1, DType::F32)), InputError);
  ModelOptions bad = tiny_vit_options();
  bad.image_size = 28;
  EXPECT_THROW(make_model(bad), InputError);
}

TEST(Models, ReferenceParameterCountsShapesAndFlops) {
  {
    ModelOptions o;
    o.name = "bert_base";
    Model m = make_model(o);
    EXPECT_EQ(m.net->parameter_count(), 109514298);
    EXPECT_EQ(m.net->output_shape({4, 128}), (Shape{4, 128, 30522}));
    // GEMMs: 12 layers x (4 E^2 + 2 E I) + transform E^2 + decoder E V, per token, x 2, plus
    // the attention matmuls 12 x 2 x (2 T E) per token.
    double n = 4.0 * 128, e = 768, t = 128;
    double want =
        2 * n * (12 * (4 * e * e + 2 * e * 3072) + e * e + e * 30522) + 12 * 4 * n * t * e;
    EXPECT_DOUBLE_EQ(m.net->forward_flops({4, 128}), want);
    std::map<std::string, Shape> shapes;
    for (Parameter* p : m.net->parameters()) shapes[p->name] = p->value.shape();
    EXPECT_EQ(shapes["bert.encoder.layer.11.attention.self.query.weight"], (Shape{768, 768}));
    EXPECT_EQ(shapes["bert.embeddings.position_embeddings.weight"], (Shape{512, 768}));
    EXPECT_EQ(shapes["bert.embeddings.token_type_embeddings.weight"], (Shape{2, 768}));
    EXPECT_EQ(shapes["cls.predictions.bias"], (Shape{30522}));
  }
  {
    ModelOptions o;
    o.name = "vit_b16";
    o.image_size = 224;
    o.image_channels = 3;
    o.num_classes = 1000;
    Model m = make_model(o);
    EXPECT_EQ(m.net->parameter_count(), 86567656);
    EXPECT_EQ(m.net->output_shape({2, 3, 224, 224}), (Shape{2, 1000}));
    double b = 2, t = 197, e = 768;
    double want = 2 * b * 196 * e * 768 + 2 * b * e * 1000 +
                  12 * (2 * b * t * (4 * e * e + 2 * e * 3072) + 4 * b * t * t * e);
    EXPECT_DOUBLE_EQ(m.net->forward_flops({2, 3, 224, 224}), want);
    std::map<std::string, Shape> shapes;
    for (Parameter* p : m.net->parameters()) shapes[p->name] = p->value.shape();
    EXPECT_EQ(shapes["conv_proj.weight"], (Shape{768, 3, 16, 16}));
    EXPECT_EQ(shapes["class_token"], (Shape{1, 1, 768}));
    EXPECT_EQ(shapes["encoder.pos_embedding"], (Shape{1, 197, 768}));
    EXPECT_EQ(shapes["encoder.layers.encoder_layer_11.self_attention.in_proj_weight"],
              (Shape{2304, 768}));
    EXPECT_EQ(shapes["encoder.layers.encoder_layer_0.mlp.3.weight"], (Shape{768, 3072}));
    EXPECT_EQ(shapes["encoder.ln.weight"], (Shape{768}));
    EXPECT_EQ(shapes["heads.head.weight"], (Shape{1000, 768}));
  }
}

}  // namespace
}  // namespace kiln
