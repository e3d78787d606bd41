#include "train/model_options.h"

#include <string>

#include "configs/experiment.h"
#include "core/check.h"

namespace kiln::train {

config::Experiment default_model_experiment(const std::string& name,
                                            const std::vector<std::string>& overrides) {
  // The experiment defaults of the model on the data it is made for: Fashion-MNIST for mlp and
  // fashion_cnn, synthetic (ImageNet-shaped, or BERT-base) data for the rest. So `kiln model`
  // describes what `kiln train` builds, from the schema's one declaration of each default.
  config::Experiment e;
  e.mutable_model()->set_name(name);
  const bool small = name == "mlp" || name == "fashion_cnn";
  e.mutable_data()->set_kind(small ? config::DataConfig::FASHION_MNIST
                                   : config::DataConfig::SYNTHETIC);
  for (const std::string& o : overrides) config::apply_override(e, o);
  config::fill_defaults(e);
  return e;
}

ModelOptions default_model_options(const std::string& name,
                                   const std::vector<std::string>& overrides) {
  return model_options_from(default_model_experiment(name, overrides));
}

namespace {

// BertShape, GptShape and LlamaShape share these fields' names and meanings.
template <typename Shape>
void take_transformer_shape(const Shape& s, ModelOptions& o) {
  o.vocab_size = s.vocab_size();
  o.seq_len = s.seq_len();
  o.hidden_size = s.hidden_size();
  o.num_layers = s.num_layers();
  o.num_heads = s.num_heads();
  o.intermediate_size = s.intermediate_size();
}

}  // namespace

ModelOptions model_options_from(const config::Experiment& experiment) {
  config::Experiment e = experiment;
  config::fill_defaults(e);  // idempotent: an experiment from load_experiment is already filled
  const config::ModelConfig& m = e.model();
  ModelOptions o;
  o.name = m.name();
  o.num_classes = m.num_classes();
  o.image_size = m.image_size();
  o.image_channels = m.image_channels();
  o.dropout = m.dropout();
  o.cifar_stem = m.cifar_stem();
  o.fuse_conv_batch_norm = m.fuse_conv_batch_norm();
  o.mlp_hidden.assign(m.mlp_hidden().begin(), m.mlp_hidden().end());
  o.recompute_blocks = e.train().recompute() == config::TrainConfig::BLOCKS;
  o.keep_mlp_activation = e.train().recompute() == config::TrainConfig::KEEP_ALL;
  if (m.has_bert()) take_transformer_shape(m.bert(), o);
  if (config::is_gpt_model(m.name())) {
    take_transformer_shape(m.gpt(), o);
    o.max_positions = m.gpt().max_positions();
  }
  if (config::is_llama_model(m.name())) {
    const config::LlamaShape& l = m.llama();
    take_transformer_shape(l, o);
    o.max_positions = l.max_positions();
    o.llama.num_kv_heads = l.num_kv_heads();
    o.llama.head_dim = l.head_dim();
    o.llama.rope_theta = l.rope_theta();
    o.llama.rms_norm_eps = l.rms_norm_eps();
    o.llama.tie_embeddings = l.tie_embeddings();
    o.llama.qkv_bias = l.qkv_bias();
    if (l.rope_scaling().has_factor()) {
      o.llama.rope_llama3_factor = l.rope_scaling().factor();
      o.llama.rope_low_freq_factor = l.rope_scaling().low_freq_factor();
      o.llama.rope_high_freq_factor = l.rope_scaling().high_freq_factor();
      o.llama.rope_original_max_positions = l.rope_scaling().original_max_positions();
    }
  }
  const config::Fp8Config& fp8 = e.precision().fp8();
  if (fp8.enabled()) {
    o.fp8.enabled = true;
    o.fp8.scaling.recipe =
        fp8.recipe() == config::Fp8Config::CURRENT ? Fp8Recipe::Current : Fp8Recipe::Delayed;
    o.fp8.scaling.history = fp8.amax_history();
    o.fp8.scaling.margin = static_cast<float>(fp8.margin());
    o.fp8.gradient_format =
        fp8.gradient_format() == config::Fp8Config::E4M3 ? Fp8Format::E4M3 : Fp8Format::E5M2;
  }
  const config::LoraConfig& lora = m.lora();
  if (lora.rank() > 0) {
    if (!config::is_llama_model(m.name())) {
      throw InputError("model.lora.rank " + std::to_string(lora.rank()) +
                       ": LoRA adapters are "
                       "built for the llama family (llama, qwen2, qwen2_5_*, llama3_*), not " +
                       m.name());
    }
    if (lora.targets().empty()) {
      throw InputError(
          "model.lora.targets is empty: name the projections to adapt (q_proj, "
          "k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)");
    }
    o.lora.rank = lora.rank();
    o.lora.alpha = lora.alpha();
    o.lora.dropout = lora.dropout();
    o.lora.targets.assign(lora.targets().begin(), lora.targets().end());
  }
  return o;
}

}  // namespace kiln::train
