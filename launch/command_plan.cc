// kiln plan --config FILE --world-size N [--memory-mb M] [--json]: the per-GPU memory of an
// experiment for each ZeRO stage and recomputation setting, what fits under M MiB, and the
// largest batch that does (train/memory_plan.h; docs/memory.md).

#include <boost/program_options.hpp>

#include <cstdio>
#include <iostream>

#include "comm/world.h"
#include "configs/experiment.h"
#include "core/check.h"
#include "core/device.h"
#include "core/json_writer.h"
#include "launch/commands.h"
#include "train/memory_plan.h"

namespace po = boost::program_options;

namespace kiln::launch {
namespace {

double mib(double bytes) {
  return bytes / 1048576.0;
}

void print_table(const train::MemoryPlan& plan, const std::string& path) {
  std::printf(
      "kiln plan: %s, %lld parameters, %d GPU%s; activations and workspaces measured on %s at "
      "batch %d and %d\n",
      path.c_str(), static_cast<long long>(plan.parameters), plan.world_size,
      plan.world_size == 1 ? "" : "s", plan.device.c_str(), plan.probe_batches.at(0),
      plan.probe_batches.at(1));
  std::printf("per GPU, MiB (total at train.batch_per_gpu %d", plan.batch);
  if (plan.limit > 0) std::printf("; limit %.0f MiB", mib(plan.limit));
  std::printf(")\n");
  std::printf("%-5s %-9s %9s %9s %9s %9s %12s %10s %8s %10s %-13s %s\n", "zero", "recompute",
              "weights", "grads", "master", "moments", "act/sample", "workspace", "nccl", "total",
              "fits", "largest batch");
  for (const train::MemoryEstimate& m : plan.estimates) {
    const char* fits = plan.limit <= 0                     ? "-"
                       : m.total(plan.batch) <= plan.limit ? "fits"
                                                           : "does not fit";
    std::string largest = plan.limit <= 0 ? "-" : std::to_string(m.largest_batch(plan.limit));
    std::printf("%-5d %-9s %9.1f %9.1f %9.1f %9.1f %12.2f %10.1f %8.1f %10.1f %-13s %s\n",
                m.zero_stage, m.recompute ? "BLOCKS" : "NONE", mib(m.weights), mib(m.gradients),
                mib(m.master), mib(m.moments), mib(m.activations_per_sample), mib(m.workspaces),
                mib(m.nccl), mib(m.total(plan.batch)), fits, largest.c_str());
  }
  if (plan.limit > 0) {
    // The first that fits: the least sharding, and without recomputation before with.
    const train::MemoryEstimate* best = nullptr;
    for (const train::MemoryEstimate& m : plan.estimates) {
      if (m.largest_batch(plan.limit) >= plan.batch) {
        best = &m;
        break;
      }
    }
    if (best != nullptr) {
      std::printf("batch %d fits with parallel.zero_stage %d, train.recompute %s\n", plan.batch,
                  best->zero_stage, best->recompute ? "BLOCKS" : "NONE");
    } else {
      std::printf("batch %d fits in no combination: lower train.batch_per_gpu (largest above)\n",
                  plan.batch);
    }
  }
}

void print_json(const train::MemoryPlan& plan, const std::string& path) {
  JsonWriter j;
  j.begin_object();
  j.field("config", path);
  j.field("parameters", static_cast<long long>(plan.parameters));
  j.field("world_size", plan.world_size);
  j.field("batch_per_gpu", plan.batch);
  j.field("memory_mb", plan.limit > 0 ? mib(plan.limit) : 0.0);
  j.field("measured_on", plan.device);
  j.key("probe_batches");
  j.begin_array();
  for (int b : plan.probe_batches) j.value(b);
  j.end_array();
  j.key("plans");
  j.begin_array();
  for (const train::MemoryEstimate& m : plan.estimates) {
    j.begin_object();
    j.field("zero_stage", m.zero_stage);
    j.field("recompute", m.recompute ? "BLOCKS" : "NONE");
    j.field("weights_mb", mib(m.weights));
    j.field("gradients_mb", mib(m.gradients));
    j.field("master_mb", mib(m.master));
    j.field("moments_mb", mib(m.moments));
    j.field("activations_per_sample_mb", mib(m.activations_per_sample));
    j.field("workspaces_mb", mib(m.workspaces));
    j.field("nccl_mb", mib(m.nccl));
    j.field("total_mb", mib(m.total(plan.batch)));
    if (plan.limit > 0) {
      j.field("fits", m.total(plan.batch) <= plan.limit);
      j.field("largest_batch", static_cast<long long>(m.largest_batch(plan.limit)));
    }
    j.end_object();
  }
  j.end_array();
  j.end_object();
  std::printf("%s\n", j.str().c_str());
}

}  // namespace

int run_plan(const Arguments& args) {
  po::options_description options("kiln plan: per-GPU memory for each ZeRO stage and recompute");
  options.add_options()("help,h", "show this help")("config", po::value<std::string>()->required(),
                                                    "experiment file")(
      "set", po::value<std::vector<std::string>>()->composing(), "override a field")(
      "world-size", po::value<int>()->required(), "number of GPUs (ranks) the run will use")(
      "memory-mb", po::value<double>(),
      "memory per GPU in MiB (default: train.max_memory_mb when set)")(
      "json", "print JSON instead of the table");
  po::variables_map vm;
  po::store(po::command_line_parser(args).options(options).run(), vm);
  if (vm.count("help")) {
    std::cout << "usage: kiln plan --config FILE --world-size N [--memory-mb M] [--set ...] "
                 "[--json] (one process, no mpirun)\n\n"
              << options << "\n";
    return 0;
  }
  po::notify(vm);
  const int world_size = vm["world-size"].as<int>();
  if (world_size < 1)
    throw InputError("--world-size must be at least 1, got " + std::to_string(world_size));
  if (vm.count("memory-mb") && !(vm["memory-mb"].as<double>() > 0))
    throw InputError("--memory-mb must be positive");
  const World& world = init_world();
  if (world.size != 1) throw InputError("kiln plan runs as one process: start it without mpirun");
  std::vector<std::string> overrides;
  if (vm.count("set")) overrides = vm["set"].as<std::vector<std::string>>();
  const std::string path = vm["config"].as<std::string>();
  config::Experiment e = config::load_experiment(path, overrides);
  config::validate(e, {1, cuda_device_count() > 0, path, overrides});
  double limit = 0;
  if (vm.count("memory-mb"))
    limit = vm["memory-mb"].as<double>() * 1048576.0;
  else if (e.train().max_memory_mb() > 0)
    limit = static_cast<double>(e.train().max_memory_mb()) * 1048576.0;
  train::MemoryPlan plan = train::plan_memory(e, world_size, limit, world);
  if (vm.count("json"))
    print_json(plan, path);
  else
    print_table(plan, path);
  finalize_world();
  return 0;
}

}  // namespace kiln::launch
