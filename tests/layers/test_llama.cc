// The llama family's layers on the CPU: finite-difference gradient checks in f64 for RMSNorm (and
// its residual fusions), the SwiGLU MLP, grouped-query attention with rotary positions (GQA 4:2,
// q/k/v biases, a head_dim other than hidden / heads) and tiny tied and untied models; rotary
// embeddings against the formula and Llama 3.1's frequency scaling; KV-cache decoding against
// the full causal forward; causality; Qwen2.5-0.5B's parameter count and names.

#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "core/ops.h"
#include "layers/attention.h"
#include "layers/gradient_check.h"
#include "layers/grouped_query_attention.h"
#include "layers/layernorm.h"
#include "layers/models/model.h"
#include "layers/rotary.h"
#include "layers/swiglu_mlp.h"
#include "tests/layers/tiny_llama.h"

namespace kiln {
namespace {

Tensor random_tensor(const Shape& shape, std::uint64_t seed, DType dtype = DType::F64,
                     double bound = 1.0) {
  Tensor t = Tensor::empty(shape, DType::F64);
  ops::fill_uniform(t, -bound, bound, seed);
  return t.to(dtype);
}

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
  EXPECT_EQ(r.skipped, 0) << r.report;
}

TEST(RMSNorm, NormalisesByTheRootMeanSquare) {
  RMSNorm norm(4, 1e-6);
  ASSERT_EQ(norm.parameters().size(), 1u);
  EXPECT_EQ(norm.parameters()[0]->name, "weight");
  norm.to(Device::cpu(), DType::F64);
  norm.weight().value.copy_from(Tensor::from_vector<double>({1, 2, 3, 4}, {4}));
  Context ctx = f64_context();
  Tensor x = Tensor::from_vector<double>({1, -2, 3, 0.5}, {1, 4});
  auto y = norm.forward(ctx, x).to_vector<double>();
  const double rms = std::sqrt((1 + 4 + 9 + 0.25) / 4 + 1e-6);
  const double want[4] = {1 / rms, -4 / rms, 9 / rms, 2 / rms};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(y[static_cast<std::size_t>(i)], want[i], 1e-12);
}

TEST(RMSNorm, GradientCheckF64) {
  RMSNorm norm(7, 1e-5);
  norm.to(Device::cpu(), DType::F64);
  randomize_parameters(norm, 3);
  Context ctx = f64_context();
  expect_gradients_ok(norm, ctx, random_tensor({3, 2, 7}, 4));
}

// y = RMSNorm(x + delta) with the residual's gradient g added to dx, as a wrapper layer.
class ResidualRMSNorm : public Layer {
 public:
  ResidualRMSNorm() { norm_ = &add_child("norm", std::make_unique<RMSNorm>(6)); }
  std::string type() const override { return "ResidualRMSNorm"; }
  Shape output_shape(const Shape& s) const override { return s; }

 protected:
  Tensor forward_impl(Context& ctx, const Tensor& x) override {
    norm_->add_to_next_input(delta_);
    Tensor y = norm_->forward(ctx, x);
    Tensor out = Tensor::empty(y.shape(), y.dtype());
    ops::add(y, norm_->residual_sum(), out);  // the sum is an output too
    return out;
  }
  Tensor backward_impl(Context& ctx, const Tensor& dy) override {
    norm_->add_to_next_dx(dy);
    return norm_->backward(ctx, dy);
  }

