// fill_defaults: the defaults that depend on other fields, by hand, around one walk over the
// defaults the schema declares (configs/schema.cc). Each rule here is named in its field's
// `(kiln.default_rule)`, which is what the field reference in docs/configs.md shows.
#include <filesystem>

#include "configs/experiment.h"
#include "configs/hf_config.h"
#include "configs/schema.h"

namespace kiln::config {

bool is_gpt_model(const std::string& model_name) {
  return model_name.rfind("gpt2", 0) == 0;
}

bool is_llama_model(const std::string& model_name) {
  return model_name == "llama" || model_name == "qwen2" || model_name.rfind("qwen2_5_", 0) == 0 ||
         model_name.rfind("llama3_", 0) == 0;
}

bool is_causal_lm(const std::string& model_name) {
  return is_gpt_model(model_name) || is_llama_model(model_name);
}

namespace {

// The presets' shapes, from their config.json on the Hugging Face Hub.
struct LlamaPreset {
  const char* name;
  int vocab, hidden, layers, heads, kv_heads, intermediate, max_positions;
  double theta, eps;
  bool tied, qkv_bias;
  double llama3_factor;  // 0: no rope_scaling
};
constexpr LlamaPreset kLlamaPresets[] = {
    {"qwen2", 151936, 896, 24, 14, 2, 4864, 32768, 1e6, 1e-6, true, true, 0},
    {"qwen2_5_0_5b", 151936, 896, 24, 14, 2, 4864, 32768, 1e6, 1e-6, true, true, 0},
    {"qwen2_5_1_5b", 151936, 1536, 28, 12, 2, 8960, 32768, 1e6, 1e-6, true, true, 0},
    {"qwen2_5_3b", 151936, 2048, 36, 16, 2, 11008, 32768, 1e6, 1e-6, true, true, 0},
    {"qwen2_5_7b", 152064, 3584, 28, 28, 4, 18944, 32768, 1e6, 1e-6, false, true, 0},
    {"llama", 128256, 2048, 16, 32, 8, 8192, 131072, 5e5, 1e-5, true, false, 32},
    {"llama3_2_1b", 128256, 2048, 16, 32, 8, 8192, 131072, 5e5, 1e-5, true, false, 32},
    {"llama3_2_3b", 128256, 3072, 28, 24, 8, 8192, 131072, 5e5, 1e-5, true, false, 32},
    {"llama3_1_8b", 128256, 4096, 32, 32, 8, 14336, 131072, 5e5, 1e-5, false, false, 8},
};

// `preset` false: model.from_hf_config gave the shape, the name's preset adds nothing to it (not
// the rope_scaling config.json left out).
void fill_llama_shape(const std::string& name, bool preset, LlamaShape& shape) {
  fill_declared_defaults(shape);
  for (const LlamaPreset& p : kLlamaPresets) {
    if (!preset || name != p.name) continue;
    if (!shape.has_vocab_size()) shape.set_vocab_size(p.vocab);
    if (!shape.has_hidden_size()) shape.set_hidden_size(p.hidden);
    if (!shape.has_num_layers()) shape.set_num_layers(p.layers);
    if (!shape.has_num_heads()) shape.set_num_heads(p.heads);
    if (!shape.has_num_kv_heads()) shape.set_num_kv_heads(p.kv_heads);
    if (!shape.has_intermediate_size()) shape.set_intermediate_size(p.intermediate);
    if (!shape.has_max_positions()) shape.set_max_positions(p.max_positions);
    if (!shape.has_rope_theta()) shape.set_rope_theta(p.theta);
    if (!shape.has_rms_norm_eps()) shape.set_rms_norm_eps(p.eps);
    if (!shape.has_tie_embeddings()) shape.set_tie_embeddings(p.tied);
    if (!shape.has_qkv_bias()) shape.set_qkv_bias(p.qkv_bias);
    if (p.llama3_factor > 0 && !shape.rope_scaling().has_factor())
      shape.mutable_rope_scaling()->set_factor(p.llama3_factor);
  }
  // Unset and not a whole hidden_size / num_heads: left for validate() to name hidden_size.
  if (!shape.has_head_dim() && shape.num_heads() > 0 &&
      shape.hidden_size() % shape.num_heads() == 0)
    shape.set_head_dim(shape.hidden_size() / shape.num_heads());
  if (!shape.has_num_kv_heads()) shape.set_num_kv_heads(shape.num_heads());
}

}  // namespace

void fill_defaults(Experiment& experiment, const std::string& config_path) {
  if (!experiment.has_name()) {
    const std::string stem = std::filesystem::path(config_path).stem().string();
    experiment.set_name(stem.empty() ? "experiment" : stem);
  }

  // Rules that depend on a kind run first: the walker then fills whatever they left unset.
  DataConfig& data = *experiment.mutable_data();
  const bool fashion = data.kind() == DataConfig::FASHION_MNIST;
  const bool cifar = data.kind() == DataConfig::CIFAR10;
  if (fashion) apply_declared_default(data, "path");

  ModelConfig& model = *experiment.mutable_model();
  apply_hf_config(model);                 // a transformers config.json's name and shape
  apply_declared_default(model, "name");  // the rules below depend on it
  const bool preset = model.from_hf_config().empty();
  if (!model.has_num_classes() && (fashion || cifar)) model.set_num_classes(10);
  if (!model.has_image_size() && (fashion || cifar)) model.set_image_size(fashion ? 28 : 32);
  if (!model.has_image_channels() && fashion) model.set_image_channels(1);
  if (!model.has_dropout() && model.name() == "bert_base") model.set_dropout(0.1);
  if (model.name() == "mlp") apply_declared_default(model, "mlp_hidden");
  if (is_gpt_model(model.name())) {
    GptShape& gpt = *model.mutable_gpt();
    fill_declared_defaults(gpt);
    struct Size {
      const char* name;
      int layers, hidden, heads;
    };
    static constexpr Size kSizes[] = {{"gpt2", 12, 768, 12},
                                      {"gpt2_medium", 24, 1024, 16},
                                      {"gpt2_large", 36, 1280, 20},
                                      {"gpt2_xl", 48, 1600, 25}};
    for (const Size& size : kSizes) {
      if (!preset || model.name() != size.name) continue;
      if (!gpt.has_num_layers()) gpt.set_num_layers(size.layers);
      if (!gpt.has_hidden_size()) gpt.set_hidden_size(size.hidden);
      if (!gpt.has_num_heads()) gpt.set_num_heads(size.heads);
    }
    if (!gpt.has_intermediate_size()) gpt.set_intermediate_size(4 * gpt.hidden_size());
  }
  if (is_llama_model(model.name())) fill_llama_shape(model.name(), preset, *model.mutable_llama());
  if (is_llama_model(model.name()) && model.has_lora())
    fill_declared_defaults(*model.mutable_lora());
  if (model.name() == "bert_base") {
    BertShape& bert = *model.mutable_bert();
    fill_declared_defaults(bert);
    if (!bert.has_intermediate_size()) bert.set_intermediate_size(4 * bert.hidden_size());
  }

  OptimizerConfig& optimizer = *experiment.mutable_optimizer();
  if (optimizer.kind() == OptimizerConfig::SGD) {
    if (!optimizer.has_lr()) optimizer.set_lr(0.1);
    if (!optimizer.has_weight_decay()) optimizer.set_weight_decay(0.0);
  }
  if (!optimizer.has_eps() && optimizer.kind() == OptimizerConfig::LAMB) optimizer.set_eps(1e-6);

  PrecisionConfig& precision = *experiment.mutable_precision();
  // Experiments that do not mention FP8 stay as they were recorded.
  if (precision.has_fp8()) fill_declared_defaults(*precision.mutable_fp8());
  LossScaleConfig& loss_scale = *precision.mutable_loss_scale();
  if (!loss_scale.has_dynamic() && precision.half() == PrecisionConfig::BF16) {
    loss_scale.set_dynamic(false);
  }

  // The deprecated allreduce_in_half migrates to compression HALF (validate() refuses it beside
  // another compression).
  ParallelConfig& parallel = *experiment.mutable_parallel();
  if (!parallel.has_compression()) {
    if (parallel.allreduce_in_half()) {
      parallel.set_compression(ParallelConfig::HALF);
    } else {
      apply_declared_default(parallel, "compression");
    }
  }

  TrainConfig& train = *experiment.mutable_train();
  // Whole gradient buffers would undo what moving the weights off the device saves.
  if (!parallel.has_zero_accumulate_in_shards() &&
      train.offload() == TrainConfig::OPTIMIZER_AND_WEIGHTS) {
    parallel.set_zero_accumulate_in_shards(true);
  }
  if (train.duration_case() == TrainConfig::DURATION_NOT_SET) {
    apply_declared_default(train, data.kind() == DataConfig::SYNTHETIC ? "steps" : "epochs");
  }
  // With global_batch set, accumulation is derived from the world size (plan_batches).
  if (!train.has_global_batch()) apply_declared_default(train, "accumulation_steps");

  fill_declared_defaults(experiment);

  // Rules that copy another field's (now filled) value.
  // llm.c names validation shards like the training ones, "val" for "train" (fineweb.py):
  // the last "train", so that a directory named train higher up the path stays as it is.
  const std::size_t train_at = data.path().rfind("train");
  if (data.kind() == DataConfig::LLMC_SHARDS && !data.has_eval_path() &&
      train_at != std::string::npos) {
    data.set_eval_path(std::string(data.path()).replace(train_at, 5, "val"));
  }
  for (ParamGroup& group : *optimizer.mutable_param_groups()) {
    if (!group.has_weight_decay()) group.set_weight_decay(optimizer.weight_decay());
  }
  LoggingConfig& logging = *experiment.mutable_logging();
  if (!logging.has_dir()) logging.set_dir("runs/" + experiment.name());
  CheckpointConfig& checkpoint = *experiment.mutable_checkpoint();
  if (!checkpoint.has_dir()) checkpoint.set_dir(logging.dir() + "/checkpoints");
}

void fill_device_defaults(Experiment& experiment, bool cuda_available) {
  TrainConfig& train = *experiment.mutable_train();
  if (train.has_cuda_graphs()) return;
  const bool cuda = train.device() == TrainConfig::CUDA ||
                    (train.device() == TrainConfig::AUTO && cuda_available);
  train.set_cuda_graphs(cuda);
}

}  // namespace kiln::config
