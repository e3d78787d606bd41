#pragma once
// Helpers shared by the tokenizer tests (test_generation.cc's GPT-2 files, test_hf_tokenizer.cc's
// tokenizer.json): a scratch file, and the message of the InputError a call throws.

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "core/check.h"

namespace kiln::infer::testing {

// `contents` in a file of GoogleTest's temporary directory; its path.
inline std::string scratch_file(const std::string& name, const std::string& contents) {
  const std::string path = ::testing::TempDir() + "kiln_tokenizer_" + name;
  std::ofstream(path, std::ios::binary) << contents;
  return path;
}

// What the InputError `f` throws says, or "(no InputError)".
template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no InputError)";
}

}  // namespace kiln::infer::testing