 public:
  RMSNorm* norm_;
  Tensor delta_ = random_tensor({2, 3, 6}, 77);
};

TEST(RMSNorm, ResidualFusionGradientCheckF64) {
  ResidualRMSNorm layer;
  layer.to(Device::cpu(), DType::F64);
  randomize_parameters(layer, 5);
  Context ctx = f64_context();
  expect_gradients_ok(layer, ctx, random_tensor({2, 3, 6}, 6));
}

TEST(Rotary, RotatesPairsAsTransformersAndInverts) {
  RotaryOptions o;
  o.theta = 100.0;
  RotaryEmbedding rope(4, 16, o);
  ASSERT_EQ(rope.inv_freq().size(), 2u);
  EXPECT_FLOAT_EQ(rope.inv_freq()[0], 1.0f);
  EXPECT_FLOAT_EQ(rope.inv_freq()[1], 0.1f);  // 1 / 100^(2/4)
  // Two heads of d = 4 in rows of width 10 (two columns past the heads stay untouched).
  Tensor x = random_tensor({6, 10}, 11);
  Tensor original = x.clone();
  rope.apply(x, 2, 3, 2, /*inverse=*/false);  // rows are positions 2, 3, 4, 2, 3, 4
  auto got = x.to_vector<double>();
  auto in = original.to_vector<double>();
  for (int r = 0; r < 6; ++r) {
    const int pos = 2 + r % 3;
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 2; ++i) {
        const double a = static_cast<double>(static_cast<float>(pos) * rope.inv_freq()[i]);
        const std::size_t lo = static_cast<std::size_t>(r * 10 + h * 4 + i), hi = lo + 2;
        EXPECT_NEAR(got[lo], in[lo] * std::cos(a) - in[hi] * std::sin(a), 1e-6);
        EXPECT_NEAR(got[hi], in[hi] * std::cos(a) + in[lo] * std::sin(a), 1e-6);
      }
    for (int c = 8; c < 10; ++c)
      EXPECT_EQ(got[static_cast<std::size_t>(r * 10 + c)],
                in[static_cast<std::size_t>(r * 10 + c)]);
  }
  rope.apply(x, 2, 3, 2, /*inverse=*/true);
  auto back = x.to_vector<double>();
  for (std::size_t i = 0; i < back.size(); ++i) EXPECT_NEAR(back[i], in[i], 1e-6);
  EXPECT_THROW(rope.apply(x, 2, 3, 14, false), InputError);  // positions 14..16 of 16
}

