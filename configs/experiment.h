// Loading, overriding, validating and fingerprinting experiments (configs/kiln.proto).
//
// Typical use by the `kiln` command:
//   Experiment exp = load_experiment(path, set_flags);      // parse + --set + defaults
//   validate(exp, {world_size, cuda_available, path, set_flags});
//   BatchPlan plan = plan_batches(exp, world_size);
// Every failure is a ConfigError whose message names where the bad value came from
// (FILE:LINE:COLUMN, or `--set path=value`), the field's dotted path and what is allowed.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "configs/kiln.pb.h"

namespace kiln::config {

// A bad experiment file, override or combination of fields. The `kiln` command maps it to
// exit code 2.
class ConfigError : public std::runtime_error {
 public:
  explicit ConfigError(const std::string& message) : std::runtime_error(message) {}
};

// What validation needs to know beyond the experiment itself.
struct ValidationContext {
  int world_size = 1;                  // ranks in the job
  bool cuda_available = false;         // a CUDA device is usable by this process
  std::string config_path;             // the file the experiment came from ("" when built in code)
  std::vector<std::string> overrides;  // the `path=value` overrides applied, to blame them
  // Validate for the device train.device names as if it were present: `kiln config` on a login
  // node describes the GPU job it will submit. `kiln train` leaves it false.
  bool assume_named_device = false;
};

// The batch arithmetic: global = per_gpu × accumulation × world_size.
struct BatchPlan {
  int per_gpu = 0;
  int accumulation = 0;
  std::int64_t global = 0;
  int world_size = 0;
};

// Parses the text-format experiment at `path` (unknown fields rejected), applies each
// `path=value` override in order, then fills every unset default (fill_defaults).
Experiment load_experiment(const std::string& path, const std::vector<std::string>& overrides);

// Parses experiment text; `source_name` names it in errors. Used by load_experiment.
Experiment parse_experiment_text(const std::string& text, const std::string& source_name);

// Applies one `dotted.path=value` override (see docs/configs.md for the value syntax).
void apply_override(Experiment& experiment, const std::string& assignment);

// The GPT-2 family: gpt2, gpt2_medium, gpt2_large, gpt2_xl (causal language models).
bool is_gpt_model(const std::string& model_name);
// The llama family: llama, qwen2 and the presets qwen2_5_*, llama3_*.
bool is_llama_model(const std::string& model_name);
// GPT-2 or the llama family: next-token models on token data.
bool is_causal_lm(const std::string& model_name);

// Writes the default into every field left unset: the defaults kiln.proto declares (one walk,
// configs/schema.h) and the rules that depend on other fields (configs/defaults.cc).
// `config_path` supplies the default experiment name (its file name without ".pbtxt").
// Idempotent.
void fill_defaults(Experiment& experiment, const std::string& config_path = "");

// The defaults that depend on where the run goes, filled by each command that runs or describes
// one, after fill_defaults: train.cuda_graphs is true where the run's device is CUDA (train.device
// CUDA, or AUTO with `cuda_available`). Idempotent; a field set stays as it is.
void fill_device_defaults(Experiment& experiment, bool cuda_available);

// Checks the ranges kiln.proto declares, then the combinations of fields and the paths the
// experiment names (each must be of the kind its field says: a file, a directory); throws the
// first problem found as a ConfigError. Expects an experiment that went through fill_defaults.
void validate(const Experiment& experiment, const ValidationContext& context);

// Per-GPU batch, accumulation steps and global batch for `world_size` ranks. Throws a
// ConfigError when global_batch is set and does not divide.
BatchPlan plan_batches(const Experiment& experiment, int world_size);

// The effective experiment as protobuf text (fields at zero/false/"" are omitted, as
// protobuf prints them), and as JSON with every field printed.
std::string to_text(const Experiment& experiment);
std::string to_json(const Experiment& experiment);
// As to_text, with every enum field shown at its first value too (optimizer.kind: SGD,
// train.device: AUTO): what `kiln config` prints and `kiln train` records in
// <logging.dir>/experiment.pbtxt. Parses back to the same experiment.
std::string to_effective_text(const Experiment& experiment);

// Stable 64-bit FNV-1a hash of the deterministic serialisation: equal on every rank that
// loaded the same effective experiment, to detect ranks with differing configs.
std::uint64_t experiment_hash(const Experiment& experiment);

// The model names the schema accepts in model.name (its `(kiln.allowed)` values).
const std::vector<std::string>& known_model_names();

}  // namespace kiln::config
