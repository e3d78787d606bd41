#pragma once
// The run's checkpoints as a part of the loop: it decides when to save (checkpoint.every_steps,
// the last step, a stop request), which checkpoint a run resumes from (checkpoint.resume or
// --resume), and it collects and restores the state of the model, the optimizer, the gradient
// reducer and the loader through their own state()/load_state(). The files: train/checkpoint.h.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/world.h"
#include "configs/kiln.pb.h"
#include "data/loader.h"
#include "layers/layer.h"
#include "train/checkpoint.h"
#include "train/gradient_sync.h"
#include "train/metrics_sink.h"
#include "train/step_optimizer.h"

namespace kiln::train {

// The counters the step advances and a checkpoint keeps.
struct StepCounters {
  std::int64_t step = 0;        // optimizer steps completed
  std::int64_t micro_step = 0;  // forward/backward passes completed
  std::int64_t skipped = 0;     // optimizer steps skipped for inf/NaN gradients
};

struct CheckpointerOptions {
  std::string dir;
  int keep_last = 0;
  std::int64_t every_steps = 0;  // 0: only the last step and stop requests
  std::int64_t total_steps = 0;
  std::string resume;                     // "" (fresh), "latest" or a checkpoint directory
  bool resume_from_command_line = false;  // --resume: "latest" with none is an error
  std::string resume_flag = "--resume";   // how the command line named it, for messages
  // kiln eval without --checkpoint: with no checkpoint, the model.init_from weights (`init_from`)
  // are evaluated; with neither, an error that names both.
  bool init_from_fallback = false;
  std::string init_from;
  bool evaluate_only = false;  // the training data position is not restored, nor checked
  std::int64_t powersgd_start_step = 0;
};

// Whether the step just completed is saved by the schedule (the last step is saved by the loop's
// end, not here).
bool checkpoint_due(const CheckpointerOptions& options, std::int64_t step);

// The checkpoint a run resumes from ("" for a fresh start), given the newest complete one in the
// directory and the step-N directories there without a MANIFEST (`skipped`, oldest first).
// *note gets the lines to log: a config's "latest" that finds none (a job's first run), and a
// warning naming every skipped directory and why. --resume latest with none is an InputError;
// so is "latest" (either way) when the directory holds only skipped ones: starting fresh beside
// them would mix two runs, and resuming from the last complete one would be a silent step back.
std::string choose_resume(const CheckpointerOptions& options,
                          const std::optional<std::string>& latest,
                          const std::vector<std::string>& skipped, std::string* note);

class Checkpointer {
 public:
  struct Parts {
    const config::Experiment& experiment;
    const World& world;
    Communicator& comm;
    Layer& net;
    StepOptimizer& optimizer;
    GradientSync& sync;
    data::DataLoader& loader;
    MetricsSink& metrics;
    StepCounters& counters;
    std::int64_t global_batch = 0;
  };
  Checkpointer(CheckpointerOptions options, Parts parts);

  // Resolves checkpoint.resume and, when there is one, restores it (collective).
  void resume();
  // After an optimizer step; `last`: the run ends (saved unless it just was). Returns the path
  // written, or "".
  std::string maybe_save(bool last);
  // Writes a checkpoint of the current step on rank 0; every rank waits until it is complete.
  // `position`: the loader position to record instead of the loader's own (a step whose batch
  // failed to read already moved the loader past it).
  std::string save(const data::LoaderState* position = nullptr);
  const std::string& last_saved() const { return last_saved_; }
  std::int64_t last_saved_step() const { return last_saved_step_; }
  // The checkpoint resume() restored ("" when none: a fresh run, or kiln eval of model.init_from).
  const std::string& restored_from() const { return restored_from_; }

 private:
  void restore(const std::string& path);
  void restore_reducer_state(const Checkpoint& c);
  NamedTensors gather_reducer_state();
  config::CheckpointState state_record(const data::LoaderState* position);
  int accumulation() const;  // this run's micro-steps per optimizer step
  void check_resumable(const std::string& path, const config::CheckpointState& state);

  CheckpointerOptions options_;
  Parts p_;
  CheckpointStore store_;
  std::int64_t last_saved_step_ = -1;
  std::string last_saved_;
  std::string restored_from_;
};

}  // namespace kiln::train
