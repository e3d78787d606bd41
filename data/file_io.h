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

// A file read by offset (pread), never mapped: a mapping turns a file truncated while it is read
// into SIGBUS, where this gives an InputError naming the file. Reads go through the page cache,
// so a dataset larger than RAM is read in place all the same. Safe to read from several threads.
class PositionalFile {
 public:
  // Throws InputError naming the file when it is not a regular file or cannot be opened.
  explicit PositionalFile(const std::string& path);
  ~PositionalFile();
  PositionalFile(PositionalFile&& other) noexcept;
  PositionalFile& operator=(PositionalFile&& other) noexcept;
  PositionalFile(const PositionalFile&) = delete;
  PositionalFile& operator=(const PositionalFile&) = delete;

  // Exactly `size` bytes at `offset` into `out`. InputError naming the file, the byte range and
  // the sizes the file had when opened and has now when it is shorter (truncated since it was
  // opened) or the read fails.
  void read_at(std::uint64_t offset, void* out, std::size_t size) const;
  std::uint64_t size() const { return size_; }  // when opened
  const std::string& path() const { return path_; }

 private:
  void close() noexcept;
  std::string path_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
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
