// kiln autobatch --config FILE: the largest per-GPU batch that trains without running out of
// memory, found by running real training steps and recovering from out-of-memory.

#include <boost/program_options.hpp>

#include <cstdio>
#include <iostream>
#include <optional>

#include "comm/world.h"
#include "configs/experiment.h"
#include "core/allocator.h"
#include "core/check.h"
#include "core/device.h"
#include "launch/commands.h"
#include "train/trainer.h"

namespace po = boost::program_options;

namespace kiln::launch {
namespace {

struct Trial {
  bool fits = false;
  std::size_t peak_bytes = 0;
};

CachingAllocator& allocator_of(const config::Experiment& e) {
  bool cuda = e.train().device() == config::TrainConfig::CUDA ||
              (e.train().device() == config::TrainConfig::AUTO && cuda_device_count() > 0);
  return cuda ? cuda_allocator(0) : host_allocator();
}

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

// Two real training steps at `batch`; an out-of-memory anywhere in them means it does not fit.
Trial try_batch(const config::Experiment& experiment, int batch, const World& world) {
  config::Experiment e = probe_experiment(experiment, batch);
  CachingAllocator& allocator = allocator_of(e);
  allocator.empty_cache();
  allocator.reset_peak_stats();
  Trial t;
  try {
    train::TrainerOptions to;
    to.quiet = true;
    // A probe times nothing: the heuristic's algorithms, not an autotune at every batch size.
    to.heuristic_algorithms = true;
    train::Trainer trainer(e, world, to);
    trainer.benchmark(1, 1, false);
    t.fits = true;
  } catch (const OutOfMemoryError&) {
    t.fits = false;
  }
  t.peak_bytes = allocator.stats().peak_reserved_bytes;
  allocator.empty_cache();  // everything of the trial was freed with it
  return t;
}

}  // namespace

int run_autobatch(const Arguments& args) {
  po::options_description options("kiln autobatch: the largest per-GPU batch that fits");
  options.add_options()("help,h", "show this help")("config", po::value<std::string>()->required(),
                                                    "experiment file")(
      "set", po::value<std::vector<std::string>>()->composing(), "override a field")(
      "margin", po::value<double>()->default_value(0.9),
      "use this share of the largest batch that fits (room for fragmentation and spikes)")(
      "max-batch", po::value<int>()->default_value(4096), "stop searching here");
  po::variables_map vm;
  po::store(po::command_line_parser(args).options(options).run(), vm);
  if (vm.count("help")) {
    std::cout << "usage: kiln autobatch --config FILE [--set ...] (one process, no mpirun)\n\n"
              << options << "\n";
    return 0;
  }
  po::notify(vm);
  const World& world = init_world();
  if (world.size != 1)
    throw InputError("kiln autobatch runs as one process: start it without mpirun");
  std::vector<std::string> overrides;
  if (vm.count("set")) overrides = vm["set"].as<std::vector<std::string>>();
  std::string path = vm["config"].as<std::string>();
  config::Experiment e = config::load_experiment(path, overrides);
  config::validate(e, {1, cuda_device_count() > 0, path, overrides});
  int max_batch = vm["max-batch"].as<int>();

  // Double until a batch does not fit, then bisect between the last fit and the first failure.
  int good = 0, bad = 0;
  std::size_t good_peak = 0;
  for (int b = 1; b <= max_batch; b *= 2) {
    Trial t = try_batch(e, b, world);
    std::printf("  batch %5d: %s (peak %s)\n", b, t.fits ? "fits" : "out of memory",
                format_bytes(t.peak_bytes).c_str());
    std::fflush(stdout);
    if (!t.fits) {
      bad = b;
      break;
    }
    good = b;
    good_peak = t.peak_bytes;
  }
  if (good == 0) {
    std::fprintf(stderr,
                 "kiln autobatch: even batch 1 runs out of memory (limit %s): use mixed "
                 "precision or a smaller model\n",
                 format_bytes(allocator_of(e).memory_limit()).c_str());
    finalize_world();
    return 1;
  }
  while (bad != 0 && bad - good > 1) {
    int mid = good + (bad - good) / 2;
    Trial t = try_batch(e, mid, world);
    std::printf("  batch %5d: %s (peak %s)\n", mid, t.fits ? "fits" : "out of memory",
                format_bytes(t.peak_bytes).c_str());
    std::fflush(stdout);
    if (t.fits) {
      good = mid;
      good_peak = t.peak_bytes;
    } else {
      bad = mid;
    }
  }
  int chosen = std::max(1, static_cast<int>(good * vm["margin"].as<double>()));
  std::printf("largest batch that fits: %d (peak %s); recommended train.batch_per_gpu: %d\n", good,
              format_bytes(good_peak).c_str(), chosen);
  finalize_world();
  return 0;
}

}  // namespace kiln::launch
