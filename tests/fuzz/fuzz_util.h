#pragma once
// Shared by the libFuzzer targets: write the input to a private temporary file.

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

namespace kiln::fuzz {

inline std::string write_temp(const std::string& tag, const std::uint8_t* data, std::size_t size) {
  std::string path = "/tmp/kiln-fuzz-" + std::to_string(::getpid()) + "-" + tag;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return path;
  if (size > 0) std::fwrite(data, 1, size, f);
  std::fclose(f);
  return path;
}

}  // namespace kiln::fuzz
