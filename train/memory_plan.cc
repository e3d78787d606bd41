#include "train/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "configs/experiment.h"
#include "core/allocator.h"
#include "core/check.h"
#include "core/device.h"
#include "layers/models/model.h"
#include "train/gradient_sync.h"
#include "train/model_options.h"
#include "train/run_setup.h"
#include "train/trainer.h"

namespace kiln::train {

CachingAllocator& allocator_of(const config::Experiment& e) {
  bool cuda = e.train().device() == config::TrainConfig::CUDA ||
              (e.train().device() == config::TrainConfig::AUTO && cuda_device_count() > 0);
  return cuda ? cuda_allocator(0) : host_allocator();
}

namespace {

// The experiment a probe runs: two steps at `batch`, nothing written or read besides the data.
// Every change leaves the memory of a step as it is in training: the learning rate is a host
// scalar, so a constant schedule stands in for one that cannot span two steps (a warmup of
// 10000 steps followed by cosine decay).
config::Experiment probe_experiment(config::Experiment e, int batch) {
  e.mutable_train()->set_batch_per_gpu(batch);
  e.mutable_train()->clear_global_batch();
  e.mutable_train()->set_accumulation_steps(1);
  e.mutable_train()->set_steps(2);
  e.mutable_schedule()->set_kind(config::ScheduleConfig::CONSTANT);
  e.mutable_schedule()->set_warmup_steps(0);
  e.mutable_data()->set_eval_split("none");
  e.mutable_logging()->set_jsonl(false);
  e.mutable_logging()->set_tensorboard(false);
  e.mutable_checkpoint()->set_resume("");  // an earlier run's checkpoint has another batch size
  return e;
}

double env_number(const char* name, double fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  double d = std::strtod(v, &end);
  return (end != v && d > 0) ? d : fallback;
}

}  // namespace

MemoryProbe probe_step_memory(const config::Experiment& experiment, int batch, const World& world) {
  config::Experiment e = probe_experiment(experiment, batch);
  CachingAllocator& allocator = allocator_of(e);
  allocator.empty_cache();
  allocator.reset_peak_stats();
  MemoryProbe p;
  try {
    TrainerOptions to;
    to.quiet = true;
    // A probe times nothing: the heuristic's algorithms, not an autotune at every batch size.
    to.heuristic_algorithms = true;
    Trainer trainer(e, world, to);
    trainer.benchmark(1, 1, false);
    p.fits = true;
  } catch (const OutOfMemoryError&) {
    p.fits = false;
  }
  p.peak_bytes = allocator.stats().peak_reserved_bytes;
  p.peak_allocated_bytes = allocator.stats().peak_allocated_bytes;
  allocator.empty_cache();  // everything of the probe was freed with it
  return p;
}

double MemoryEstimate::total(std::int64_t batch) const {
  return weights + gradients + master + moments + workspaces + nccl +
         static_cast<double>(batch) * activations_per_sample;
}

std::int64_t MemoryEstimate::largest_batch(double limit) const {
  const double fixed = total(0);
  if (!(fixed + activations_per_sample <= limit)) return 0;
  if (activations_per_sample <= 0) return 1 << 30;
  // At most what train.batch_per_gpu (an int32) holds, however large the limit.
  const double batch = std::floor((limit - fixed) / activations_per_sample);
  return static_cast<std::int64_t>(std::min(batch, 2147483647.0));
}

bool MemoryPlan::host_fits(const MemoryEstimate& m) const {
  return host_limit <= 0 || m.host * gpus_per_node <= host_limit;
}

bool MemoryPlan::fits(const MemoryEstimate& m, std::int64_t batch) const {
  return m.total(batch) <= limit && host_fits(m);
}

std::int64_t MemoryPlan::usable_batch(const MemoryEstimate& m) const {
  if (!host_fits(m)) return 0;
  const std::int64_t largest = m.largest_batch(limit);
  if (global_batch <= 0 || largest <= 0) return largest;
  if (global_batch % world_size != 0) return 0;
  const std::int64_t per_rank = global_batch / world_size;
  std::int64_t best = 0;
  for (std::int64_t d = 1; d <= per_rank / d && d <= (1 << 20); ++d) {
    if (per_rank % d != 0) continue;
    for (const std::int64_t divisor : {d, per_rank / d}) {
      if (divisor <= largest) best = std::max(best, divisor);
    }
  }
  return best;
}

std::vector<MemoryEstimate> counted_memory(const config::Experiment& experiment, int world_size,
                                           std::int64_t* parameters) {
  KILN_CHECK(world_size >= 1, "counted_memory: world size must be at least 1");
  config::Experiment e = experiment;
  config::fill_defaults(e);
  const auto level = e.precision().opt_level();
  const bool half_weights =
      level == config::PrecisionConfig::O2 || level == config::PrecisionConfig::O3;
  const bool masters = level == config::PrecisionConfig::O2;
  const bool casts = level == config::PrecisionConfig::O1;
  const config::OptimizerConfig& o = e.optimizer();
  double moments_per_parameter = 0;
  switch (o.kind()) {
    case config::OptimizerConfig::SGD:
      moments_per_parameter = o.momentum() > 0 ? 1 : 0;
      break;
    case config::OptimizerConfig::LAMB:
      moments_per_parameter = 2;
      break;
    default:
      moments_per_parameter = o.amsgrad() ? 3 : 2;
  }

  // The parameters as the model declares them.
  ParameterShapesOnly shapes;  // only sizes are read: no memory for a 7B model's values
  Model model = make_model(model_options_from(e));
  if (parameters != nullptr) *parameters = model.net->parameter_count();
  double weights = 0, master = 0, moments = 0;
  for (Parameter* p : model.net->parameters()) {
    const double n = static_cast<double>(p->value.numel());
    const bool half = half_weights && !p->fp32_in_half;
    weights += n * (half ? 2 : 4);
    if (casts && p->value.dim() >= 2) weights += n * 2;  // O1: the half copy GEMMs read
    if (p->frozen) continue;  // LoRA's base: no master, moments or gradient
    if (masters && half) master += n * 4;
    moments +=
        n * (o.moments_dtype() == config::OptimizerConfig::BF16 ? 2 : 4) * moments_per_parameter;
  }
  double gradients = 0, largest_gradient = 0;
  for (Parameter* p : trainable(model.net->parameters())) {
    const double bytes =
        static_cast<double>(p->value.numel()) * (half_weights && !p->fp32_in_half ? 2 : 4);
    gradients += bytes;
    largest_gradient = std::max(largest_gradient, bytes);
  }

  // NCCL's buffers per rank: per channel, one send and one receive connection (ring), each with
  // the Simple (NCCL_BUFFSIZE, 4 MiB), LL128 (~4.6 MiB) and LL (256 KiB) protocol buffers.
  double nccl = 0;
  const bool cuda = e.train().device() == config::TrainConfig::CUDA ||
                    (e.train().device() == config::TrainConfig::AUTO && cuda_device_count() > 0);
  if (world_size > 1 && cuda && e.parallel().backend() != config::ParallelConfig::MPI) {
    const double simple = env_number("NCCL_BUFFSIZE", 4 << 20);
    const double channels = env_number("NCCL_MAX_NCHANNELS", 16);
    nccl = channels * 2 * (simple + 4.6 * (1 << 20) + (256 << 10));
  }
  // A parameter larger than parallel.bucket_mb gets a bucket of its own (an LM head's 1 GB at 7B).
  const double bucket = std::max(e.parallel().bucket_mb() * 1048576.0, largest_gradient);

  std::vector<MemoryEstimate> out;
  const double ranks = world_size;
  // Offload keeps the optimizer's masters and moments (ZeRO's shard of them) in host memory; the
  // host cores' update adds host twins of the weights and gradients (ZeRO's ranges of them).
  const auto offload = offload_update(e);
  const bool twins = offload == config::TrainConfig::HOST_CORES;
  const bool offload_weights = e.train().offload() == config::TrainConfig::OPTIMIZER_AND_WEIGHTS;
  // Accumulation keeps every full gradient buffer from a step's first backward to its reduction,
  // unless ZeRO-2/3 adds each micro-step's reduction into the shards.
  const bool accumulates = config::plan_batches(e, world_size).accumulation > 1 &&
                           !e.parallel().zero_accumulate_in_shards();
  // ZeRO-3 holds its shard of the weights and two units whole: the one being used (a block, or
  // the head with the embedding it shares) and the next, prefetched (one rank: nothing sharded);
  // with parallel.zero3_gather_once_per_step, every unit whole.
  double largest_unit = 0;
  for (const WeightUnit& unit : weight_units(*model.net)) {
    double bytes = 0;
    for (const Parameter* p : unit.parameters)
      bytes += static_cast<double>(p->value.numel()) * (half_weights && !p->fp32_in_half ? 2 : 4);
    largest_unit = std::max(largest_unit, bytes);
  }
  for (int stage = offload_weights ? 3 : 0; stage <= 3; ++stage) {
    for (bool recompute : {false, true}) {
      MemoryEstimate m;
      m.zero_stage = stage;
      m.recompute = recompute;
      m.keep_all = !recompute && e.train().recompute() == config::TrainConfig::KEEP_ALL;
      // Gathered once per step, every unit is whole by the end of the first forward.
      const double whole =
          e.parallel().zero3_gather_once_per_step() ? weights : std::min(weights, 2 * largest_unit);
      m.weights = stage == 3 && world_size > 1 ? weights / ranks + whole : weights;
      // ZeRO-1 keeps the full buffers and its reduced shard; ZeRO-2 its shard and one bucket
      // being reduce-scattered (never more than all; every bucket with accumulation). One rank
      // reduces nothing: stage 0's.
      const double shard = gradients / ranks;
      const double in_flight = accumulates ? gradients : std::min(bucket, gradients - shard);
      m.gradients = world_size == 1 ? gradients
                    : stage >= 2    ? shard + in_flight
                    : stage == 1    ? gradients + shard
                                    : gradients;
      m.master = stage >= 1 ? master / ranks : master;
      m.moments = stage >= 1 ? moments / ranks : moments;
      m.nccl = nccl;
      if (offload) {
        m.offload = true;
        const double twinned = weights + gradients;
        m.host = m.master + m.moments + (twins ? (stage >= 1 ? twinned / ranks : twinned) : 0);
        m.master = m.moments = 0;
      }
      if (offload_weights) {
        // The shards move to the host; the device keeps the units in use, the buckets being
        // reduced and the device copy each reduction writes before it is copied out.
        m.offload_weights = true;
        m.host += weights / ranks + shard;
        m.weights = whole;
        m.gradients = accumulates ? gradients : std::min(bucket, gradients) * (1 + 1 / ranks);
      }
      out.push_back(m);
    }
  }
  return out;
}

MemoryPlan plan_memory(const config::Experiment& experiment, int world_size, double limit_bytes,
                       const World& world, bool measure) {
  config::Experiment e = experiment;
  config::fill_defaults(e);
  MemoryPlan plan;
  plan.world_size = world_size;
  plan.batch = e.train().batch_per_gpu();
  plan.limit = limit_bytes;
  plan.global_batch = e.train().has_global_batch() ? e.train().global_batch() : 0;
  plan.estimates = counted_memory(e, world_size, &plan.parameters);
  if (!measure) {
    plan.measured = false;
    return plan;
  }
  // The probes measure what the model needs, not whether it fits a cap.
  e.mutable_train()->set_max_memory_mb(0);
  CachingAllocator& allocator = allocator_of(e);
  const std::size_t old_limit = allocator.memory_limit();
  allocator.set_memory_limit(0);
  plan.device = allocator.source_name();
  // Without BLOCKS the probe runs the experiment's own choice, NONE or KEEP_ALL.
  const config::TrainConfig::Recompute without_blocks =
      e.train().recompute() == config::TrainConfig::KEEP_ALL ? config::TrainConfig::KEEP_ALL
                                                             : config::TrainConfig::NONE;
  for (bool recompute : {false, true}) {
    e.mutable_train()->set_recompute(recompute ? config::TrainConfig::BLOCKS : without_blocks);
    // Probes at half the experiment's batch and at the batch itself: at batch 1 or 2 a step's
    // peak can sit where the batch hardly matters (the optimizer's temporaries), and a slope
    // taken there underestimates what a sample adds. Halved while the larger one does not fit.
    int low = std::max(1, plan.batch / 2);
    MemoryProbe at_low, at_high;
    for (;;) {
      at_low = probe_step_memory(e, low, world);
      at_high = probe_step_memory(e, 2 * low, world);
      if ((at_low.fits && at_high.fits) || low == 1) break;
      low = std::max(1, low / 2);
    }
    if (!at_low.fits || !at_high.fits) {
      allocator.set_memory_limit(old_limit);
      throw InputError("kiln plan: two training steps at batch 2 do not fit on " + plan.device +
                       " even without a limit: shrink the model (--set) to plan on this machine");
    }
    plan.probe_batches = {low, 2 * low};
    // Reserved memory grows by whole segments; allocated memory by exactly what a sample adds.
    const double per_sample = std::max(0.0, static_cast<double>(at_high.peak_allocated_bytes) -
                                                static_cast<double>(at_low.peak_allocated_bytes)) /
                              low;
    // The experiment's own first rows (stage 0, nothing sharded; stage 3 with the weights
    // offloaded, as the probe ran).
    const MemoryEstimate& s = plan.estimates[recompute ? 1 : 0];
    const double counted = s.weights + s.gradients + s.master + s.moments;
    const double workspaces =
        std::max(0.0, static_cast<double>(at_low.peak_bytes) - low * per_sample - counted);
    for (MemoryEstimate& m : plan.estimates) {
      if (m.recompute != recompute) continue;
      m.activations_per_sample = per_sample;
      m.workspaces = workspaces;
    }
  }
  allocator.set_memory_limit(old_limit);
  return plan;
}

void add_offload_rows(const config::Experiment& experiment, MemoryPlan* plan) {
  const std::vector<MemoryEstimate> device_rows = plan->estimates;
  for (auto offload :
       {config::TrainConfig::OPTIMIZER, config::TrainConfig::OPTIMIZER_AND_WEIGHTS}) {
    if (experiment.train().offload() >= offload) continue;
    config::Experiment e = experiment;
    config::fill_defaults(e);
    e.mutable_train()->set_offload(offload);
    e.mutable_train()->set_offload_update(config::TrainConfig::DEVICE_KERNELS);
    for (MemoryEstimate m : counted_memory(e, plan->world_size)) {
      for (const MemoryEstimate& d : device_rows) {
        if (d.recompute != m.recompute) continue;
        m.activations_per_sample = d.activations_per_sample;
        m.workspaces = d.workspaces;
      }
      plan->estimates.push_back(m);
    }
  }
}

std::int64_t predicted_largest_batch(const MemoryProbe& at1, const MemoryProbe& at2, double limit) {
  const double per_sample =
      static_cast<double>(at2.peak_allocated_bytes) - static_cast<double>(at1.peak_allocated_bytes);
  if (!at1.fits || !at2.fits || per_sample <= 0 || limit <= 0) return 0;
  const double fixed = static_cast<double>(at1.peak_bytes) - per_sample;
  return std::max<std::int64_t>(
      0, static_cast<std::int64_t>(std::floor((limit - fixed) / per_sample)));
}

}  // namespace kiln::train
