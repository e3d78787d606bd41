// Model options from the experiment schema: `kiln model` (default_model_options) and
// `kiln train` (model_options_from) build the same network from one declaration per default.
#include "train/model_options.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "configs/experiment.h"
#include "core/check.h"
#include "train/parameter_loader.h"

namespace kiln::train {
namespace {

TEST(ModelOptions, TheSchemaAcceptsExactlyTheModelsTheRegistryBuilds) {
  std::vector<std::string> accepted = config::known_model_names();
  std::vector<std::string> built = model_names();
  std::sort(accepted.begin(), accepted.end());
  std::sort(built.begin(), built.end());
  EXPECT_EQ(accepted, built);
}

// The GPT-2 sizes: the parameter counts transformers gives (tied head counted once).
TEST(ModelOptions, Gpt2SizesHaveTransformersParameterCounts) {
  const std::vector<std::pair<std::string, std::int64_t>> sizes = {{"gpt2", 124439808},
                                                                   {"gpt2_medium", 354823168}};
  for (const auto& [name, count] : sizes) {
    const ModelOptions o = default_model_options(name);
    EXPECT_EQ(o.vocab_size, 50257) << name;
    EXPECT_EQ(o.max_positions, 1024) << name;
    std::int64_t n = 12LL * o.hidden_size * o.hidden_size + 13LL * o.hidden_size;  // a block
    n = n * o.num_layers + (o.vocab_size + o.max_positions + 2LL) * o.hidden_size;
    EXPECT_EQ(n, count) << name;
  }
  EXPECT_EQ(make_model(default_model_options("gpt2")).net->parameter_count(), 124439808);
}

// Weights in transformers' layout: Conv1D weights (in, out), names with or without the LM head's
// "transformer." prefix (GPT2Model's files); a weight in Kiln's own (out, in) layout is refused.
TEST(ParameterLoader, Gpt2WeightsInTransformersLayoutAndNames) {
  const std::vector<std::string> tiny = {"model.gpt.vocab_size=40",   "model.gpt.seq_len=8",
                                         "model.gpt.max_positions=8", "model.gpt.hidden_size=16",
                                         "model.gpt.num_layers=1",    "model.gpt.num_heads=2"};
  Model source = make_model(default_model_options("gpt2", tiny));
  source.net->reset_parameters(5);
  std::map<std::string, Tensor> base;  // GPT2Model's names
  int transposed = 0;
  for (Parameter* p : source.net->parameters()) {
    std::string name = p->name;
    if (name.rfind("transformer.", 0) == 0) name = name.substr(12);
    base.emplace(name, stored_layout(*p).clone());
    if (p->stored_transposed) {
      ++transposed;
      EXPECT_EQ(stored_layout(*p).size(0), p->value.size(1)) << p->name;
    }
  }
  EXPECT_EQ(transposed, 4);  // c_attn, attn.c_proj, c_fc, mlp.c_proj
  Model target = make_model(default_model_options("gpt2", tiny));
  load_named_tensors({"gpt2.safetensors", &base, ""}, target.net->parameters(), {}, false);
  std::vector<Parameter*> want = source.net->parameters(), got = target.net->parameters();
  ASSERT_EQ(want.size(), got.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i]->value.to_vector<float>(), want[i]->value.to_vector<float>()) << got[i]->name;
  }
  // The c_attn weight as Kiln holds it, (3E, E), is not transformers' (E, 3E).
  std::map<std::string, Tensor> wrong = base;
  wrong["h.0.attn.c_attn.weight"] = source.net->parameters()[4]->value;
  ASSERT_EQ(source.net->parameters()[4]->name, "transformer.h.0.attn.c_attn.weight");
  try {
    load_named_tensors({"gpt2.safetensors", &wrong, ""}, target.net->parameters(), {}, false);
    ADD_FAILURE() << "a Conv1D weight in the wrong layout was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("transformer.h.0.attn.c_attn.weight' has shape (48, 16)"),
              std::string::npos)
        << e.what();
  }
}

