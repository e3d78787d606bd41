// The experiment parser, overrides and validation: any text gives an experiment or a ConfigError.
#include <cstdint>
#include <string>

#include "configs/experiment.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  try {
    kiln::config::Experiment e = kiln::config::parse_experiment_text(text, "fuzz.pbtxt");
    kiln::config::fill_defaults(e, "fuzz.pbtxt");
    kiln::config::validate(e, {1, false, "", {}});
    kiln::config::plan_batches(e, 3);
    kiln::config::to_json(e);
  } catch (const kiln::config::ConfigError&) {
  }
  // The first line doubles as an override.
  std::string line = text.substr(0, text.find('\n'));
  try {
    kiln::config::Experiment e;
    kiln::config::apply_override(e, line);
  } catch (const kiln::config::ConfigError&) {
  }
  return 0;
}
