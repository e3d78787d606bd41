#pragma once
// model.init_from's weights: a safetensors file (names as Kiln saves them, which are PyTorch's),
// or a transformers model folder as save_pretrained writes it (docs/llama.md, "From and back to
// Hugging Face"): config.json, checked against the experiment's model before any weight is read,
// and model.safetensors or the shards model.safetensors.index.json maps the tensors to. Tensors of
// any floating-point dtype (F32, BF16, F16) load into the model's; a file's tensor the model has
// no parameter for (lm_head.weight of a tied model) is left unread.

#include <map>
#include <string>

#include "configs/kiln.pb.h"
#include "core/tensor.h"
#include "layers/layer.h"

namespace kiln::train {

// The tensors at `path` (a file or a folder) by name. For a folder, InputError naming each field
// where `model` (filled by fill_defaults) differs from config.json, both ways:
// "model.init_from DIR: num_kv_heads 2 in config.json (num_key_value_heads), 8 in the experiment
// (model.llama.num_kv_heads)"; and InputError naming the file for a shard that is missing, a
// tensor the index names that its shard lacks, or a tensor found in two shards.
std::map<std::string, Tensor> read_init_weights(const std::string& path,
                                                const config::ModelConfig& model);

// model.init_from of `model` into `net`'s parameters (each must be there with its shape) and the
// buffers found; nothing when init_from is "".
void load_init_from(const config::ModelConfig& model, Layer& net);

}  // namespace kiln::train