std::string load_error(const std::map<std::string, Tensor>& file, Parameter& p, Buffer* b) {
  std::vector<Buffer*> buffers;
  if (b != nullptr) buffers.push_back(b);
  try {
    load_named_tensors({"w.safetensors", &file, " (model.init_from)"}, {&p}, buffers, false);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

// Values are converted between floating-point types only: integers are never read as weights;
// a NaN or inf weight is refused naming the tensor.
TEST(ParameterLoader, DtypesConvertBetweenFloatsOnlyAndValuesMustBeFinite) {
  Parameter p;
  p.name = "fc.weight";
  p.value = Tensor::zeros({2}, DType::F32);
  std::map<std::string, Tensor> file;
  file["fc.weight"] = Tensor::from_vector<std::int32_t>({1, 2}, {2});
  std::string m = load_error(file, p, nullptr);
  EXPECT_NE(m.find("w.safetensors: parameter 'fc.weight' is i32, the model holds it as f32"),
            std::string::npos)
      << m;
  file["fc.weight"] = Tensor::from_vector<float>({0.5f, -2.0f}, {2}).to(DType::F16);
  EXPECT_EQ(load_error(file, p, nullptr), "");
  EXPECT_EQ(p.value.to_vector<float>(), (std::vector<float>{0.5f, -2.0f}));
  for (float bad : {std::nanf(""), INFINITY}) {
    file["fc.weight"] = Tensor::from_vector<float>({1.0f, bad}, {2}).to(DType::BF16);
    m = load_error(file, p, nullptr);
    EXPECT_NE(m.find("parameter 'fc.weight' holds 1 non-finite value(s)"), std::string::npos) << m;
    EXPECT_NE(m.find("at flat index 1"), std::string::npos) << m;
  }
  // PyTorch keeps batch norm's num_batches_tracked as int64, Kiln as a float: accepted.
  file["fc.weight"] = Tensor::from_vector<float>({1.0f, 2.0f}, {2});
  Buffer counter;
  counter.name = "bn.num_batches_tracked";
  counter.value = Tensor::zeros({}, DType::F32);
  file["bn.num_batches_tracked"] = Tensor::from_vector<std::int64_t>({7}, {});
  EXPECT_EQ(load_error(file, p, &counter), "");
  EXPECT_EQ(counter.value.item(), 7.0);
  Buffer mean;
  mean.name = "bn.running_mean";
  mean.value = Tensor::zeros({2}, DType::F32);
  file["bn.running_mean"] = Tensor::from_vector<float>({0.0f, NAN}, {2});
  m = load_error(file, p, &mean);
  EXPECT_NE(m.find("buffer 'bn.running_mean' holds 1 non-finite"), std::string::npos) << m;
}

TEST(ModelOptions, MlpHiddenWidthsAreTheSchemaDefault) {
  EXPECT_EQ(default_model_options("mlp").mlp_hidden, (std::vector<int>{512, 256}));
  config::Experiment e;
  e.mutable_model()->set_name("mlp");
  config::fill_defaults(e);
  EXPECT_EQ(model_options_from(e).mlp_hidden, default_model_options("mlp").mlp_hidden);
}

TEST(ModelOptions, ConvBatchNormFusionFollowsTheExperiment) {
  config::Experiment e;
  e.mutable_model()->set_name("resnet50");
  config::fill_defaults(e);
  EXPECT_FALSE(model_options_from(e).fuse_conv_batch_norm);  // off unless asked for
  e.mutable_model()->set_fuse_conv_batch_norm(true);
  EXPECT_TRUE(model_options_from(e).fuse_conv_batch_norm);
}

TEST(ModelOptions, KeepAllKeepsGpt2sGeluOutput) {
  config::Experiment e;
  e.mutable_model()->set_name("gpt2");
  config::fill_defaults(e);
  EXPECT_FALSE(model_options_from(e).keep_mlp_activation);  // NONE recomputes it, as llm.c
  e.mutable_train()->set_recompute(config::TrainConfig::KEEP_ALL);
  EXPECT_TRUE(model_options_from(e).keep_mlp_activation);
  EXPECT_FALSE(model_options_from(e).recompute_blocks);
}

TEST(ModelOptions, ReferenceShapesPerModel) {
  const ModelOptions cnn = default_model_options("fashion_cnn");
  EXPECT_EQ(cnn.num_classes, 10);
  EXPECT_EQ(cnn.image_size, 28);
  EXPECT_EQ(cnn.image_channels, 1);
  EXPECT_DOUBLE_EQ(cnn.dropout, 0.0);
  const ModelOptions vit = default_model_options("vit_b16");
  EXPECT_EQ(vit.num_classes, 1000);
  EXPECT_EQ(vit.image_size, 224);
  EXPECT_EQ(vit.image_channels, 3);
  EXPECT_DOUBLE_EQ(vit.dropout, 0.0);  // torchvision's vit_b_16 has none
  const ModelOptions bert = default_model_options("bert_base");
  EXPECT_DOUBLE_EQ(bert.dropout, 0.1);
  EXPECT_EQ(bert.vocab_size, 30522);
  EXPECT_EQ(bert.hidden_size, 768);
  EXPECT_EQ(bert.intermediate_size, 3072);
  EXPECT_EQ(bert.seq_len, 128);
}

}  // namespace
}  // namespace kiln::train
