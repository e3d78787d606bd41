// Tests of configs/hf_config.h: transformers' config.json read into model.llama / model.gpt (keys,
// transformers' defaults, both rope formats, the architectures refused), compared with an
// experiment, written back, and applied by model.from_hf_config in fill_defaults.
#include "configs/hf_config.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "configs/experiment.h"
#include "tests/configs/config_test_util.h"

namespace kiln::config {
namespace {

namespace fs = std::filesystem;

// A fresh folder holding config.json = `text`; returns the folder.
std::string folder_with(const std::string& name, const std::string& text) {
  const fs::path dir = fs::temp_directory_path() / ("kiln_test_hf_config_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << text;
  return dir.string();
}

// Qwen2.5-0.5B's config.json as the Hub has it (transformers 4.43).
const char* kQwen = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
  "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
  "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
  "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.1", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 151936})";

// Llama 3.2 1B's shape in transformers 5's rope_parameters, without the optional keys.
const char* kLlama5 = R"({
  "model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
  "max_position_embeddings": 131072, "num_attention_heads": 32, "num_hidden_layers": 16,
  "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "tie_word_embeddings": true,
  "vocab_size": 128256, "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0,
  "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
  "original_max_position_embeddings": 8192}})";

TEST(HfConfig, QwenConfigIsTheQwenPreset) {
  const HfConfig hf = read_hf_config(folder_with("qwen", kQwen), "model.from_hf_config");
  EXPECT_EQ(hf.model_type, "qwen2");
  const LlamaShape& s = hf.model.llama();
  EXPECT_EQ(s.num_kv_heads(), 2);
  EXPECT_EQ(s.head_dim(), 64);  // absent: hidden_size / num_attention_heads
  EXPECT_TRUE(s.qkv_bias());
  EXPECT_FALSE(s.rope_scaling().has_factor());
  EXPECT_FALSE(s.has_seq_len());
  Experiment preset;
  preset.mutable_model()->set_name("qwen2_5_0_5b");
  fill_defaults(preset);
  EXPECT_TRUE(hf_config_mismatches(hf, preset.model()).empty());
}

TEST(HfConfig, TransformersFiveRopeParametersAndDefaults) {
  const HfConfig hf = read_hf_config(folder_with("llama5", kLlama5) + "/config.json", "f");
  const LlamaShape& s = hf.model.llama();
  EXPECT_EQ(s.rope_theta(), 500000.0);
  EXPECT_EQ(s.rope_scaling().factor(), 32.0);
  EXPECT_EQ(s.rope_scaling().original_max_positions(), 8192);
  EXPECT_FALSE(s.qkv_bias());
  Experiment preset;
  preset.mutable_model()->set_name("llama3_2_1b");
  fill_defaults(preset);
  EXPECT_TRUE(hf_config_mismatches(hf, preset.model()).empty());
  // transformers 4's keys: rope_scaling with the old "type" key; rope_theta absent is 10000.
  const HfConfig old =
      read_hf_config(folder_with("llama4", R"({"model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "max_position_embeddings": 64, "num_attention_heads": 4,
        "num_hidden_layers": 2, "rms_norm_eps": 1e-5, "vocab_size": 100,
        "rope_scaling": {"type": "llama3", "factor": 8, "low_freq_factor": 1,
        "high_freq_factor": 4, "original_max_position_embeddings": 32}})"),
                     "f");
  EXPECT_EQ(old.model.llama().rope_theta(), 10000.0);
  EXPECT_EQ(old.model.llama().num_kv_heads(), 4);  // absent: num_attention_heads
  EXPECT_FALSE(old.model.llama().tie_embeddings());
  EXPECT_EQ(old.model.llama().rope_scaling().factor(), 8.0);
}

TEST(HfConfig, MismatchesNameBothSides) {
  const HfConfig hf = read_hf_config(folder_with("qwen_mismatch", kQwen), "model.init_from");
  Experiment e;
  e.mutable_model()->set_name("qwen2");
  e.mutable_model()->mutable_llama()->set_num_kv_heads(7);
  e.mutable_model()->mutable_llama()->set_max_positions(1024);  // sizes tables only: allowed
  fill_defaults(e);
  const std::vector<std::string> lines = hf_config_mismatches(hf, e.model());
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0],
            "num_kv_heads 2 in config.json (num_key_value_heads), 7 in the experiment "
            "(model.llama.num_kv_heads)");
  e.mutable_model()->mutable_llama()->set_num_kv_heads(2);
  e.mutable_model()->mutable_llama()->set_qkv_bias(false);
  e.mutable_model()->mutable_llama()->mutable_rope_scaling()->set_factor(8);
  const std::vector<std::string> two = hf_config_mismatches(hf, e.model());
  ASSERT_EQ(two.size(), 2u);
  EXPECT_NE(two[0].find("qkv_bias true in config.json (model_type qwen2"), std::string::npos);
  EXPECT_NE(two[1].find("rope_scaling.factor none in config.json"), std::string::npos);
  Experiment gpt;
  gpt.mutable_model()->set_name("gpt2");
  fill_defaults(gpt);
  EXPECT_EQ(hf_config_mismatches(hf, gpt.model()).at(0),
            "model_type qwen2 in config.json, \"gpt2\" in the experiment (model.name)");
}

