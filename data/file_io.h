#pragma once
// Whole-file reads with the error messages every reader shares: a missing, unreadable or
// corrupt file is an InputError naming the file (and the byte offset where it helps).

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kiln::data {

// The file's bytes; a gzip file (magic 1f 8b) is decompressed on the way, any other is read as
// is. Throws InputError for a missing or unreadable file and for a corrupt or truncated gzip
// stream (naming the decompressed offset reached).
std::vector<std::uint8_t> read_file(const std::string& path);

// Writes `bytes` to `path`, gzip-compressed when `gzip` is true. Throws InputError on failure.
// Used by tests and benchmarks to make small datasets.
void write_file(const std::string& path, const void* bytes, std::size_t size, bool gzip = false);

// A file mapped read-only (MAP_PRIVATE, PROT_READ): pages come from the page cache on first touch
// and the kernel may drop them again, so a dataset larger than RAM can be read in place. The
// mapping stays valid after the descriptor is closed; the destructor unmaps it.
class MappedFile {
 public:
  // Throws InputError naming the file (and the failing call) when it is not a regular file or
  // cannot be opened, sized or mapped. An empty file maps to size() 0, data() nullptr.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::uint8_t* data() const { return data_; }
  std::size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void unmap() noexcept;

  std::string path_;
  const std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
};

// The paths `pattern` matches (glob(3): *, ?, [...]), sorted bytewise; empty when none match.
// Throws InputError naming the pattern when glob(3) fails (out of memory, unreadable directory).
std::vector<std::string> glob_paths(const std::string& pattern);

bool path_exists(const std::string& path);
bool is_directory(const std::string& path);
std::string join_path(const std::string& a, const std::string& b);

// "<path>: <what> (at byte <offset>)" as an InputError.
[[noreturn]] void throw_file_error(const std::string& path, const std::string& what);
[[noreturn]] void throw_file_error(const std::string& path, std::uint64_t offset,
                                   const std::string& what);

}  // namespace kiln::data
