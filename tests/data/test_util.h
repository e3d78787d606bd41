#pragma once
// Helpers shared by the data tests: a scratch directory removed at the end, and an assertion
// that a call throws InputError whose message holds given fragments.

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "core/check.h"

namespace kiln::data::testing {

class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "kiln-data-XXXXXX").string();
    path_ = mkdtemp(pattern.data()) ? pattern : std::string();
    EXPECT_FALSE(path_.empty()) << "mkdtemp failed";
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Fails unless `call` throws kiln::InputError whose message holds every fragment.
inline void expect_input_error(const std::function<void()>& call,
                               const std::vector<std::string>& fragments) {
  try {
    call();
    ADD_FAILURE() << "expected InputError holding '" << (fragments.empty() ? "" : fragments[0])
                  << "', nothing was thrown";
  } catch (const InputError& e) {
    std::string message = e.what();
    for (const std::string& fragment : fragments) {
      EXPECT_NE(message.find(fragment), std::string::npos)
          << "message lacks '" << fragment << "': " << message;
    }
  }
}

}  // namespace kiln::data::testing