// What kiln export --hf writes reads back as the model it came from, for every family.
TEST(HfConfig, WrittenConfigReadsBackAsTheModel) {
  for (const std::vector<std::string>& sets : std::vector<std::vector<std::string>>{
           {"model.name=llama3_1_8b"},
           {"model.name=qwen2_5_7b"},
           {"model.name=llama", "model.llama.head_dim=32"},
           {"model.name=gpt2"},
           {"model.name=gpt2_medium", "model.gpt.intermediate_size=1000"}}) {
    Experiment e;
    for (const std::string& s : sets) apply_override(e, s);
    fill_defaults(e);
    const std::string json = hf_config_json(e.model(), "bfloat16");
    const HfConfig hf = read_hf_config(folder_with("roundtrip", json), "f");
    EXPECT_TRUE(hf_config_mismatches(hf, e.model()).empty())
        << sets[0] << ": " << hf_config_mismatches(hf, e.model()).at(0) << "\n"
        << json;
  }
  Experiment qwen;
  apply_override(qwen, "model.name=qwen2_5_7b");
  fill_defaults(qwen);
  const std::string json = hf_config_json(qwen.model(), "float32");
  EXPECT_NE(json.find("\"architectures\": [\"Qwen2ForCausalLM\"]"), std::string::npos) << json;
  EXPECT_NE(json.find("\"rope_theta\": 1000000.0"), std::string::npos) << json;
  EXPECT_NE(json.find("\"tie_word_embeddings\": false"), std::string::npos) << json;
  Experiment mlp;
  apply_override(mlp, "model.name=mlp");
  fill_defaults(mlp);
  EXPECT_NE(error_of([&] { hf_config_json(mlp.model(), "float32"); }).find("no transformers"),
            std::string::npos);
}

TEST(HfConfig, FromHfConfigFillsWhatTheExperimentLeavesOut) {
  const std::string dir = folder_with("fill", kQwen);
  Experiment e;
  apply_override(e, "model.from_hf_config=" + dir);
  apply_override(e, "model.llama.num_layers=2");  // given: kept
  fill_defaults(e);
  EXPECT_EQ(e.model().name(), "qwen2");
  EXPECT_EQ(e.model().llama().num_layers(), 2);
  EXPECT_EQ(e.model().llama().hidden_size(), 896);
  EXPECT_EQ(e.model().llama().seq_len(), 1024);
  EXPECT_TRUE(e.model().llama().qkv_bias());
  // A preset's name keeps config.json's shape: no preset rope_scaling is added to it.
  Experiment named;
  apply_override(named, "model.name=llama3_1_8b");
  apply_override(named, "model.from_hf_config=" + dir);
  fill_defaults(named);
  EXPECT_FALSE(named.model().llama().rope_scaling().has_factor());
  EXPECT_EQ(named.model().llama().vocab_size(), 151936);
  Experiment other;
  apply_override(other, "model.name=gpt2");
  apply_override(other, "model.from_hf_config=" + dir);
  EXPECT_NE(error_of([&] { fill_defaults(other); })
                .find("model.name \"gpt2\" and model.from_hf_config \"" + dir +
                      "\" (model_type \"qwen2\") disagree"),
            std::string::npos);
  // seq_len not given: at most the positions config.json has.
  Experiment small;
  apply_override(small, "model.from_hf_config=" +
                            folder_with("gpt", R"({"model_type": "gpt2", "vocab_size": 64,
                              "n_embd": 16, "n_layer": 1, "n_head": 2, "n_positions": 32})"));
  fill_defaults(small);
  EXPECT_EQ(small.model().name(), "gpt2");
  EXPECT_EQ(small.model().gpt().seq_len(), 32);
  EXPECT_EQ(small.model().gpt().intermediate_size(), 64);  // n_inner absent: 4 * n_embd
}

