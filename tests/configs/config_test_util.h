#pragma once
// Helpers shared by the configs/ tests.

#include <gtest/gtest.h>

#include <string>

#include "configs/experiment.h"

namespace kiln::config {

// The message of the ConfigError `action` throws; fails the test when it throws none.
template <typename Action>
std::string error_of(Action action) {
  try {
    action();
  } catch (const ConfigError& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected a ConfigError";
  return "";
}

}  // namespace kiln::config
