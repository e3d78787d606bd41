#include "train/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sstream>

#include <google/protobuf/text_format.h>

namespace kiln::train {
namespace {

const char* kManifest = "MANIFEST";
const char* kCompressionFile = "compression.safetensors";  // optional

std::uint32_t crc_of(const std::string& bytes) {
  return static_cast<std::uint32_t>(
      crc32(0L, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size())));
}

std::string hex(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%08x", v);
  return buf;
}

bool is_dir(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

void make_dir(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
    throw Error("cannot create directory " + path + ": " + std::strerror(errno) +
                " (check checkpoint.dir)");
  }
}

void make_dirs(const std::string& path) {
  std::string partial;
  std::stringstream ss(path);
  std::string part;
  if (!path.empty() && path[0] == '/') partial = "/";
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    partial += part + "/";
    make_dir(partial);
  }
}

// Removes what is at `path` without ever following a symbolic link: a link (to an archived
// checkpoint, or a folder linked into one) is unlinked, never emptied. Works on descriptors
// (openat with O_NOFOLLOW) so a link planted while deleting is not followed either.
void remove_entry(int parent, const char* name) {
  if (::unlinkat(parent, name, 0) == 0 || (errno != EISDIR && errno != EPERM)) return;
  const int fd = ::openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return;
  DIR* d = ::fdopendir(fd);
  if (d == nullptr) {
    ::close(fd);
    return;
  }
  std::vector<std::string> children;
  while (dirent* e = ::readdir(d)) {
    const std::string child = e->d_name;
    if (child != "." && child != "..") children.push_back(child);
  }
  for (const std::string& child : children) remove_entry(::dirfd(d), child.c_str());
  ::closedir(d);
  ::unlinkat(parent, name, AT_REMOVEDIR);
}

void remove_tree(const std::string& path) {
  remove_entry(AT_FDCWD, path.c_str());
}

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) out.push_back(e->d_name);
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

void sync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace

std::string checkpoint_name(std::int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%06lld", static_cast<long long>(step));
  return buf;
}

CheckpointStore::CheckpointStore(std::string dir, int keep_last)
    : dir_(std::move(dir)), keep_last_(std::max(keep_last, 1)) {}

std::string optimizer_shard_name(int rank, int world_size) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "optimizer-rank-%05d-of-%05d.safetensors", rank, world_size);
  return buf;
}

std::string CheckpointStore::staging_dir(std::int64_t step) const {
  return dir_ + "/.tmp-" + checkpoint_name(step) + "-shards";
}

void CheckpointStore::prepare_staging(std::int64_t step) const {
  make_dirs(dir_);
  remove_tree(staging_dir(step));
  make_dir(staging_dir(step));
}

std::string CheckpointStore::save(const NamedTensors& model, const NamedTensors& optimizer,
                                  const config::CheckpointState& state,
                                  const NamedTensors& compression) {
  make_dirs(dir_);
  std::string tmp =
      dir_ + "/.tmp-" + checkpoint_name(state.step()) + "-" + std::to_string(::getpid());
  remove_tree(tmp);
  make_dir(tmp);
  return complete(tmp, model, &optimizer, {"optimizer.safetensors"}, state, compression);
}

std::string CheckpointStore::save_sharded(const NamedTensors& model,
                                          const std::vector<std::string>& shard_files,
                                          const config::CheckpointState& state,
                                          const NamedTensors& compression) {
  return complete(staging_dir(state.step()), model, nullptr, shard_files, state, compression);
}

