#include "infer/lora_export.h"

#include <cmath>
#include <filesystem>
#include <map>
#include <utility>

#include "core/check.h"
#include "core/json_writer.h"
#include "core/ops.h"

namespace kiln::infer {
namespace {

const std::string kA = ".lora_A.weight", kB = ".lora_B.weight";

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

NamedTensors merge_lora_adapters(const NamedTensors& tensors, double scale) {
  std::map<std::string, std::pair<const Tensor*, const Tensor*>> adapters;  // X -> (A, B)
  for (const auto& [name, value] : tensors) {
    if (ends_with(name, kA)) adapters[name.substr(0, name.size() - kA.size())].first = &value;
    if (ends_with(name, kB)) adapters[name.substr(0, name.size() - kB.size())].second = &value;
  }
  NamedTensors out;
  for (const auto& [name, value] : tensors) {
    if (is_lora_parameter(name)) continue;
    const std::string module = ends_with(name, ".weight") ? name.substr(0, name.size() - 7) : "";
    auto it = adapters.find(module);
    if (it == adapters.end()) {
      out.emplace_back(name, value);
      continue;
    }
    const auto [a, b] = it->second;
    if (a == nullptr || b == nullptr) {
      throw InputError("LoRA adapter " + module + " has " + (a ? "lora_A" : "lora_B") +
                       " but not " + (a ? "lora_B" : "lora_A"));
    }
    if (value.dim() != 2 || a->dim() != 2 || b->dim() != 2 || a->size(0) != b->size(1) ||
        a->size(1) != value.size(1) || b->size(0) != value.size(0)) {
      throw InputError("LoRA adapter " + module + ": lora_A " + a->str() + " and lora_B " +
                       b->str() + " do not fit the weight " + value.str());
    }
    Tensor w = value.to(Device::cpu(), DType::F64).clone();  // never the caller's tensor
    const Tensor a64 = a->to(Device::cpu(), DType::F64).contiguous();
    const Tensor b64 = b->to(Device::cpu(), DType::F64).contiguous();
    ops::gemm(false, false, scale, b64, a64, 1.0, w);  // W + scale B A
    out.emplace_back(name, w.to(value.dtype()));
    adapters.erase(it);
  }
  if (!adapters.empty()) {  // what is left found no weight to merge into
    const std::string& module = adapters.begin()->first;
    throw InputError("LoRA adapter " + module + ": no weight " + module + ".weight");
  }
  return out;
}

NamedTensors peft_adapter_tensors(const NamedTensors& tensors) {
  NamedTensors out;
  for (const auto& [name, value] : tensors)
    if (is_lora_parameter(name)) out.emplace_back("base_model.model." + name, value);
  return out;
}

std::string peft_adapter_config_json(const LoraOptions& o) {
  JsonWriter j;
  j.begin_object();
  j.key("base_model_name_or_path");
  j.value(std::string());
  j.field("bias", "none");
  j.field("fan_in_fan_out", false);
  j.field("inference_mode", true);
  j.field("init_lora_weights", true);
  j.key("lora_alpha");
  // PEFT declares lora_alpha an int; a whole alpha is written as one.
  if (o.alpha == std::floor(o.alpha) && std::fabs(o.alpha) < 1e15) {
    j.value(static_cast<long long>(o.alpha));
  } else {
    j.value(o.alpha);
  }
  j.field("lora_dropout", o.dropout);
  j.field("peft_type", "LORA");
  j.field("r", o.rank);
  j.key("target_modules");
  j.begin_array();
  for (const std::string& t : o.targets) j.value(t);
  j.end_array();
  j.field("task_type", "CAUSAL_LM");
  j.field("use_dora", false);
  j.field("use_rslora", false);
  j.end_object();
  return j.str() + "\n";
}

HfFolderSummary write_peft_adapter_folder(const std::string& dir, const NamedTensors& adapters,
                                          const LoraOptions& options) {
  if (adapters.empty()) throw InputError("--lora-only: the model has no LoRA adapters");
  return write_new_folder(dir, "--hf", [&](const std::string& tmp) {
    HfFolderSummary summary;
    const std::map<std::string, std::string> metadata = {{"format", "pt"}};
    const std::filesystem::path folder(tmp);
    save_safetensors((folder / "adapter_model.safetensors").string(), adapters, metadata);
    write_file_atomically((folder / "adapter_config.json").string(),
                          peft_adapter_config_json(options));
    summary.weight_files.push_back("adapter_model.safetensors");
    for (const auto& [name, value] : adapters) summary.tensor_bytes += value.nbytes();
    return summary;
  });
}

}  // namespace kiln::infer
