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

bool path_exists(const std::string& path);
bool is_directory(const std::string& path);
std::string join_path(const std::string& a, const std::string& b);

// "<path>: <what> (at byte <offset>)" as an InputError.
[[noreturn]] void throw_file_error(const std::string& path, const std::string& what);
[[noreturn]] void throw_file_error(const std::string& path, std::uint64_t offset,
                                   const std::string& what);

}  // namespace kiln::data
