#pragma once
// train.cuda_graphs: the steady-state training step as CUDA graphs. A micro-batch's work (zero
// the gradients on the first, forward, loss, backward with the bucket all-reduces, and on the
// last the optimizer with its inf check, clipping and loss-scaler update) is captured once per
// position in the optimizer step — one graph without gradient accumulation; first, middle and last
// with it — after one eager run of that position has built every plan and workspace, and is
// replayed from then on. Every per-step value the captured kernels need (loss scale, skip
// decision, learning rate, step counts, dropout's step) is read from device memory
// (optim/step_state.h, Context::step_source), so the host never waits for the GPU inside a step.
// The batch is copied into the graphs' static input buffers before each replay. A micro-batch of
// another shape (a last partial batch) or one a fault is injected into runs eagerly.

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "core/cuda_graph.h"
#include "core/stream.h"
#include "core/tensor.h"

namespace kiln::train {

// Where a micro-batch sits in its optimizer step: what its captured work includes.
enum class MicroPosition { Only = 0, First = 1, Middle = 2, Last = 3 };

MicroPosition micro_position(int micro, int micro_batches);

struct StepGraphs {
  explicit StepGraphs(Device device);
  ~StepGraphs();

  Device device;
  Stream stream;         // the compute stream while training: a capture needs a stream of its own
  bool capture = false;  // graphs may be captured (CUDA, and nothing that needs the host each step)
  std::map<MicroPosition, std::unique_ptr<CudaGraph>> graphs;
  std::map<MicroPosition, int> eager_runs;  // steady-shape eager runs of each position so far
  Tensor inputs, targets;                   // the static batch the graphs read
  Tensor micro_step;              // I64 (1) on the device: dropout's step (Context::step_source)
  std::set<std::string> said;     // eager reasons already logged
  std::uint64_t replays = 0;      // micro-steps that replayed a graph
  std::uint64_t micro_steps = 0;  // every training micro-step, graphed or eager
  int pool = 0;                   // its address names the allocator's private pool

  // The steady shape: the first training batch's. Another shape runs eagerly.
  bool steady(const Tensor& batch_inputs, const Tensor& batch_targets) const;
};

// The graphs' stream as the current one for a scope (train, benchmark): it starts after the
// device finished what was queued on the default stream (set-up, restored checkpoints), and the
// scope ends with the stream drained, so work after it on the default stream sees the results.
class ComputeStreamScope {
 public:
  explicit ComputeStreamScope(StepGraphs* graphs);
  ~ComputeStreamScope();
  ComputeStreamScope(const ComputeStreamScope&) = delete;
  ComputeStreamScope& operator=(const ComputeStreamScope&) = delete;

 private:
  StepGraphs* graphs_ = nullptr;
  std::unique_ptr<StreamGuard> guard_;
};

}  // namespace kiln::train
