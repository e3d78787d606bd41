#include "train/graphed_step.h"

#include <string>

#include "comm/watchdog.h"
#include "core/allocator.h"
#include "core/ops.h"

namespace kiln::train {

MicroPosition micro_position(int micro, int micro_batches) {
  if (micro_batches == 1) return MicroPosition::Only;
  if (micro == 0) return MicroPosition::First;
  return micro == micro_batches - 1 ? MicroPosition::Last : MicroPosition::Middle;
}

BatchSignature BatchSignature::of(const Tensor& inputs, const Tensor& targets) {
  return {inputs.shape(), targets.shape(), inputs.dtype(), targets.dtype()};
}

bool BatchSignature::operator==(const BatchSignature& o) const {
  return inputs == o.inputs && targets == o.targets && inputs_dtype == o.inputs_dtype &&
         targets_dtype == o.targets_dtype;
}

RouteChoice CaptureSchedule::choose(MicroPosition position, const BatchSignature& batch,
                                    bool fault) {
  if (!capture_) return {};
  if (fault) return {MicroRoute::Eager, "a step with an injected fault runs eagerly"};
  if (!steady_) steady_ = batch;
  if (!(batch == *steady_)) {
    return {MicroRoute::Eager, "a batch of shape " + shape_str(batch.inputs) +
                                   " runs eagerly (the graphs are captured for " +
                                   shape_str(steady_->inputs) + ")"};
  }
  if (captured_.count(position)) return {MicroRoute::Replay, ""};
  // The first run of a position builds plans, workspaces and tables eagerly; the second is
  // captured.
  if (eager_runs_[position]++ == 0) return {};
  return {MicroRoute::Capture, ""};
}

GraphedStep::GraphedStep(Device device, GraphedStepOptions options, std::int64_t micro_step)
    : device_(device),
      options_(std::move(options)),
      schedule_(options_.mode == StepMode::Graphed && device.is_cuda()) {
  counter_ = Tensor::from_vector(std::vector<std::int64_t>{micro_step}, {1}).to(device);
  if (options_.mode != StepMode::Eager && device.is_cuda()) stream_ = Stream::create(device);
}

GraphedStep::~GraphedStep() {
  // The graphs go first; then the pool's memory may serve other work again.
  graphs_.clear();
  if (has_stream()) {
    stream_.synchronize();
    cuda_allocator(device_.index).release_pool(&pool_);
  }
}

void GraphedStep::say_eager(const std::string& reason) {
  if (said_.insert(reason).second && options_.say) options_.say("cuda_graphs: " + reason);
}

void GraphedStep::stop_capturing(const std::string& why) {
  if (!schedule_.capturing()) return;
  schedule_.stop_capturing();
  say_eager(why);
}

void GraphedStep::advance_counter() {
  ops::increment(counter_);
}

void GraphedStep::synchronize() const {
  if (has_stream()) stream_.synchronize();
}

const std::uint64_t* GraphedStep::step_counter() const {
  return static_cast<const std::uint64_t*>(counter_.data());
}

void GraphedStep::run(MicroPosition position, Context& ctx, const Tensor& inputs,
                      const Tensor& targets, bool fault, std::int64_t step, const Work& work) {
  ++micro_steps_;
  const RouteChoice choice = schedule_.choose(position, BatchSignature::of(inputs, targets), fault);
  if (choice.route == MicroRoute::Eager) {
    if (!choice.reason.empty()) say_eager(choice.reason);
    work(ctx, inputs, targets);
    return;
  }
  if (!inputs_.defined()) {  // the steady batch's static buffers
    inputs_ = Tensor::empty(inputs.shape(), inputs.dtype(), inputs.device());
    targets_ = Tensor::empty(targets.shape(), targets.dtype(), targets.device());
  }
  inputs_.copy_from(inputs);
  targets_.copy_from(targets);
  const Tensor& starts = ctx.call.document_starts;
  KILN_CHECK(starts.defined() == document_starts_.defined() || choice.route == MicroRoute::Capture,
             "cuda_graphs: a batch with" + std::string(starts.defined() ? "" : "out") +
                 " document starts after graphs captured the other way");
  if (starts.defined()) {
    if (!document_starts_.defined())
      document_starts_ = Tensor::empty(starts.shape(), starts.dtype(), starts.device());
    document_starts_.copy_from(starts);
  }
  if (choice.route == MicroRoute::Capture) {
    // The eager run's activations sit free in the cache: give them back, so that the graph's
    // pool takes their place rather than adding to them (and nothing needs freeing in capture).
    cuda_allocator(device_.index).empty_cache();
    auto graph = std::make_unique<CudaGraph>();
    std::string why;
    Context frozen = ctx;  // the graph keeps these values; what changes is read from memory
    if (frozen.call.document_starts.defined()) frozen.call.document_starts = document_starts_;
    if (!graph->capture(
            device_, stream_.handle(), &pool_, [&] { work(frozen, inputs_, targets_); }, &why)) {
      stop_capturing("the step could not be captured (" + why + "); training goes on eagerly");
      if (options_.on_capture_failed) options_.on_capture_failed();
      work(ctx, inputs, targets);
      return;
    }
    if (options_.say) {
      options_.say("cuda_graphs: captured the micro-step (" + std::to_string(graph->nodes()) +
                   " nodes) for batches of shape " + shape_str(inputs.shape()));
    }
    schedule_.captured(position);
    graphs_[position] = std::move(graph);
  }
  graphs_.at(position)->replay(stream_.handle());
  ++replays_;
  if (options_.world_size > 1 && ends_step(position)) watch_replay(step);
}

// The collectives inside a graph are not watched one by one: the replay is, as one.
void GraphedStep::watch_replay(std::int64_t step) {
  auto done = std::make_shared<Event>(device_);
  done->record(stream_.handle());
  Watchdog::instance().begin(
      "collectives in the CUDA graph of training step", static_cast<std::uint64_t>(step + 1),
      options_.collective_timeout_s, [done, d = device_]() {
        try {  // the watchdog's thread: an error surfaces on the training thread instead
          DeviceGuard guard(d);
          return done->query();
        } catch (const std::exception&) {
          return true;
        }
      });
}

ComputeStreamScope::ComputeStreamScope(const GraphedStep& step) {
  if (!step.has_stream()) return;
  step_ = &step;
  device_synchronize(step.device());
  guard_ = std::make_unique<StreamGuard>(step.device(), step.stream());
}

ComputeStreamScope::~ComputeStreamScope() {
  if (step_ == nullptr) return;
  try {
    step_->synchronize();
  } catch (const std::exception&) {
    // Leaving by an exception already: the error that matters is that one.
  }
}

}  // namespace kiln::train