TEST(Rotary, Llama3ScalingDividesLowFrequenciesAndKeepsHighOnes) {
  RotaryOptions plain;
  plain.theta = 500000.0;
  RotaryOptions scaled = plain;
  scaled.llama3_factor = 32;
  scaled.low_freq_factor = 1;
  scaled.high_freq_factor = 4;
  scaled.original_max_positions = 8192;
  RotaryEmbedding a(64, 8, plain), b(64, 8, scaled);
  const double pi = 3.14159265358979323846;
  int kept = 0, divided = 0, smoothed = 0;
  for (std::size_t i = 0; i < a.inv_freq().size(); ++i) {
    const double wavelen = 2 * pi / a.inv_freq()[i];
    if (wavelen < 8192.0 / 4) {
      EXPECT_FLOAT_EQ(b.inv_freq()[i], a.inv_freq()[i]);
      ++kept;
    } else if (wavelen > 8192.0) {
      EXPECT_FLOAT_EQ(b.inv_freq()[i], a.inv_freq()[i] / 32);
      ++divided;
    } else {
      const double smooth = (8192.0 / wavelen - 1) / (4 - 1);
      EXPECT_NEAR(b.inv_freq()[i], (1 - smooth) * a.inv_freq()[i] / 32 + smooth * a.inv_freq()[i],
                  1e-6 * a.inv_freq()[i]);
      ++smoothed;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(smoothed, 0);
}

TEST(SwiGluMlp, NamesAndGradientCheckF64) {
  SwiGluMlp mlp(6, 10);
  std::map<std::string, Shape> shapes;
  mlp.set_name("mlp");
  for (Parameter* p : mlp.parameters()) shapes[p->name] = p->value.shape();
  EXPECT_EQ(shapes.size(), 3u);
  EXPECT_EQ(shapes["mlp.gate_proj.weight"], (Shape{10, 6}));
  EXPECT_EQ(shapes["mlp.up_proj.weight"], (Shape{10, 6}));
  EXPECT_EQ(shapes["mlp.down_proj.weight"], (Shape{6, 10}));
  mlp.to(Device::cpu(), DType::F64);
  randomize_parameters(mlp, 8);
  Context ctx = f64_context();
  expect_gradients_ok(mlp, ctx, random_tensor({2, 3, 6}, 9));
}

GroupedQueryAttentionConfig small_gqa(bool bias) {
  GroupedQueryAttentionConfig c;
  c.hidden = 12;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 4;  // not hidden / heads
  c.qkv_bias = bias;
  c.max_positions = 16;
  c.rotary.theta = 10.0;
  return c;
}

TEST(GroupedQueryAttention, GradientCheckF64) {
  for (bool bias : {false, true}) {
    GroupedQueryAttention attn(small_gqa(bias));
    attn.set_name("self_attn");
    std::map<std::string, Shape> shapes;
    for (Parameter* p : attn.parameters()) shapes[p->name] = p->value.shape();
    EXPECT_EQ(shapes["self_attn.q_proj.weight"], (Shape{16, 12}));
    EXPECT_EQ(shapes["self_attn.k_proj.weight"], (Shape{8, 12}));
    EXPECT_EQ(shapes["self_attn.v_proj.weight"], (Shape{8, 12}));
    EXPECT_EQ(shapes["self_attn.o_proj.weight"], (Shape{12, 16}));
    EXPECT_EQ(shapes.count("self_attn.q_proj.bias"), bias ? 1u : 0u);
    EXPECT_EQ(shapes.count("self_attn.o_proj.bias"), 0u);
    attn.to(Device::cpu(), DType::F64);
    randomize_parameters(attn, 12);
    Context ctx = f64_context();
    expect_gradients_ok(attn, ctx, random_tensor({2, 5, 12}, 13));
  }
}

TEST(GroupedQueryAttention, OutputsDoNotDependOnLaterTokens) {
  GroupedQueryAttention attn(small_gqa(true));
  attn.to(Device::cpu(), DType::F64);
  randomize_parameters(attn, 14);
  Context ctx = f64_context();
  Tensor x = random_tensor({1, 6, 12}, 15);
  auto before = attn.forward(ctx, x).to_vector<double>();
  Tensor changed = x.clone();
  changed.slice(1, 4, 6).copy_from(random_tensor({1, 2, 12}, 16));
  auto after = attn.forward(ctx, changed).to_vector<double>();
  for (std::size_t i = 0; i < 4 * 12; ++i) EXPECT_DOUBLE_EQ(before[i], after[i]);
  EXPECT_NE(before[5 * 12], after[5 * 12]);
}

// The full forward's outputs, then a prompt of 3 tokens and one token at a time through a KV
// cache: every decoded output equals the full forward's at its position.
void expect_decode_matches_full(Layer& layer, const Tensor& x, std::int64_t capacity) {
  Context ctx = f64_context();
  ctx.training = false;
  const std::int64_t t = x.size(1);
  Tensor full = layer.forward(ctx, x);
  auto want = full.to_vector<double>();
  const std::int64_t row = full.numel() / (x.size(0) * t);
  KvCache cache;
  cache.capacity = capacity;
  ctx.call.kv_cache = &cache;
  for (std::int64_t from = 0; from < t;) {
    const std::int64_t to = from == 0 ? 3 : from + 1;
    auto got = layer.forward(ctx, x.slice(1, from, to).contiguous()).to_vector<double>();
    for (std::int64_t bb = 0; bb < x.size(0); ++bb)
      for (std::int64_t i = from; i < to; ++i)
        for (std::int64_t c = 0; c < row; ++c)
          ASSERT_NEAR(got[static_cast<std::size_t>((bb * (to - from) + i - from) * row + c)],
                      want[static_cast<std::size_t>((bb * t + i) * row + c)], 1e-12)
              << "batch " << bb << " position " << i << " column " << c;
    cache.past = to;
    from = to;
  }
}

TEST(GroupedQueryAttention, KvCacheDecodeMatchesFullForward) {
  GroupedQueryAttention attn(small_gqa(true));
  attn.to(Device::cpu(), DType::F64);
  randomize_parameters(attn, 17);
  expect_decode_matches_full(attn, random_tensor({2, 7, 12}, 18), 10);
}

ModelOptions tiny_llama(bool tied) {
  ModelOptions o = llama_test::tiny_llama_options(tied ? "qwen2" : "llama");
  o.llama.tie_embeddings = tied;
  o.llama.qkv_bias = tied;
  if (!tied) o.llama.rope_llama3_factor = 8;  // tiny original_max_positions: every band used
  o.llama.rope_original_max_positions = 16;
  return o;
}

TEST(Llama, TinyModelsGradientCheck) {
  for (bool tied : {true, false}) {
    Model m = make_model(tiny_llama(tied));
    EXPECT_EQ(m.task, Task::CausalLM);
    std::map<std::string, Shape> shapes;
    for (Parameter* p : m.net->parameters()) shapes[p->name] = p->value.shape();
    EXPECT_EQ(shapes["model.embed_tokens.weight"], (Shape{19, 8}));
    EXPECT_EQ(shapes["model.layers.1.input_layernorm.weight"], (Shape{8}));
    EXPECT_EQ(shapes["model.layers.1.post_attention_layernorm.weight"], (Shape{8}));
    EXPECT_EQ(shapes["model.layers.0.self_attn.k_proj.weight"], (Shape{4, 8}));
    EXPECT_EQ(shapes["model.layers.0.mlp.down_proj.weight"], (Shape{8, 12}));
    EXPECT_EQ(shapes["model.norm.weight"], (Shape{8}));
    EXPECT_EQ(shapes.count("lm_head.weight"), tied ? 0u : 1u);
    m.net->to(Device::cpu(), DType::F64);
    randomize_parameters(*m.net, 21);
    Context ctx = f64_context();
    Tensor ids = Tensor::from_vector<std::int64_t>({1, 5, 5, 16, 3, 7, 2, 9, 0, 11, 4, 18}, {2, 6});
    EXPECT_EQ(m.net->forward(ctx, ids).shape(), (Shape{2, 6, 19}));
    expect_gradients_ok(*m.net, ctx, ids, /*check_input=*/false);
    Tensor long_ids = Tensor::from_vector<std::int64_t>(std::vector<std::int64_t>(13, 1), {1, 13});
    EXPECT_THROW(m.net->forward(ctx, long_ids), InputError);  // past max_positions 12
  }
}

TEST(Llama, KvCacheDecodeMatchesFullForward) {
  Model m = make_model(tiny_llama(false));
  m.net->to(Device::cpu(), DType::F64);
  randomize_parameters(*m.net, 23);
  Tensor ids = Tensor::from_vector<std::int64_t>(
      {1, 5, 5, 16, 3, 7, 2, 9, 0, 11, 4, 4, 8, 13, 6, 6}, {2, 8});
  expect_decode_matches_full(*m.net, ids, 12);
}

TEST(Llama, InitialisesAsTransformers) {
  Model m = make_model(tiny_llama(true));
  for (Parameter* p : m.net->parameters()) {
    auto v = p->value.to_vector<double>();
    if (p->name.find("norm") != std::string::npos) {
      for (double x : v) EXPECT_EQ(x, 1.0) << p->name;
    } else if (p->name.find("bias") != std::string::npos) {
      for (double x : v) EXPECT_EQ(x, 0.0) << p->name;
    } else {
      double sum2 = 0;
      for (double x : v) sum2 += x * x;
      EXPECT_NEAR(std::sqrt(sum2 / static_cast<double>(v.size())), 0.02, 0.01) << p->name;
    }
  }
}

TEST(Llama, Qwen2_5_0_5bHasTransformersParameterCount) {
  ModelOptions o;
  o.name = "qwen2_5_0_5b";
  o.vocab_size = 151936;
  o.hidden_size = 896;
  o.num_layers = 24;
  o.num_heads = 14;
  o.intermediate_size = 4864;
  o.max_positions = 1024;
  o.seq_len = 1024;
  o.llama.num_kv_heads = 2;
  o.llama.qkv_bias = true;
  o.llama.tie_embeddings = true;
  Model m = make_model(o);
  EXPECT_EQ(m.net->parameter_count(), 494032768);
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// Shapes only: Llama-3.1-8B's parameters counted without the 64 GB of fp32 values and gradients
// (kiln plan on a login node), with no memory behind any of them; the guard restores allocation.
TEST(ParameterShapesOnly, CountsAnEightBillionParameterModelWithoutMemory) {
  ModelOptions o;
  o.name = "llama3_1_8b";
  o.vocab_size = 128256;
  o.seq_len = 1024;
  o.hidden_size = 4096;
  o.num_layers = 32;
  o.num_heads = 32;
  o.intermediate_size = 14336;
  o.max_positions = 8192;
  o.llama.num_kv_heads = 8;
  o.llama.tie_embeddings = false;
  {
    ParameterShapesOnly shapes;
    Model m = make_model(o);
    EXPECT_EQ(m.net->parameter_count(), 8030261248);
    for (Parameter* p : m.net->parameters()) {
      ASSERT_EQ(p->value.data(), nullptr) << p->name;
      ASSERT_EQ(p->grad.data(), nullptr) << p->name;
    }
  }
  EXPECT_FALSE(ParameterShapesOnly::active());
  Model small = make_model(llama_test::tiny_llama_options("llama"));
  for (Parameter* p : small.net->parameters()) ASSERT_NE(p->value.data(), nullptr) << p->name;
}

}  // namespace
}  // namespace kiln
