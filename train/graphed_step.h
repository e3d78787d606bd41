#pragma once
// train.cuda_graphs: the steady-state training step as CUDA graphs. A micro-batch's work (zero
// the gradients on the first, forward, loss, backward with the bucket all-reduces, and on the
// last the optimizer with its inf check, clipping and loss-scaler update) is captured once per
// position in the optimizer step — one graph without gradient accumulation; first, middle and last
// with it — after one eager run of that position has built every plan and workspace, and is
// replayed from then on. Every per-step value the captured kernels need (loss scale, skip
// decision, learning rate, step counts, dropout's step) is read from device memory
// (optim/step_state.h, Context::step), so the host never waits for the GPU inside a step.
// The batch is copied into the graphs' static input buffers before each replay (packed documents'
// ctx.call.document_starts too: the captured work reads a static copy). A micro-batch of
// another shape (a last partial batch) or one a fault is injected into runs eagerly.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "core/cuda_graph.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "layers/layer.h"

namespace kiln::train {

// How the run's steps go, chosen once when the run is set up (step_mode()):
//   Eager     the optimizer reads its step state on the host every step;
//   Resident  the optimizer's step state lives on the device (no host read inside a step);
//   Graphed   resident, and steady micro-steps replay captured CUDA graphs.
enum class StepMode { Eager, Resident, Graphed };

// Where a micro-batch sits in its optimizer step: what its captured work includes.
enum class MicroPosition { Only = 0, First = 1, Middle = 2, Last = 3 };

MicroPosition micro_position(int micro, int micro_batches);
inline bool ends_step(MicroPosition p) {
  return p == MicroPosition::Only || p == MicroPosition::Last;
}
inline bool begins_step(MicroPosition p) {
  return p == MicroPosition::Only || p == MicroPosition::First;
}

// What identifies a batch for the graphs: a replay reads buffers of one shape and dtype.
struct BatchSignature {
  Shape inputs, targets;
  DType inputs_dtype = DType::F32, targets_dtype = DType::F32;
  static BatchSignature of(const Tensor& inputs, const Tensor& targets);
  bool operator==(const BatchSignature& o) const;
};

// The graphs' decisions, apart from CUDA (testable anywhere): for each micro-batch, run it
// eagerly (with the reason to log, "" for the silent first run of a position), capture it, or
// replay its position's graph.
enum class MicroRoute { Eager, Capture, Replay };
struct RouteChoice {
  MicroRoute route = MicroRoute::Eager;
  std::string reason;
};

class CaptureSchedule {
 public:
  explicit CaptureSchedule(bool capture) : capture_(capture) {}
  // The first batch seen while capturing fixes the steady signature.
  RouteChoice choose(MicroPosition position, const BatchSignature& batch, bool fault);
  void captured(MicroPosition position) { captured_.insert(position); }
  void stop_capturing() { capture_ = false; }  // a capture failed, or a profile needs host hooks
  bool capturing() const { return capture_; }
  const std::optional<BatchSignature>& steady() const { return steady_; }

 private:
  bool capture_;
  std::optional<BatchSignature> steady_;
  std::map<MicroPosition, int> eager_runs_;  // steady-shape eager runs of each position so far
  std::set<MicroPosition> captured_;
};

struct GraphedStepOptions {
  StepMode mode = StepMode::Eager;
  int world_size = 1;
  double collective_timeout_s = 0;              // the watchdog's, for a replay with collectives
  std::function<void(const std::string&)> say;  // a line of the run's log
  std::function<void()> on_capture_failed;      // before the eager re-run (reset collectives)
};

// Runs each micro-step: eagerly, or captured and replayed in Graphed mode. Owns the micro-step
// counter the layers read (Context::step.step; device memory, advanced on the device in every
// mode), the graphs' stream and their private allocator pool.
class GraphedStep {
 public:
  using Work = std::function<void(Context& ctx, const Tensor& inputs, const Tensor& targets)>;

  GraphedStep(Device device, GraphedStepOptions options, std::int64_t micro_step);
  ~GraphedStep();
  GraphedStep(const GraphedStep&) = delete;
  GraphedStep& operator=(const GraphedStep&) = delete;

  StepMode mode() const { return options_.mode; }
  // `step` (the optimizer step, 0-based) names a replay's collectives for the watchdog.
  void run(MicroPosition position, Context& ctx, const Tensor& inputs, const Tensor& targets,
           bool fault, std::int64_t step, const Work& work);
  // After each micro-step's backward (inside the captured work): dropout's next step.
  void advance_counter();
  // The micro-step counter the layers read (Context::step.step), in every mode.
  const std::uint64_t* step_counter() const;
  // Every later micro-step runs eagerly, saying why once (kiln bench --profile).
  void stop_capturing(const std::string& why);
  bool capturing() const { return schedule_.capturing(); }
  // Host work is issued on the graphs' stream (Graphed and Resident modes on CUDA).
  bool has_stream() const { return stream_.handle() != nullptr; }
  void* stream() const { return stream_.handle(); }
  void synchronize() const;  // waits for the graphs' stream
  Device device() const { return device_; }

  std::uint64_t replays() const { return replays_; }          // micro-steps that replayed a graph
  std::uint64_t micro_steps() const { return micro_steps_; }  // every micro-step run

 private:
  void say_eager(const std::string& reason);
  void watch_replay(std::int64_t step);

  Device device_;
  GraphedStepOptions options_;
  CaptureSchedule schedule_;
  Stream stream_;  // a capture needs a stream of its own
  std::map<MicroPosition, std::unique_ptr<CudaGraph>> graphs_;
  Tensor inputs_, targets_;  // the static batch the graphs read
  Tensor document_starts_;   // and its document starts, when ctx.call has them
  Tensor counter_;           // I64 (1) on the device: dropout's step (Context::step.step)
  std::set<std::string> said_;
  std::uint64_t replays_ = 0;
  std::uint64_t micro_steps_ = 0;
  int pool_ = 0;  // its address names the allocator's private pool
};

// The graphs' stream as the current one for a scope (train, benchmark): it starts after the
// device finished what was queued on the default stream (set-up, restored checkpoints), and the
// scope ends with the stream drained, so work after it on the default stream sees the results.
class ComputeStreamScope {
 public:
  explicit ComputeStreamScope(const GraphedStep& step);
  ~ComputeStreamScope();
  ComputeStreamScope(const ComputeStreamScope&) = delete;
  ComputeStreamScope& operator=(const ComputeStreamScope&) = delete;

 private:
  const GraphedStep* step_ = nullptr;
  std::unique_ptr<StreamGuard> guard_;
};

}  // namespace kiln::train
