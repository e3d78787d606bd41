#pragma once
// Reading and writing the safetensors format (an 8-byte little-endian header length, a JSON
// header naming each tensor's dtype, shape and byte range, then the raw data), so weights move
// between Kiln and PyTorch (safetensors.torch.load_file / save_file) unchanged.

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace kiln {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// Writes `tensors` (any device; copied to the host) to `path` through a temporary file renamed
// into place, so `path` is either the old file or the complete new one. Throws Error on I/O
// failure (a full disk names the file and what was being written).
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;  // CPU tensors
  std::map<std::string, std::string> metadata;
};

// Throws InputError naming the file and what is wrong (truncated, bad header, offsets outside the
// file, unknown dtype, shape and byte count disagreeing).
SafetensorsFile load_safetensors(const std::string& path);

// Writes `bytes` to `path` atomically (temporary file, fsync, rename). Shared with checkpoints.
// A target that exists and is not a regular file (/dev/null, a FIFO, a directory), or an empty
// path, is refused with InputError before anything is written (require_replaceable_file).
void write_file_atomically(const std::string& path, const std::string& bytes);
std::string read_file(const std::string& path);  // InputError if missing or unreadable

}  // namespace kiln