std::string CheckpointStore::complete(const std::string& tmp, const NamedTensors& model,
                                      const NamedTensors* optimizer, std::vector<std::string> files,
                                      const config::CheckpointState& state,
                                      const NamedTensors& compression) {
  std::string final_path = dir_ + "/" + checkpoint_name(state.step());
  try {
    save_safetensors(tmp + "/model.safetensors", model, {{"format", "pt"}});
    if (optimizer != nullptr) {
      save_safetensors(tmp + "/optimizer.safetensors", *optimizer, {{"format", "kiln"}});
    }
    std::string text;
    google::protobuf::TextFormat::PrintToString(state, &text);
    write_file_atomically(tmp + "/state.pbtxt", text);
    files.insert(files.begin(), "model.safetensors");
    files.push_back("state.pbtxt");
    if (!compression.empty()) {
      save_safetensors(tmp + "/" + kCompressionFile, compression, {{"format", "kiln"}});
      files.push_back(kCompressionFile);
    }
    std::string manifest;
    for (const std::string& file : files) {
      std::string bytes = read_file(tmp + "/" + file);
      manifest += hex(crc_of(bytes)) + " " + std::to_string(bytes.size()) + " " + file + "\n";
    }
    manifest += hex(crc_of(manifest)) + " manifest\n";
    write_file_atomically(tmp + "/" + kManifest, manifest);
    sync_dir(tmp);
    remove_tree(final_path);  // a re-save of the same step
    if (::rename(tmp.c_str(), final_path.c_str()) != 0) {
      throw Error("cannot rename " + tmp + " to " + final_path + ": " + std::strerror(errno));
    }
    sync_dir(dir_);
  } catch (...) {
    remove_tree(tmp);
    throw;
  }
  prune();
  return final_path;
}

