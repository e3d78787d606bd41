#pragma once
// LoRA adapters out of Kiln (docs/finetune.md): merged into the weights they adapt, for a plain
// transformers folder (kiln export --hf), or alone as a PEFT adapter folder (--lora-only:
// adapter_config.json and adapter_model.safetensors, names under base_model.model., as PEFT's
// save_pretrained writes them and PeftModel.from_pretrained reads them).

#include <string>

#include "core/safetensors.h"
#include "infer/hf_export.h"
#include "layers/lora.h"

namespace kiln::infer {

// Every pair X.lora_A.weight (r, in), X.lora_B.weight (out, r) folded into X.weight (out, in) as
// W + scale * B A (formed in f64, stored in W's dtype) and left out; the other tensors as they
// are, in their order. InputError when an adapter has no weight or shapes disagree.
NamedTensors merge_lora_adapters(const NamedTensors& tensors, double scale);

// The adapter tensors alone, renamed base_model.model.X.lora_A.weight as PEFT names them.
NamedTensors peft_adapter_tensors(const NamedTensors& tensors);

// adapter_config.json for `options` (PEFT's LoraConfig, task CAUSAL_LM).
std::string peft_adapter_config_json(const LoraOptions& options);

// The PEFT adapter folder `dir` (new, written as write_hf_folder writes its folders).
HfFolderSummary write_peft_adapter_folder(const std::string& dir, const NamedTensors& adapters,
                                          const LoraOptions& options);

}  // namespace kiln::infer
