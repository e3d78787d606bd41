// LoRA on the llama family, on the CPU in f64: PEFT's names and shapes, the frozen base (no
// gradient), adapters that start at the base model (B = 0), finite-difference gradient checks
// of the adapters (with and without dropout, the base frozen and not), the adapters' gradients
// the same whether the base is frozen or not, and the merge kiln export --hf does (the merged
// model without adapters gives the adapted model's logits).

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "core/ops.h"
#include "infer/lora_export.h"
#include "layers/gradient_check.h"
#include "layers/models/model.h"
#include "tests/layers/tiny_llama.h"

namespace kiln {
namespace {

using llama_test::f64_context;

ModelOptions tiny_llama(int rank, double dropout = 0.0) {
  ModelOptions o = llama_test::tiny_llama_options("qwen2");
  o.llama.tie_embeddings = true;
  o.llama.qkv_bias = true;
  o.lora.rank = rank;
  o.lora.alpha = 3.0;
  o.lora.dropout = dropout;
  o.lora.targets = lora_projection_names();
  return o;
}

Tensor ids() {
  return Tensor::from_vector<std::int64_t>({1, 5, 5, 16, 3, 7, 2, 9, 0, 11, 4, 18}, {2, 6});
}

// Every parameter uniform in [-0.5, 0.5] (B too, so the adapters' gradients are not trivially 0).
void randomize(Model& m, std::uint64_t seed) {
  for (Parameter* p : m.net->parameters()) ops::fill_uniform(p->value, -0.5, 0.5, ++seed);
}

TEST(Lora, PeftNamesShapesAndAFrozenBase) {
  Model m = make_model(tiny_llama(2));
  std::map<std::string, Shape> adapters;
  for (Parameter* p : m.net->parameters()) {
    if (is_lora_parameter(p->name)) {
      adapters[p->name] = p->value.shape();
      EXPECT_FALSE(p->frozen) << p->name;
    } else {
      EXPECT_TRUE(p->frozen) << p->name;
    }
  }
  EXPECT_EQ(adapters.size(), 2u * 7u * 2u);
  const std::string l = "model.layers.1.";
  EXPECT_EQ(adapters[l + "self_attn.q_proj.lora_A.weight"], (Shape{2, 8}));
  EXPECT_EQ(adapters[l + "self_attn.q_proj.lora_B.weight"], (Shape{8, 2}));
  EXPECT_EQ(adapters[l + "self_attn.k_proj.lora_B.weight"], (Shape{4, 2}));
  EXPECT_EQ(adapters[l + "self_attn.o_proj.lora_A.weight"], (Shape{2, 8}));
  EXPECT_EQ(adapters[l + "mlp.gate_proj.lora_B.weight"], (Shape{12, 2}));
  EXPECT_EQ(adapters[l + "mlp.up_proj.lora_A.weight"], (Shape{2, 8}));
  EXPECT_EQ(adapters[l + "mlp.down_proj.lora_A.weight"], (Shape{2, 12}));
  EXPECT_EQ(adapters[l + "mlp.down_proj.lora_B.weight"], (Shape{8, 2}));
  m.net->to(Device::cpu(), DType::F64);
  for (Parameter* p : m.net->parameters()) EXPECT_EQ(p->grad.defined(), !p->frozen) << p->name;
  EXPECT_EQ(trainable(m.net->parameters()).size(), adapters.size());
}

TEST(Lora, StartsAtTheBaseModel) {
  Model base = make_model(tiny_llama(0));
  Model adapted = make_model(tiny_llama(4));
  base.net->reset_parameters(7);
  adapted.net->reset_parameters(7);
  bool a_nonzero = false;
  for (Parameter* p : adapted.net->parameters()) {
    if (p->name.find("lora_A") != std::string::npos) {
      a_nonzero = a_nonzero || ops::reduce(p->value, ops::Reduction::Max).item() > 0;
    }
    if (p->name.find("lora_B") != std::string::npos) {
      EXPECT_EQ(ops::reduce(p->value, ops::Reduction::L2Norm).item(), 0.0) << p->name;
    }
  }
  EXPECT_TRUE(a_nonzero);
  base.net->to(Device::cpu(), DType::F64);
  adapted.net->to(Device::cpu(), DType::F64);
  Context ctx = f64_context();
  const std::vector<double> want = base.net->forward(ctx, ids()).to_vector<double>();
  const std::vector<double> got = adapted.net->forward(ctx, ids()).to_vector<double>();
  ASSERT_EQ(want.size(), got.size());
  for (std::size_t i = 0; i < want.size(); ++i) ASSERT_EQ(want[i], got[i]) << i;
}

TEST(Lora, AdapterGradientCheckF64) {
  for (double dropout : {0.0, 0.3}) {
    Model m = make_model(tiny_llama(3, dropout));
    m.net->to(Device::cpu(), DType::F64);
    randomize(m, 41);
    Context ctx = f64_context();
    GradientCheckOptions opt;
    opt.check_input = false;
    GradientCheckResult r = check_layer_gradients(*m.net, ctx, ids(), opt);
    EXPECT_TRUE(r.ok) << "dropout " << dropout << ": " << r.report;
    EXPECT_GT(r.checked, 100) << r.report;
  }
}

// The base unfrozen too: every weight's gradient through the adapted projections.
TEST(Lora, WholeModelGradientCheckF64) {
  Model m = make_model(tiny_llama(2));
  for (Parameter* p : m.net->parameters()) p->frozen = false;
  m.net->to(Device::cpu(), DType::F64);
  randomize(m, 43);
  Context ctx = f64_context();
  GradientCheckOptions opt;
  opt.check_input = false;
  GradientCheckResult r = check_layer_gradients(*m.net, ctx, ids(), opt);
  EXPECT_TRUE(r.ok) << r.report;
  EXPECT_GT(r.checked, 300) << r.report;
}

std::map<std::string, std::vector<double>> adapter_grads(bool frozen) {
  Model m = make_model(tiny_llama(2));
  if (!frozen) {
    for (Parameter* p : m.net->parameters()) p->frozen = false;
  }
  m.net->to(Device::cpu(), DType::F64);
  randomize(m, 45);
  Context ctx = f64_context();
  Tensor y = m.net->forward(ctx, ids());
  Tensor dy = Tensor::empty(y.shape(), DType::F64);
  ops::fill_uniform(dy, -1, 1, 46);
  m.net->backward(ctx, dy);
  std::map<std::string, std::vector<double>> out;
  for (Parameter* p : m.net->parameters()) {
    if (is_lora_parameter(p->name)) out[p->name] = p->grad.to_vector<double>();
  }
  return out;
}

TEST(Lora, AdapterGradientsDoNotDependOnTheBaseBeingFrozen) {
  EXPECT_EQ(adapter_grads(true), adapter_grads(false));
}

// Each projection alone, then all seven.
TEST(Lora, MergedModelGivesTheAdaptedLogitsForEachProjection) {
  for (const std::string& target : lora_projection_names()) {
    ModelOptions o = tiny_llama(3);
    o.lora.targets = {target};
    Model adapted = make_model(o);
    adapted.net->to(Device::cpu(), DType::F64);
    randomize(adapted, 51);
    NamedTensors tensors;
    for (Parameter* p : adapted.net->parameters()) tensors.emplace_back(p->name, p->value);
    const NamedTensors merged = infer::merge_lora_adapters(tensors, o.lora.scale());
    Model base = make_model(tiny_llama(0));
    base.net->to(Device::cpu(), DType::F64);
    std::map<std::string, Tensor> by_name(merged.begin(), merged.end());
    for (Parameter* p : base.net->parameters()) p->value.copy_from(by_name.at(p->name));
    Context ctx = f64_context();
    ctx.training = false;
    const std::vector<double> want = adapted.net->forward(ctx, ids()).to_vector<double>();
    const std::vector<double> out = base.net->forward(ctx, ids()).to_vector<double>();
    double worst = 0;
    for (std::size_t i = 0; i < want.size(); ++i)
      worst = std::max(worst, std::abs(out[i] - want[i]));
    EXPECT_LT(worst, 1e-12) << target;
  }
}

TEST(Lora, MergedModelGivesTheAdaptedLogits) {
  Model adapted = make_model(tiny_llama(3));
  adapted.net->to(Device::cpu(), DType::F64);
  randomize(adapted, 51);
  NamedTensors tensors;
  for (Parameter* p : adapted.net->parameters()) tensors.emplace_back(p->name, p->value);
  const double scale = tiny_llama(3).lora.scale();
  EXPECT_EQ(scale, 1.0);
  const NamedTensors merged = infer::merge_lora_adapters(tensors, scale);
  Model base = make_model(tiny_llama(0));
  base.net->to(Device::cpu(), DType::F64);
  ASSERT_EQ(merged.size(), base.net->parameters().size());
  std::map<std::string, Tensor> by_name(merged.begin(), merged.end());
  for (Parameter* p : base.net->parameters()) {
    ASSERT_TRUE(by_name.count(p->name)) << p->name;
    p->value.copy_from(by_name.at(p->name));
  }
  // W + scale B A by hand for one projection.
  const std::string q = "model.layers.0.self_attn.q_proj.";
  std::map<std::string, Tensor> original(tensors.begin(), tensors.end());
  const std::vector<double> w = original.at(q + "weight").to_vector<double>();
  const std::vector<double> a = original.at(q + "lora_A.weight").to_vector<double>();
  const std::vector<double> b = original.at(q + "lora_B.weight").to_vector<double>();
  const std::vector<double> got = by_name.at(q + "weight").to_vector<double>();
  for (int i = 0; i < 8; ++i) {
    for (int j = 0; j < 8; ++j) {
      double want = w[static_cast<std::size_t>(i * 8 + j)];
      for (int r = 0; r < 3; ++r)
        want +=
            scale * b[static_cast<std::size_t>(i * 3 + r)] * a[static_cast<std::size_t>(r * 8 + j)];
      EXPECT_NEAR(got[static_cast<std::size_t>(i * 8 + j)], want, 1e-15);
    }
  }
  Context ctx = f64_context();
  ctx.training = false;
  const std::vector<double> want = adapted.net->forward(ctx, ids()).to_vector<double>();
  const std::vector<double> out = base.net->forward(ctx, ids()).to_vector<double>();
  ASSERT_EQ(want.size(), out.size());
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(out[i], want[i], 1e-12) << i;
}

TEST(Lora, PeftAdapterNamesAndConfig) {
  Model m = make_model(tiny_llama(2));
  NamedTensors tensors;
  for (Parameter* p : m.net->parameters()) tensors.emplace_back(p->name, p->value);
  const NamedTensors adapters = infer::peft_adapter_tensors(tensors);
  ASSERT_EQ(adapters.size(), 28u);
  EXPECT_EQ(adapters.front().first,
            "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
  LoraOptions o = tiny_llama(2).lora;
  o.alpha = 16;
  const std::string json = infer::peft_adapter_config_json(o);
  for (const char* want : {"\"peft_type\":\"LORA\"", "\"r\":2", "\"lora_alpha\":16",
                           "\"task_type\":\"CAUSAL_LM\"", "\"down_proj\""})
    EXPECT_NE(json.find(want), std::string::npos) << want << " in " << json;
}

TEST(Lora, MergeRefusesAnAdapterWithoutItsPair) {
  NamedTensors tensors = {{"x.weight", Tensor::zeros({4, 3}, DType::F32)},
                          {"x.lora_A.weight", Tensor::zeros({2, 3}, DType::F32)}};
  EXPECT_THROW(infer::merge_lora_adapters(tensors, 1.0), InputError);
  tensors.emplace_back("x.lora_B.weight", Tensor::zeros({5, 2}, DType::F32));
  EXPECT_THROW(infer::merge_lora_adapters(tensors, 1.0), InputError);  // B (5, 2) for W (4, 3)
}

}  // namespace
}  // namespace kiln
