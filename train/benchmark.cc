// Trainer::benchmark: training steps on the experiment's data, timed with CUDA events (wall clock
// on the CPU), with an optional per-layer profile from events around each layer.

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <tuple>

#include "core/allocator.h"
#include "core/stream.h"
#include "train/trainer_state.h"

namespace kiln::train {

BenchResult Trainer::benchmark(int warmup, int steps, bool profile) {
  State& s = *s_;
  BenchResult r;
  // A profile times each layer from host callbacks, which a replayed graph does not make.
  if (profile)
    s.graphs->stop_capturing("kiln bench --profile times every layer: the steps run eagerly");
  ComputeStreamScope on_stream(*s.graphs);
  Context ctx = s.make_context(true);
  s.model.net->set_training(true);
  Tensor loss_sum = Tensor::zeros({}, DType::F32, s.device);
  std::int64_t micro = 0, samples = 0;
  GemmTally gemms;
  for (int i = 0; i < warmup; ++i) s.run_step(ctx, loss_sum, &micro, &samples);
  if (s.optimizer->resident()) s.resident_outcome();
  device_synchronize(s.device);
  s.comm->barrier();
  CachingAllocator* gpu = s.device.is_cuda() ? &cuda_allocator(s.device.index) : nullptr;
  if (gpu) gpu->reset_peak_stats();
  std::uint64_t raw_before = gpu ? gpu->stats().raw_allocations : 0;

  // Per-layer events: top-level layers (names without a dot), and every leaf layer summed by
  // its type, so a profile shows both where in the model and in which kind of layer time goes.
  struct Span {
    std::string layer;
    bool forward;
    Event begin, end;
    Clock::time_point host_begin{};
    double host_ms = 0;
  };
  std::vector<std::unique_ptr<Span>> spans, leaf_spans;
  std::map<std::tuple<Layer*, bool, bool>, Span*> open;
  if (profile && s.device.is_cuda()) {
    ctx.observers.push_back([&](Layer& layer, bool forward, bool begin) {
      bool top = !layer.name().empty() && layer.name().find('.') == std::string::npos;
      bool leaf = layer.children().empty();
      void* stream = current_stream(s.device);
      for (bool as_top : {true, false}) {
        if (as_top ? !top : !leaf) continue;
        auto key = std::make_tuple(&layer, forward, as_top);
        if (begin) {
          auto& list = as_top ? spans : leaf_spans;
          list.push_back(
              std::make_unique<Span>(Span{as_top ? layer.name() : layer.type(), forward,
                                          Event(s.device, true), Event(s.device, true)}));
          list.back()->begin.record(stream);
          list.back()->host_begin = Clock::now();
          open[key] = list.back().get();
        } else if (open.count(key)) {
          Span* span = open[key];
          span->host_ms = 1e3 * seconds_since(span->host_begin);
          span->end.record(stream);
          open.erase(key);
        }
      }
    });
  }
  double wait_before = s.loader->wait_time();
  // Bucket timing records events from host hooks, which a replayed graph does not call either.
  DataParallel* dp = s.sync->data_parallel();
  const bool comm_timing = dp != nullptr && !s.graphs->capturing();
  if (comm_timing) dp->set_timing(true);
  const std::uint64_t micro_steps_before = s.graphs->micro_steps();
  const std::uint64_t replays_before = s.graphs->replays();
  double host_seconds = 0;
  std::vector<CommStepTiming> comm_timings;
  auto wall_start = Clock::now();
  // A profile runs eagerly: each timed GEMM gets its own pair of events (the host clock on the
  // CPU).
  r.gemms_timed = profile && !s.graphs->capturing();
  gemms.set_timed(r.gemms_timed);
  for (int i = 0; i < steps; ++i) {
    if (s.device.is_cuda()) {
      Event begin(s.device, true), end(s.device, true);
      begin.record(current_stream(s.device));
      auto t0 = Clock::now();
      s.run_step(ctx, loss_sum, &micro, &samples);
      host_seconds += seconds_since(t0);
      end.record(current_stream(s.device));
      end.synchronize();
      r.step_ms.push_back(begin.elapsed_ms(end));
      if (comm_timing) comm_timings.push_back(dp->step_timing(&begin, {}));
    } else {
      auto t0 = Clock::now();
      s.run_step(ctx, loss_sum, &micro, &samples);
      r.step_ms.push_back(1e3 * seconds_since(t0));
      host_seconds += seconds_since(t0);
      if (comm_timing) comm_timings.push_back(dp->step_timing(nullptr, t0));
    }
  }
  if (comm_timing) dp->set_timing(false);
  gemms.set_timed(false);
  r.gemms = gemms.totals();
  if (s.optimizer->resident()) s.resident_outcome();  // raises what the device recorded
  r.host_ms_per_step = steps > 0 ? 1e3 * host_seconds / steps : 0;
  // Graphed: every micro-step of the timed steps replayed a graph.
  r.graph = s.graphs->replays() - replays_before == s.graphs->micro_steps() - micro_steps_before &&
            s.graphs->replays() > replays_before;
  if (!comm_timings.empty()) {
    std::vector<std::size_t> order(comm_timings.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return comm_timings[a].exposed_ms < comm_timings[b].exposed_ms;
    });
    const CommStepTiming& median = comm_timings[order[order.size() / 2]];
    r.exposed_comm_ms = s.comm->all_reduce_host(median.exposed_ms, HostReduceOp::Max);
    if (profile) {
      r.comm_timeline = median;
      for (const GradientBucketInfo& b : dp->bucket_layout()) {
        r.bucket_bytes.push_back(static_cast<std::size_t>(b.numel) * dtype_size(b.dtype));
      }
    }
  }
  double wall = seconds_since(wall_start);
  r.data_wait_fraction = (s.loader->wait_time() - wait_before) / std::max(wall, 1e-9);
  std::vector<double> sorted = r.step_ms;
  std::sort(sorted.begin(), sorted.end());
  r.median_ms = sorted.empty() ? 0 : sorted[sorted.size() / 2];
  if (s.world.size > 1) r.median_ms = s.comm->all_reduce_host(r.median_ms, HostReduceOp::Max);
  r.flops_per_sample = s.flops_per_sample;
  r.samples_per_s = r.median_ms > 0 ? s.plan.global / (r.median_ms / 1e3) : 0;
  r.tflops_per_gpu = r.samples_per_s / s.world.size * s.flops_per_sample / 1e12;
  r.mfu = s.peak_flops > 0 ? r.tflops_per_gpu * 1e12 / s.peak_flops : 0;
  if (gpu) {
    AllocatorStats a = gpu->stats();
    // A replayed graph works in its pool's free blocks besides what is allocated.
    r.peak_allocated_bytes = a.peak_allocated_bytes + a.graph_pool_bytes;
    r.graph_pool_bytes = a.graph_pool_bytes;
    r.peak_reserved_bytes = a.peak_reserved_bytes;
    r.fragmentation = a.fragmentation();
    r.raw_allocations_in_timed_steps = a.raw_allocations - raw_before;
  }
  if (!spans.empty()) {
    device_synchronize(s.device);
    std::map<std::string, std::pair<std::vector<double>, std::vector<double>>> times;
    std::vector<std::string> order;
    for (auto& span : spans) {
      if (!times.count(span->layer)) order.push_back(span->layer);
      auto& t = times[span->layer];
      (span->forward ? t.first : t.second).push_back(span->begin.elapsed_ms(span->end));
    }
    auto median = [](std::vector<double> v) {
      if (v.empty()) return 0.0;
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    for (const std::string& name : order) {
      r.layers.push_back({name, median(times[name].first), median(times[name].second)});
    }
    std::map<std::string, LayerTime> by_type;
    for (auto& span : leaf_spans) {
      LayerTime& t = by_type[span->layer];
      t.layer = span->layer;
      (span->forward ? t.forward_ms : t.backward_ms) += span->begin.elapsed_ms(span->end) / steps;
      (span->forward ? t.host_forward_ms : t.host_backward_ms) += span->host_ms / steps;
    }
    for (const auto& entry : by_type) r.layer_types.push_back(entry.second);
  }
  return r;
}

}  // namespace kiln::train