// Bad files and architectures Kiln does not build: a ConfigError naming the file and the key.
TEST(HfConfig, RefusalsNameTheFileAndTheKey) {
  struct Case {
    std::string json, expected;
  };
  const std::string llama = R"("model_type": "llama", "vocab_size": 10, "hidden_size": 8,
    "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 16,
    "max_position_embeddings": 8, "rms_norm_eps": 1e-5)";
  const std::string gpt = R"("model_type": "gpt2", "vocab_size": 10, "n_embd": 8, "n_layer": 1,
    "n_head": 2, "n_positions": 8)";
  const std::vector<Case> cases = {
      {"{\"model_type\": \"llama\",", "not valid JSON"},
      {"[1, 2]", "not valid JSON"},
      {"{\"model_type\": \"mistral\"}", "\"model_type\" is \"mistral\": Kiln builds"},
      {"{\"vocab_size\": 3}", "\"model_type\" is missing (model.name comes from it)"},
      {"{\"model_type\": \"llama\", \"vocab_size\": 10}",
       "\"hidden_size\" is missing (model.llama.hidden_size comes from it)"},
      {"{" + llama + ", \"num_hidden_layers\": 1.5}", "not valid JSON"},  // a key given twice
      {"{" + llama.substr(0, llama.find("\"num_hidden_layers\"")) +
           "\"num_hidden_layers\": 1.5, \"num_attention_heads\": 2, \"intermediate_size\": 16, "
           "\"max_position_embeddings\": 8, \"rms_norm_eps\": 1e-5}",
       "\"num_hidden_layers\" is 1.5, expected a whole number >= 1 (for model.llama.num_layers)"},
      {"{" + llama + ", \"attention_bias\": true}", "\"attention_bias\" is true: a bias on o_proj"},
      {"{" + llama + ", \"mlp_bias\": true}", "\"mlp_bias\" is true"},
      {"{" + llama + ", \"hidden_act\": \"gelu\"}", "\"hidden_act\" is \"gelu\""},
      {"{" + llama + ", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4}}",
       "\"rope_scaling.rope_type\" is \"yarn\""},
      {"{" + llama + ", \"rope_scaling\": {\"rope_type\": \"llama3\"}}",
       "\"rope_scaling.factor\" is missing"},
      {"{" + llama + ", \"tie_word_embeddings\": \"yes\"}",
       "\"tie_word_embeddings\" is \"yes\", expected true or false"},
      {"{\"model_type\": \"qwen2\"" + llama.substr(llama.find(',')) +
           ", \"use_sliding_window\": true}",
       "\"use_sliding_window\" is true"},
      {"{" + gpt + ", \"activation_function\": \"relu\"}", "\"activation_function\" is \"relu\""},
      {"{" + gpt + ", \"layer_norm_epsilon\": 1e-6}", "\"layer_norm_epsilon\" is 1e-06"},
      {"{" + gpt + ", \"tie_word_embeddings\": false}", "\"tie_word_embeddings\" is false"},
  };
  for (const Case& c : cases) {
    const std::string dir = folder_with("bad", c.json);
    const std::string message = error_of([&] { read_hf_config(dir, "model.from_hf_config"); });
    EXPECT_NE(message.find(dir + "/config.json (model.from_hf_config)"), std::string::npos)
        << c.json << "\n"
        << message;
    EXPECT_NE(message.find(c.expected), std::string::npos) << c.json << "\n" << message;
  }
  EXPECT_NE(error_of([] {
              read_hf_config("/nonexistent/kiln", "model.from_hf_config");
            }).find("model.from_hf_config \"/nonexistent/kiln\": no such file or directory"),
            std::string::npos);
  const fs::path empty = fs::temp_directory_path() / "kiln_test_hf_config_empty";
  fs::create_directories(empty);
  fs::remove(empty / "config.json");
  EXPECT_NE(error_of([&] {
              read_hf_config(empty.string(), "f");
            }).find("no config.json in the directory"),
            std::string::npos);
  EXPECT_NE(error_of([] { read_hf_config("/dev/zero", "f"); }).find("a character device"),
            std::string::npos);
}

TEST(HfConfig, WeightIndexNamesShardsInTheFolder) {
  const std::string dir = folder_with("index", "{}");
  const auto write = [&](const std::string& text) {
    std::ofstream(dir + "/model.safetensors.index.json") << text;
    return dir + "/model.safetensors.index.json";
  };
  const HfWeightIndex index = read_hf_weight_index(write(
      R"({"metadata": {"total_size": 96}, "weight_map": {"a.weight": "model-00001-of-00002.safetensors",
        "b.weight": "model-00002-of-00002.safetensors"}})"));
  EXPECT_EQ(index.total_size, 96u);
  EXPECT_EQ(index.weight_map.at("b.weight"), "model-00002-of-00002.safetensors");
  EXPECT_NE(error_of([&] {
              read_hf_weight_index(write(R"({"weight_map": {"a": "../x"}})"));
            }).find("\"weight_map.a\" is \"../x\": a shard is a file name"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              read_hf_weight_index(write(R"({"metadata": {}})"));
            }).find("\"weight_map\" is missing"),
            std::string::npos);
}

}  // namespace
}  // namespace kiln::config
