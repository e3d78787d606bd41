// kiln autobatch --config FILE: the largest per-GPU batch that trains without running out of
// memory, found by running real training steps and recovering from out-of-memory. The first
// two (batch 1 and 2) fit kiln plan's linear memory model (train/memory_plan.h), whose
// prediction under the limit is the next batch tried; doubling and bisection take it from there.

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
#include "train/memory_plan.h"

namespace po = boost::program_options;

namespace kiln::launch {
int run_autobatch(const Arguments& args) {
  po::options_description options("kiln autobatch: the largest per-GPU batch that fits");
  options.add_options()("help,h", "show this help")("config", po::value<std::string>()->required(),
                                                    "experiment file")(
      "set", po::value<std::vector<std::string>>()->composing(), "override a field")(
      "margin", po::value<double>()->default_value(0.9),
      "use this share of the largest batch that fits (room for fragmentation and spikes)")(
      "max-batch", po::value<int>()->default_value(4096),
      "stop searching here: the largest batch tried")(
      "world-size", po::value<int>()->default_value(1),
      "ranks of the run: with train.global_batch, the recommended batch divides "
      "global_batch / world-size");
  po::variables_map vm;
  po::store(po::command_line_parser(args).options(options).run(), vm);
  if (vm.count("help")) {
    std::cout << "usage: kiln autobatch --config FILE [--set ...] (one process, no mpirun)\n\n"
              << options << "\n";
    return 0;
  }
  po::notify(vm);
  // Checked before anything runs: a margin above 1 recommends a batch that was never tried, and
  // --max-batch 0 would report batch 1 as out of memory without trying it.
  const double margin = vm["margin"].as<double>();
  if (!(margin > 0 && margin <= 1)) {
    char given[32];
    std::snprintf(given, sizeof(given), "%g", margin);
    throw InputError(std::string("--margin ") + given +
                     ": must be in (0, 1], the share of the largest batch that fits to recommend");
  }
  const int max_batch = vm["max-batch"].as<int>();
  if (max_batch < 1) {
    throw InputError("--max-batch " + std::to_string(max_batch) +
                     ": must be at least 1 (the largest batch the search tries)");
  }
  const int world_size = vm["world-size"].as<int>();
  if (world_size < 1) {
    throw InputError("--world-size " + std::to_string(world_size) + ": must be at least 1");
  }
  const World& world = init_world();
  if (world.size != 1)
    throw InputError("kiln autobatch runs as one process: start it without mpirun");
  std::vector<std::string> overrides;
  if (vm.count("set")) overrides = vm["set"].as<std::vector<std::string>>();
  std::string path = vm["config"].as<std::string>();
  config::Experiment e = config::load_experiment(path, overrides);
  config::validate(e, {1, cuda_device_count() > 0, path, overrides});
  const std::int64_t global_batch = e.train().has_global_batch() ? e.train().global_batch() : 0;
  if (global_batch > 0 && global_batch % world_size != 0) {
    throw InputError("train.global_batch " + std::to_string(global_batch) +
                     " is not a multiple of --world-size " + std::to_string(world_size) +
                     ": no per-GPU batch divides it");
  }

  auto probe = [&](int b) {
    train::MemoryProbe t = train::probe_step_memory(e, b, world);
    std::printf("  batch %5d: %s (peak %s)\n", b, t.fits ? "fits" : "out of memory",
                format_bytes(t.peak_bytes).c_str());
    std::fflush(stdout);
    return t;
  };
  // Batch 1 and 2, then the memory model's prediction, then doubling until a batch does not fit,
  // then bisection between the last fit and the first failure.
  int good = 0, bad = 0;
  std::size_t good_peak = 0;
  train::MemoryProbe first;
  for (int b = 1; b <= max_batch;) {
    train::MemoryProbe t = probe(b);
    if (!t.fits) {
      bad = b;
      break;
    }
    good = b;
    good_peak = t.peak_bytes;
    int next = b * 2;
    if (b == 1) first = t;
    if (b == 2) {
      const double limit = static_cast<double>(train::allocator_of(e).memory_limit());
      const std::int64_t predicted = train::predicted_largest_batch(first, t, limit);
      if (predicted > 2) {
        std::printf("  the memory model predicts %lld\n", static_cast<long long>(predicted));
        next = static_cast<int>(std::min<std::int64_t>(predicted, max_batch));
      }
      if (next <= b) next = b * 2;
    }
    // The ceiling itself is tried last, so "fits up to --max-batch" is measured, not assumed.
    if (next > max_batch && b < max_batch) next = max_batch;
    b = next;
  }
  if (good == 0) {
    std::fprintf(stderr,
                 "kiln autobatch: even batch 1 runs out of memory (limit %s): use mixed "
                 "precision, train.recompute: BLOCKS or a smaller model (kiln plan shows the "
                 "memory by part)\n",
                 format_bytes(train::allocator_of(e).memory_limit()).c_str());
    finalize_world();
    return 1;
  }
  while (bad != 0 && bad - good > 1) {
    int mid = good + (bad - good) / 2;
    train::MemoryProbe t = probe(mid);
    if (t.fits) {
      good = mid;
      good_peak = t.peak_bytes;
    } else {
      bad = mid;
    }
  }
  int chosen = std::max(1, static_cast<int>(good * margin));
  std::string divides;
  if (global_batch > 0) {
    // The run derives accumulation from global_batch: the batch must divide it per rank.
    const std::int64_t per_rank = global_batch / world_size;
    while (chosen > 1 && per_rank % chosen != 0) --chosen;
    divides = " (divides train.global_batch " + std::to_string(global_batch) + " / " +
              std::to_string(world_size) + " rank" + (world_size == 1 ? "" : "s") + ")";
  }
  if (bad == 0) {
    // Nothing ran out of memory: `good` is the search's ceiling, not a limit found.
    std::printf(
        "no batch up to --max-batch %d ran out of memory: batch %d fits (peak %s), and a larger "
        "one may (raise --max-batch, or set train.max_memory_mb to search under a cap); "
        "recommended train.batch_per_gpu: %d%s\n",
        max_batch, good, format_bytes(good_peak).c_str(), chosen, divides.c_str());
  } else {
    std::printf("largest batch that fits: %d (peak %s); recommended train.batch_per_gpu: %d%s\n",
                good, format_bytes(good_peak).c_str(), chosen, divides.c_str());
  }
  finalize_world();
  return 0;
}

}  // namespace kiln::launch
