#include "train/init_from.h"

#include <filesystem>
#include <set>
#include <utility>
#include <vector>

#include "configs/hf_config.h"
#include "core/check.h"
#include "core/safetensors.h"
#include "layers/lora.h"
#include "train/parameter_loader.h"

namespace kiln::train {
namespace {

namespace fs = std::filesystem;

// Every tensor of the shards `index_file` maps names to, each from the shard the index names.
std::map<std::string, Tensor> read_shards(const fs::path& dir, const std::string& index_file) {
  const config::HfWeightIndex index = config::read_hf_weight_index(index_file);
  std::map<std::string, std::vector<std::string>> by_shard;  // shard -> the tensors it holds
  for (const auto& [tensor, shard] : index.weight_map) by_shard[shard].push_back(tensor);
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> found_in;  // tensor -> shard, to name both of a duplicate
  for (const auto& [shard, names] : by_shard) {
    const std::string path = (dir / shard).string();
    std::error_code error;
    if (!fs::is_regular_file(path, error)) {
      throw InputError(index_file + " maps " + std::to_string(names.size()) +
                       " tensor(s) (the first '" + names.front() + "') to " + shard +
                       ", which is not a file in " + dir.string() +
                       " (an incomplete download or copy?)");
    }
    SafetensorsFile file = load_safetensors(path);
    for (const std::string& name : names) {
      if (file.tensors.count(name) == 0) {
        throw InputError(path + ": no tensor '" + name + "', which " + index_file +
                         " says this shard holds");
      }
    }
    for (auto& [name, tensor] : file.tensors) {
      const auto [it, fresh] = found_in.emplace(name, shard);
      if (!fresh) {
        throw InputError(dir.string() + ": tensor '" + name + "' is in two shards, " + it->second +
                         " and " + shard + "; which one holds the weights is ambiguous");
      }
      tensors.emplace(name, std::move(tensor));
    }
  }
  return tensors;
}

}  // namespace

std::map<std::string, Tensor> read_init_weights(const std::string& path,
                                                const config::ModelConfig& model) {
  std::error_code error;
  if (!fs::is_directory(path, error)) return load_safetensors(path).tensors;
  const config::HfConfig hf = config::read_hf_config(path, "model.init_from");
  const std::vector<std::string> mismatches = config::hf_config_mismatches(hf, model);
  if (!mismatches.empty()) {
    std::string lines;
    for (const std::string& m : mismatches) lines += (lines.empty() ? "" : "; ") + m;
    const bool hinted = model.from_hf_config().empty();
    throw InputError("model.init_from " + path + ": " + lines +
                     (hinted ? " (set model.from_hf_config=" + path +
                                   " to take the folder's shape for the fields not given)"
                             : ""));
  }
  const fs::path dir(path);
  const std::string single = (dir / "model.safetensors").string();
  // transformers' order: one file where there is one, else the index.
  if (fs::is_regular_file(single, error)) return load_safetensors(single).tensors;
  const std::string index = (dir / "model.safetensors.index.json").string();
  if (!fs::is_regular_file(index, error)) {
    throw InputError("model.init_from " + path +
                     ": no model.safetensors and no model.safetensors.index.json in the folder "
                     "(Kiln reads transformers' safetensors weights, not pytorch_model.bin)");
  }
  return read_shards(dir, index);
}

void load_init_from(const config::ModelConfig& model, Layer& net) {
  const std::string& path = model.init_from();
  if (path.empty()) return;
  const std::map<std::string, Tensor> tensors = read_init_weights(path, model);
  // A transformers folder has no LoRA adapters: those it lacks keep their initialisation.
  std::vector<Parameter*> parameters;
  for (Parameter* p : net.parameters())
    if (!is_lora_parameter(p->name) || tensors.count(p->name)) parameters.push_back(p);
  load_named_tensors({path, &tensors, " (model.init_from, for model " + model.name() + ")"},
                     parameters, net.buffers(), false);
}

}  // namespace kiln::train
