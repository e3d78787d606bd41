// fill_defaults: the defaults that depend on other fields, by hand, around one walk over the
// defaults the schema declares (configs/schema.cc). Each rule here is named in its field's
// `(kiln.default_rule)`, which is what the field reference in docs/configs.md shows.
#include <filesystem>

#include "configs/experiment.h"
#include "configs/schema.h"

namespace kiln::config {

bool is_gpt_model(const std::string& model_name) {
  return model_name.rfind("gpt2", 0) == 0;
}

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
  apply_declared_default(model, "name");  // the rules below depend on it
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
      if (model.name() != size.name) continue;
      if (!gpt.has_num_layers()) gpt.set_num_layers(size.layers);
      if (!gpt.has_hidden_size()) gpt.set_hidden_size(size.hidden);
      if (!gpt.has_num_heads()) gpt.set_num_heads(size.heads);
    }
    if (!gpt.has_intermediate_size()) gpt.set_intermediate_size(4 * gpt.hidden_size());
  }
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
