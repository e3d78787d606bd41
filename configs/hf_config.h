// A transformers model folder's config.json in the experiment's terms (docs/llama.md, "From and
// back to Hugging Face"): read for model.from_hf_config (the shape) and model.init_from (checked
// against the experiment's model before any weight is read), written by `kiln export --hf`.
// One table of keys for the three: LlamaConfig and Qwen2Config (model.llama), GPT2Config
// (model.gpt). JSON is read by protobuf's parser into a google.protobuf.Struct: configs/ depends
// on protobuf only.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "configs/kiln.pb.h"

namespace kiln::config {

struct HfConfig {
  std::string file;        // the config.json read
  std::string model_type;  // "llama", "qwen2" or "gpt2"
  // model.name (= model_type) and model.llama or model.gpt with every shape field set: from its
  // key, or transformers' default where config.json leaves a key out (num_key_value_heads,
  // head_dim, rope_theta, tie_word_embeddings, n_inner). seq_len is not a key: it is left unset.
  ModelConfig model;
};

// `path`: a transformers model folder or its config.json. `field` names the setting that gave it,
// in messages ("model.from_hf_config"). Throws ConfigError naming the file and the key: no such
// file, bad JSON, a key missing or of the wrong type, and an architecture Kiln cannot build (a
// model_type other than llama, qwen2 and gpt2, a bias on Llama's o_proj or MLP, a rope_type other
// than llama3, Qwen2's sliding window, GPT-2's activation or epsilon other than Kiln's, ...).
HfConfig read_hf_config(const std::string& path, const std::string& field);

// fill_defaults' rule for model.from_hf_config: model.name (when unset) and every shape field
// left unset come from config.json; what the experiment or --set gives is kept. A model.name of
// another family than model_type (gpt2* for gpt2; the llama family for llama and qwen2) is an
// error. Does nothing when from_hf_config is "".
void apply_hf_config(ModelConfig& model);

// Where the experiment's (filled) model differs from config.json's in what it computes, one line
// per field: "num_kv_heads 2 in config.json (num_key_value_heads), 8 in the experiment
// (model.llama.num_kv_heads)". Empty when they agree. The llama family's max_position_embeddings
// is left out: it sizes the rotary tables and changes no weight or output.
std::vector<std::string> hf_config_mismatches(const HfConfig& hf, const ModelConfig& model);

// config.json for the experiment's (filled) model: architectures (LlamaForCausalLM, or
// Qwen2ForCausalLM where the model has q/k/v biases; GPT2LMHeadModel), model_type, every shape
// key and `torch_dtype` ("float32", "bfloat16", "float16"). ConfigError for a model transformers
// has no such class for.
std::string hf_config_json(const ModelConfig& model, const std::string& torch_dtype);

// model.safetensors.index.json: {"metadata": {"total_size": N}, "weight_map": {tensor: file}}.
struct HfWeightIndex {
  std::uint64_t total_size = 0;
  std::map<std::string, std::string> weight_map;
};
// ConfigError naming the file: bad JSON, no weight_map, a file name that is not a plain name in
// the folder ("../x", "a/b").
HfWeightIndex read_hf_weight_index(const std::string& file);

}  // namespace kiln::config