std::optional<std::int64_t> checkpoint_step(const std::string& name) {
  const std::string prefix = "step-";
  if (name.rfind(prefix, 0) != 0 || name.size() == prefix.size() ||
      name.size() > prefix.size() + 18)
    return std::nullopt;
  std::int64_t step = 0;
  for (std::size_t i = prefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

std::vector<std::string> CheckpointStore::list() const {
  std::vector<std::pair<std::int64_t, std::string>> found;
  for (const std::string& e : entries(dir_)) {
    const auto step = checkpoint_step(e);
    if (!step) continue;
    std::string path = dir_ + "/" + e;
    struct stat st {};
    if (::stat((path + "/" + kManifest).c_str(), &st) == 0) found.emplace_back(*step, path);
  }
  // By step number: names sort as strings only up to step-999999 (%06lld widens past it).
  std::stable_sort(found.begin(), found.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

std::vector<std::string> CheckpointStore::unmanifested() const {
  std::vector<std::pair<std::int64_t, std::string>> found;
  for (const std::string& e : entries(dir_)) {
    const auto step = checkpoint_step(e);
    if (!step) continue;
    const std::string path = dir_ + "/" + e;
    struct stat st {};
    if (is_dir(path) && ::stat((path + "/" + kManifest).c_str(), &st) != 0) {
      found.emplace_back(*step, path);
    }
  }
  std::stable_sort(found.begin(), found.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

std::optional<std::string> CheckpointStore::latest() const {
  auto all = list();
  if (all.empty()) return std::nullopt;
  return all.back();
}

std::string CheckpointStore::skipped_list(const std::vector<std::string>& skipped) {
  std::string names;
  for (const std::string& p : skipped) names += (names.empty() ? "" : ", ") + p;
  return names +
         " (no MANIFEST: an incomplete copy, or a checkpoint whose manifest was removed; Kiln "
         "never "
         "loads such a directory, nor prunes it)";
}

std::string CheckpointStore::skipped_note(const std::string& option, const std::string& dir,
                                          const std::vector<std::string>& skipped) {
  return "warning: " + option + " latest skips " + std::to_string(skipped.size()) +
         " checkpoint director" + (skipped.size() == 1 ? "y" : "ies") + " in " + dir + ": " +
         skipped_list(skipped);
}

std::optional<std::string> CheckpointStore::latest_for_reading(const std::string& option,
                                                               std::string* note) const {
  std::optional<std::string> newest = latest();
  const std::vector<std::string> skipped = unmanifested();
  if (!skipped.empty()) {
    *note = skipped_note(option, dir_, skipped) + (newest ? "; reading " + *newest : "");
  }
  return newest;
}

void CheckpointStore::remove_partial() const {
  for (const std::string& e : entries(dir_)) {
    if (e.rfind(".tmp-", 0) == 0) remove_tree(dir_ + "/" + e);
  }
}

void CheckpointStore::prune() const {
  auto all = list();
  for (std::size_t i = 0; i + keep_last_ < all.size(); ++i) remove_tree(all[i]);
}

Checkpoint CheckpointStore::load(const std::string& path) {
  if (!is_dir(path))
    throw InputError("checkpoint " + path + " does not exist or is not a directory");
  std::string manifest_path = path + "/" + kManifest;
  struct stat st {};
  if (::stat(manifest_path.c_str(), &st) != 0) {
    throw InputError("checkpoint " + path + " is incomplete: no " + kManifest +
                     " (it was interrupted while being written)");
  }
  std::string manifest = read_file(manifest_path);
  std::size_t last = manifest.rfind(" manifest\n");
  std::size_t line_start = manifest.rfind('\n', last == std::string::npos ? 0 : last);
  line_start = line_start == std::string::npos || last == std::string::npos ? 0 : line_start + 1;
  if (last == std::string::npos || last != line_start + 8 ||
      manifest.substr(line_start, 8) != hex(crc_of(manifest.substr(0, line_start)))) {
    throw InputError(manifest_path + ": corrupt manifest (checksum mismatch)");
  }
  std::istringstream lines(manifest.substr(0, line_start));
  std::string crc, size, file;
  std::vector<std::string> listed;
  bool has_compression = false;
  while (lines >> crc >> size >> file) {
    if (file.find('/') != std::string::npos) {
      throw InputError(manifest_path + ": lists '" + file + "', not a file of the checkpoint");
    }
    std::string file_path = path + "/" + file;
    if (::stat(file_path.c_str(), &st) != 0)
      throw InputError(file_path + ": missing from checkpoint");
    std::string bytes = read_file(file_path);
    if (std::to_string(bytes.size()) != size) {
      throw InputError(file_path + ": size " + std::to_string(bytes.size()) +
                       " bytes, manifest says " + size + " (truncated or modified)");
    }
    if (hex(crc_of(bytes)) != crc) {
      throw InputError(file_path + ": checksum mismatch (CRC-32 " + hex(crc_of(bytes)) +
                       ", manifest says " + crc + "): the file is corrupt");
    }
    if (file == kCompressionFile) {
      has_compression = true;
    } else {
      listed.push_back(file);
    }
  }
  auto has = [&](const std::string& f) {
    return std::find(listed.begin(), listed.end(), f) != listed.end();
  };
  std::vector<std::string> shards;
  for (const std::string& f : listed) {
    if (f.rfind("optimizer-rank-", 0) == 0) shards.push_back(f);
  }
  // Shard files of a run on N ranks: exactly ranks 0..N-1 of N.
  bool shards_complete = !shards.empty();
  for (std::size_t r = 0; r < shards.size(); ++r) {
    shards_complete = shards_complete && has(optimizer_shard_name(static_cast<int>(r),
                                                                  static_cast<int>(shards.size())));
  }
  if (!has("model.safetensors") || !has("state.pbtxt") ||
      (has("optimizer.safetensors") == !shards.empty()) || (!shards.empty() && !shards_complete) ||
      listed.size() != 2 + (shards.empty() ? 1 : shards.size())) {
    throw InputError(manifest_path + ": lists " + std::to_string(listed.size()) +
                     " files besides compression.safetensors; expected model.safetensors, "
                     "state.pbtxt and either optimizer.safetensors or "
                     "optimizer-rank-R-of-N.safetensors for every rank");
  }
  Checkpoint c;
  c.path = path;
  c.model = load_safetensors(path + "/model.safetensors");
  if (shards.empty()) c.optimizer = load_safetensors(path + "/optimizer.safetensors");
  for (std::size_t r = 0; r < shards.size(); ++r) {
    c.optimizer_shards.push_back(load_safetensors(
        path + "/" + optimizer_shard_name(static_cast<int>(r), static_cast<int>(shards.size()))));
  }
  std::string text = read_file(path + "/state.pbtxt");
  if (!google::protobuf::TextFormat::ParseFromString(text, &c.state)) {
    throw InputError(path + "/state.pbtxt: cannot parse the checkpoint state");
  }
  if (has_compression) c.compression = load_safetensors(path + "/" + kCompressionFile);
  return c;
}

}  // namespace kiln::train
