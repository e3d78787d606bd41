#pragma once
// kiln export --hf: a transformers model folder (docs/llama.md, "From and back to Hugging Face"):
// config.json beside the weights as safetensors, one model.safetensors or, past the shard size,
// model-00001-of-0000N.safetensors ... with model.safetensors.index.json ({"metadata":
// {"total_size": bytes}, "weight_map": {tensor: file}}), as save_pretrained writes them. The
// folder is built under a temporary name beside it and renamed when complete.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/safetensors.h"

namespace kiln::infer {

struct HfFolderOptions {
  std::string config_json;  // config.json's text (configs/hf_config.h)
  // A shard's tensor bytes at most (--max-shard-size; transformers' default 5 GB); a tensor
  // larger than that gets a shard of its own.
  std::uint64_t max_shard_bytes = 5'000'000'000ull;
};

struct HfFolderSummary {
  std::vector<std::string> weight_files;  // model.safetensors, or the shards in order
  std::uint64_t tensor_bytes = 0;         // the index's total_size
};

// The tensors (their indices) of each shard, in order: a shard closes when the next tensor would
// take it past `max_bytes`, as huggingface_hub's split_torch_state_dict_into_shards does; a larger
// tensor is a shard of its own at its place in the order.
std::vector<std::vector<std::size_t>> plan_shards(const NamedTensors& tensors,
                                                  std::uint64_t max_bytes);

// Writes `tensors` (transformers' names and layouts, in the dtype to store) and config.json into
// the new folder `dir`. InputError, before anything is written, when `dir` exists and is not an
// empty directory; on any failure the temporary folder is removed and `dir` left as it was.
HfFolderSummary write_hf_folder(const std::string& dir, const NamedTensors& tensors,
                                const HfFolderOptions& options);

// The new folder `dir` as `fill` writes it into the temporary folder it is given, renamed to `dir`
// when fill returns; the checks and messages of write_hf_folder, naming `option` (--hf).
HfFolderSummary write_new_folder(const std::string& dir, const std::string& option,
                                 const std::function<HfFolderSummary(const std::string&)>& fill);

// "5GB" (10^9 bytes), "500MB", "10kB", "2GiB" (2^30), "4096" (bytes); InputError naming `option`
// for anything else, or zero.
std::uint64_t parse_byte_size(const std::string& text, const std::string& option);

}  // namespace kiln::infer
