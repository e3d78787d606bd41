#pragma once
// Where every report of a run goes, written once for train and eval records alike: the log line
// (or the progress bar on a terminal), metrics.jsonl, TensorBoard, with the device's memory and
// NVML readings added on CUDA. Only rank 0 writes; on other ranks every call does nothing.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "core/device.h"
#include "train/metrics.h"

namespace kiln::train {

struct MetricsSinkOptions {
  bool active = false;    // rank 0
  bool print = true;      // log lines (false: quiet)
  bool progress = false;  // a progress bar instead of per-interval train lines
  std::string dir;        // logging.dir, created if missing
  bool jsonl = true;
  bool tensorboard = false;
  bool append = false;  // resuming: metrics.jsonl continues
  std::int64_t total_steps = 0;
  Device device = Device::cpu();
};

enum class RecordKind { kTrain, kEval };

class MetricsSink {
 public:
  explicit MetricsSink(const MetricsSinkOptions& options);
  ~MetricsSink();

  // Adds the memory and NVML fields (CUDA), then writes `record` at `step`: JSONL keys as given
  // for train and prefixed "eval_" for eval, TensorBoard tags "train/<key>" or "eval/<key>", and
  // `line` with the memory and NVML text on the terminal. A train record with the bar on moves
  // the bar instead (its suffix: `bar_text`).
  void write(RecordKind kind, std::int64_t step, Record record, const std::string& line,
             const std::string& bar_text = "");
  // Training starts (or resumes) at `step`: the bar starts counting from here.
  void begin(std::int64_t step);
  // After every step: redraws the bar when it has not moved for a quarter second. A thread also
  // redraws it (elapsed time, ETA) every second while a long step runs.
  void tick(std::int64_t step);
  // A message line (checkpoints, resume, warnings), kept clear of the bar.
  void print(const std::string& line);
  void finish();  // ends the bar's line
  // Closes the log files (flushed, synced) and returns the first write failure of the run's logs
  // (metrics.jsonl, TensorBoard, stdout): the file and errno's text; "" when all were written
  // whole. Each failure was reported on stderr when it happened; kiln train exits
  // kExitLogWriteFailed for one.
  std::string close();

 private:
  std::string device_readings(Record& record) const;
  void check_stdout();  // after writing to stdout, with mutex_ held
  void draw_bar(std::chrono::milliseconds unless_drawn_within);  // with mutex_ held
  void redraw_every_second();
  MetricsSinkOptions options_;
  std::chrono::steady_clock::time_point started_;
  std::unique_ptr<JsonlWriter> jsonl_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  std::unique_ptr<ProgressBar> bar_;
  // Terminal output from the training thread and the redraw thread, one at a time.
  std::mutex mutex_;
  std::condition_variable stop_redraw_;
  bool stopping_ = false;
  std::string bar_text_;
  std::int64_t bar_step_ = 0;
  bool bar_started_ = false;
  std::chrono::steady_clock::time_point last_draw_{};
  bool bar_on_line_ = false;
  std::string stdout_failure_;
  std::thread redraw_;
};

// One training log interval's figures, and the record and line they make:
// "step 6/6 epoch 0 loss ... samples/s [tokens/s] ... TFLOP/s [MFU ...] ... ms/step [data wait
// N%] elapsed ... ETA ...".
struct IntervalFigures {
  std::int64_t step = 0, total_steps = 0, epoch = 0;
  double mean_loss = 0, lr = 0, loss_scale = 1;
  double grad_norm = -1;  // -1: not computed
  bool skipped = false;   // the last step was skipped for inf/NaN gradients
  double samples_per_s = 0, wait_fraction = 0;
  double flops_per_sample = 0;
  double peak_flops = 0;  // per GPU; 0: no MFU
  int world_size = 1;
  double tokens_per_sample = 0;  // token models: the sequence length; 0: no tokens/s
  double step_ms = 0;            // the interval's mean wall time per optimizer step
  double elapsed_s = 0;          // since this process began training
  double eta_s = -1;             // the remaining steps at this process's mean rate; -1: unknown
  double fp8_overflows = -1;     // precision.fp8: overflowed casts so far, all ranks; -1: no FP8
  double weight_gathers = -1;    // ZeRO-3: buckets of weights gathered per step on rank 0; -1: none
};

struct IntervalReport {
  Record record;
  std::string line;
  std::string bar_text;
};

// The line shows "data wait N%" from this share of the interval on (the loader is the bound).
constexpr double kShownDataWait = 0.01;
IntervalReport interval_report(const IntervalFigures& f);

}  // namespace kiln::train
