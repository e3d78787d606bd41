#include "infer/hf_export.h"

#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <utility>

#include "core/check.h"
#include "core/json_writer.h"

namespace kiln::infer {
namespace {

namespace fs = std::filesystem;

std::string shard_name(std::size_t index, std::size_t count) {
  char name[64];
  std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return name;
}

// {"metadata": {"total_size": N}, "weight_map": {...}}, a key a line as transformers writes it.
std::string index_json(std::uint64_t total_size,
                       const std::map<std::string, std::string>& weight_map) {
  std::string out = "{\n  \"metadata\": {\n    \"total_size\": " + std::to_string(total_size) +
                    "\n  },\n  \"weight_map\": {\n";
  std::size_t i = 0;
  for (const auto& [tensor, file] : weight_map) {
    out += "    " + JsonWriter::quote(tensor) + ": " + JsonWriter::quote(file) +
           (++i < weight_map.size() ? ",\n" : "\n");
  }
  return out + "  }\n}\n";
}

// The folder's content under `tmp`.
HfFolderSummary write_content(const fs::path& tmp, const NamedTensors& tensors,
                              const HfFolderOptions& options) {
  HfFolderSummary summary;
  const std::vector<std::vector<std::size_t>> shards =
      plan_shards(tensors, options.max_shard_bytes);
  std::map<std::string, std::string> weight_map;
  // save_pretrained's metadata: transformers refuses a safetensors file without format "pt".
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  for (std::size_t s = 0; s < shards.size(); ++s) {
    const std::string file =
        shards.size() == 1 ? "model.safetensors" : shard_name(s, shards.size());
    NamedTensors part;
    for (std::size_t i : shards[s]) {
      part.push_back(tensors[i]);
      weight_map[tensors[i].first] = file;
      summary.tensor_bytes += tensors[i].second.nbytes();
    }
    save_safetensors((tmp / file).string(), part, metadata);
    summary.weight_files.push_back(file);
  }
  if (shards.size() > 1) {
    write_file_atomically((tmp / "model.safetensors.index.json").string(),
                          index_json(summary.tensor_bytes, weight_map));
  }
  write_file_atomically((tmp / "config.json").string(), options.config_json);
  return summary;
}

}  // namespace

std::vector<std::vector<std::size_t>> plan_shards(const NamedTensors& tensors,
                                                  std::uint64_t max_bytes) {
  std::vector<std::vector<std::size_t>> shards;
  std::uint64_t filled = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::uint64_t bytes = tensors[i].second.nbytes();
    if (shards.empty() || (!shards.back().empty() && filled + bytes > max_bytes)) {
      shards.emplace_back();
      filled = 0;
    }
    shards.back().push_back(i);
    filled += bytes;
  }
  return shards;
}

HfFolderSummary write_hf_folder(const std::string& dir_text, const NamedTensors& tensors,
                                const HfFolderOptions& options) {
  return write_new_folder(dir_text, "--hf", [&](const std::string& tmp) {
    return write_content(tmp, tensors, options);
  });
}

HfFolderSummary write_new_folder(const std::string& dir_text, const std::string& option,
                                 const std::function<HfFolderSummary(const std::string&)>& fill) {
  if (dir_text.empty()) throw InputError(option + ": an empty folder name");
  fs::path dir = fs::path(dir_text).lexically_normal();
  if (!dir.has_filename()) dir = dir.parent_path();  // "out/" names "out"
  std::error_code error;
  const fs::file_status status = fs::symlink_status(dir, error);
  const bool exists = fs::exists(status);
  if (exists && (!fs::is_directory(status) || !fs::is_empty(dir, error))) {
    throw InputError(option + " " + dir_text +
                     (fs::is_directory(status) ? ": the folder exists and is not empty"
                                               : ": exists and is not a folder") +
                     "; name a new folder (nothing is written over)");
  }
  const fs::path parent = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
  fs::create_directories(parent, error);
  if (error) {
    throw InputError(option + " " + dir_text + ": cannot create " + parent.string() + ": " +
                     error.message());
  }
  const fs::path tmp =
      parent / ("." + dir.filename().string() + ".tmp-" + std::to_string(::getpid()));
  fs::remove_all(tmp, error);  // a leftover of a killed export with this process id
  if (!fs::create_directory(tmp, error)) {
    throw InputError(option + " " + dir_text + ": cannot create " + tmp.string() + ": " +
                     error.message());
  }
  try {
    HfFolderSummary summary = fill(tmp.string());
    if (exists) fs::remove(dir, error);  // the empty folder the caller made for it
    fs::rename(tmp, dir, error);
    if (error) {
      throw Error("cannot rename " + tmp.string() + " to " + dir.string() + ": " + error.message());
    }
    return summary;
  } catch (...) {
    fs::remove_all(tmp, error);
    throw;
  }
}

std::uint64_t parse_byte_size(const std::string& text, const std::string& option) {
  static const std::pair<const char*, double> kUnits[] = {{"", 1},
                                                          {"b", 1},
                                                          {"kb", 1e3},
                                                          {"mb", 1e6},
                                                          {"gb", 1e9},
                                                          {"tb", 1e12},
                                                          {"kib", 1024.0},
                                                          {"mib", 1048576.0},
                                                          {"gib", 1073741824.0},
                                                          {"tib", 1099511627776.0}};
  std::size_t used = 0;
  double number = 0;
  try {
    number = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const auto& [name, scale] : kUnits) {
    if (used == 0 || unit != name) continue;
    const double bytes = std::floor(number * scale);
    if (bytes >= 1 && bytes < 1.8e19) return static_cast<std::uint64_t>(bytes);
  }
  throw InputError(option + " '" + text +
                   "': expected a size such as 5GB (10^9 bytes), 500MB, 2GiB (2^30) or 4096 "
                   "(bytes), at least one byte");
}

}  // namespace kiln::infer
