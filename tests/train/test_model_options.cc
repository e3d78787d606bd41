// Model options from the experiment schema: `kiln model` (default_model_options) and
// `kiln train` (model_options_from) build the same network from one declaration per default.
#include "train/model_options.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "configs/experiment.h"

namespace kiln::train {
namespace {

TEST(ModelOptions, TheSchemaAcceptsExactlyTheModelsTheRegistryBuilds) {
  std::vector<std::string> accepted = config::known_model_names();
  std::vector<std::string> built = model_names();
  std::sort(accepted.begin(), accepted.end());
  std::sort(built.begin(), built.end());
  EXPECT_EQ(accepted, built);
}

TEST(ModelOptions, MlpHiddenWidthsAreTheSchemaDefault) {
  EXPECT_EQ(default_model_options("mlp").mlp_hidden, (std::vector<int>{512, 256}));
  config::Experiment e;
  e.mutable_model()->set_name("mlp");
  config::fill_defaults(e);
  EXPECT_EQ(model_options_from(e).mlp_hidden, default_model_options("mlp").mlp_hidden);
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
