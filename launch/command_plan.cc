// kiln plan --config FILE --world-size N [--memory-mb M] [--json]: the per-GPU memory of an
// experiment for each ZeRO stage and recomputation setting, what fits under M MiB, and the
// largest batch that does (train/memory_plan.h; docs/memory.md).

#include <boost/program_options.hpp>

#include <algorithm>
#include <cmath>
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

constexpr double kMaxMemoryMb = 1024.0 * 1024 * 1024;  // 1 PiB per GPU

double mib(double bytes) {
  return bytes / 1048576.0;
}

const char* recompute_name(const train::MemoryEstimate& m) {
  return m.recompute ? "BLOCKS" : m.keep_all ? "KEEP_ALL" : "NONE";
}

// Whether `m` fits the experiment's batch under the limit: "fits", "does not fit", or "-" (no
// limit) and "?" (nothing measured, and the counted parts alone fit).
// "OPTIMIZER" or "OPTIMIZER_AND_WEIGHTS" for a row that offloads, else "".
std::string offload_name(const train::MemoryEstimate& m) {
  if (!m.offload) return "";
  return m.offload_weights ? "OPTIMIZER_AND_WEIGHTS" : "OPTIMIZER";
}

// ", train.offload OPTIMIZER" for a row that offloads, else nothing.
std::string offload_words(const train::MemoryEstimate& m) {
  return m.offload ? ", train.offload " + offload_name(m) : "";
}

const char* fits_word(const train::MemoryPlan& plan, const train::MemoryEstimate& m) {
  if (plan.limit <= 0) return "-";
  if (!plan.fits(m, plan.measured ? plan.batch : 0)) return "does not fit";
  return plan.measured ? "fits" : "?";
}

// The verdict under a limit, and the exit code: 0 when the experiment's batch fits some
// combination (or nothing can be judged), 1 when it fits none (what to change is named).
struct Verdict {
  std::string line;
  int code = 0;
};

Verdict verdict(const train::MemoryPlan& plan) {
  Verdict v;
  if (plan.limit <= 0) return v;
  const std::string limit = std::to_string(static_cast<long long>(mib(plan.limit))) + " MiB";
  const std::string gpus =
      std::to_string(plan.world_size) + " GPU" + (plan.world_size == 1 ? "" : "s");
  // The least memory a sample can take: the last row shards most and recomputes.
  const train::MemoryEstimate& leanest = plan.estimates.back();
  const std::string change =
      "raise --memory-mb (a GPU with more memory), shard over more GPUs (--world-size with "
      "parallel.zero_stage 3), use half precision (precision.opt_level O2), or shrink the model "
      "(model.*)";
  if (!plan.measured) {
    if (leanest.total(0) > plan.limit) {
      v.code = 1;
      v.line = "nothing fits under " + limit +
               ": the weights, gradients and optimizer state alone "
               "need " +
               std::to_string(static_cast<long long>(mib(leanest.total(0)))) +
               " MiB with parallel.zero_stage " + std::to_string(leanest.zero_stage) + " on " +
               gpus + "; " + change;
    } else {
      v.line = "activations not measured (no " + plan.device +
               " here, train.device CUDA): run kiln plan where the GPU is for the largest batch";
    }
    return v;
  }
  const train::MemoryEstimate* best = nullptr;  // the least sharding, no recompute first
  const train::MemoryEstimate* largest = nullptr;
  for (const train::MemoryEstimate& m : plan.estimates) {
    if (best == nullptr && plan.fits(m, plan.batch)) best = &m;
    if (largest == nullptr || plan.usable_batch(m) > plan.usable_batch(*largest)) largest = &m;
  }
  if (best != nullptr) {
    v.line = "batch " + std::to_string(plan.batch) + " fits with parallel.zero_stage " +
             std::to_string(best->zero_stage) + ", train.recompute " + recompute_name(*best) +
             offload_words(*best);
    return v;
  }
  v.code = 1;
  const std::int64_t usable = plan.usable_batch(*largest);
  if (usable == 0) {
    v.line = "nothing fits under " + limit + " on " + gpus +
             ": even batch 1 needs more in every combination (" +
             std::to_string(static_cast<long long>(mib(leanest.total(1)))) +
             " MiB with parallel.zero_stage " + std::to_string(leanest.zero_stage) +
             ", train.recompute BLOCKS); " + change;
    return v;
  }
  v.line = "batch " + std::to_string(plan.batch) + " fits in no combination: lower " +
           "train.batch_per_gpu to " + std::to_string(usable) + " (the largest that fits" +
           (plan.global_batch > 0
                ? " and divides train.global_batch " + std::to_string(plan.global_batch) + " / " +
                      std::to_string(plan.world_size) + " ranks"
                : std::string()) +
           ", with parallel.zero_stage " + std::to_string(largest->zero_stage) +
           ", train.recompute " + recompute_name(*largest) + offload_words(*largest) + ")";
  return v;
}

void print_table(const train::MemoryPlan& plan, const std::string& path) {
  std::printf("kiln plan: %s, %lld parameters, %d GPU%s; ", path.c_str(),
              static_cast<long long>(plan.parameters), plan.world_size,
              plan.world_size == 1 ? "" : "s");
  if (plan.measured) {
    std::printf("activations and workspaces measured on %s at batch %d and %d\n",
                plan.device.c_str(), plan.probe_batches.at(0), plan.probe_batches.at(1));
  } else {
    std::printf("counted only: no %s here to measure activations and workspaces on\n",
                plan.device.c_str());
  }
  std::printf("per GPU, MiB (total at train.batch_per_gpu %d%s", plan.batch,
              plan.measured ? "" : ", without activations and workspaces");
  if (plan.limit > 0) std::printf("; limit %.0f MiB", mib(plan.limit));
  if (plan.global_batch > 0) {
    std::printf("; largest batch divides train.global_batch %lld / %d",
                static_cast<long long>(plan.global_batch), plan.world_size);
  }
  std::printf(")\n");
  std::printf("%-5s %-9s %9s %9s %9s %9s %12s %10s %8s %10s %-13s %s\n", "zero", "recompute",
              "weights", "grads", "master", "moments", "act/sample", "workspace", "nccl", "total",
              "fits", "largest batch");
  for (const train::MemoryEstimate& m : plan.estimates) {
    const std::string largest =
        plan.limit <= 0 || !plan.measured ? "-" : std::to_string(plan.usable_batch(m));
    char activations[32] = "-", workspaces[32] = "-";
    if (plan.measured) {
      std::snprintf(activations, sizeof(activations), "%.2f", mib(m.activations_per_sample));
      std::snprintf(workspaces, sizeof(workspaces), "%.1f", mib(m.workspaces));
    }
    std::printf("%-5d %-9s %9.1f %9.1f %9.1f %9.1f %12s %10s %8.1f %10.1f %-13s %s%s\n",
                m.zero_stage, recompute_name(m), mib(m.weights), mib(m.gradients), mib(m.master),
                mib(m.moments), activations, workspaces, mib(m.nccl),
                mib(m.total(plan.measured ? plan.batch : 0)), fits_word(plan, m), largest.c_str(),
                m.offload ? ("  (train.offload " + offload_name(m) + ")").c_str() : "");
  }
  std::string per_stage;  // the host's share per rank of the offload rows, by ZeRO stage
  for (const train::MemoryEstimate& m : plan.estimates) {
    if (!m.offload || m.recompute) continue;
    char part[96];
    std::snprintf(part, sizeof part, "%s%.1f MiB with stage %d%s", per_stage.empty() ? "" : ", ",
                  mib(m.host), m.zero_stage, m.offload_weights ? " and the weights" : "");
    per_stage += part;
  }
  if (!per_stage.empty()) {
    std::printf(
        "train.offload: pinned host memory per rank (masters, moments; HOST_CORES adds twins of "
        "the weights and gradients, OPTIMIZER_AND_WEIGHTS their shards): %s",
        per_stage.c_str());
    if (plan.host_limit > 0) {
      std::printf("; %d rank%s per node under --host-memory-mb %.0f", plan.gpus_per_node,
                  plan.gpus_per_node == 1 ? "" : "s", mib(plan.host_limit));
    }
    std::printf("\n");
  }
  const Verdict v = verdict(plan);
  if (!v.line.empty()) std::printf("%s\n", v.line.c_str());
}

void print_json(const train::MemoryPlan& plan, const std::string& path) {
  JsonWriter j;
  j.begin_object();
  j.field("config", path);
  j.field("parameters", static_cast<long long>(plan.parameters));
  j.field("world_size", plan.world_size);
  j.field("batch_per_gpu", plan.batch);
  j.field("memory_mb", plan.limit > 0 ? mib(plan.limit) : 0.0);
  j.field("host_memory_mb", plan.host_limit > 0 ? mib(plan.host_limit) : 0.0);
  j.field("gpus_per_node", plan.gpus_per_node);
  j.field("measured", plan.measured);
  j.field("measured_on", plan.measured ? plan.device : std::string());
  j.key("probe_batches");
  j.begin_array();
  for (int b : plan.probe_batches) j.value(b);
  j.end_array();
  j.key("plans");
  j.begin_array();
  for (const train::MemoryEstimate& m : plan.estimates) {
    j.begin_object();
    j.field("zero_stage", m.zero_stage);
    j.field("recompute", recompute_name(m));
    j.field("weights_mb", mib(m.weights));
    j.field("gradients_mb", mib(m.gradients));
    j.field("master_mb", mib(m.master));
    j.field("moments_mb", mib(m.moments));
    if (plan.measured) {
      j.field("activations_per_sample_mb", mib(m.activations_per_sample));
      j.field("workspaces_mb", mib(m.workspaces));
    }
    j.field("nccl_mb", mib(m.nccl));
    j.field("offload", m.offload);
    j.field("offload_weights", m.offload_weights);
    j.field("host_mb", mib(m.host));
    j.field("total_mb", mib(m.total(plan.measured ? plan.batch : 0)));
    if (plan.limit > 0 && plan.measured) {
      j.field("fits", plan.fits(m, plan.batch));
      j.field("largest_batch", static_cast<long long>(plan.usable_batch(m)));
    }
    j.end_object();
  }
  j.end_array();
  const Verdict v = verdict(plan);
  j.field("verdict", v.line);
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
      "host-memory-mb", po::value<double>(),
      "host memory per node in MiB: adds the rows with train.offload OPTIMIZER, which fit when "
      "every rank's pinned share does")("gpus-per-node", po::value<int>(),
                                        "ranks per node sharing its host memory (default: "
                                        "the world size, at most 8)")(
      "json", "print JSON instead of the table");
  po::variables_map vm;
  po::store(po::command_line_parser(args).options(options).run(), vm);
  if (vm.count("help")) {
    std::cout
        << "usage: kiln plan --config FILE --world-size N [--memory-mb M] [--host-memory-mb H] "
           "[--gpus-per-node G] [--set ...] "
           "[--json] (one process, no mpirun)\n\n"
        << options << "\n";
    return 0;
  }
  po::notify(vm);
  const int world_size = vm["world-size"].as<int>();
  if (world_size < 1)
    throw InputError("--world-size must be at least 1, got " + std::to_string(world_size));
  for (const char* flag : {"memory-mb", "host-memory-mb"}) {
    if (!vm.count(flag)) continue;
    // inf or nan would make every batch fit (and the largest overflow): a number of MiB only.
    const double mb = vm[flag].as<double>();
    if (!(mb > 0)) throw InputError(std::string("--") + flag + " must be positive");
    if (!std::isfinite(mb) || mb > kMaxMemoryMb) {
      char given[32];
      std::snprintf(given, sizeof(given), "%g", mb);
      throw InputError(std::string("--") + flag + " " + given +
                       ": must be a finite number of MiB, at most " +
                       std::to_string(static_cast<long long>(kMaxMemoryMb)) + " (1 PiB)");
    }
  }
  const World& world = init_world();
  if (world.size != 1) throw InputError("kiln plan runs as one process: start it without mpirun");
  std::vector<std::string> overrides;
  if (vm.count("set")) overrides = vm["set"].as<std::vector<std::string>>();
  const std::string path = vm["config"].as<std::string>();
  config::Experiment e = config::load_experiment(path, overrides);
  // As kiln config: a login node without the GPU plans the GPU job it will submit, from the
  // counted parts; the measured ones need the device train.device names.
  config::ValidationContext context{world_size, cuda_device_count() > 0, path, overrides};
  context.assume_named_device = true;
  config::validate(e, context);
  const bool measurable =
      e.train().device() != config::TrainConfig::CUDA || cuda_device_count() > 0;
  double limit = 0;
  if (vm.count("memory-mb"))
    limit = vm["memory-mb"].as<double>() * 1048576.0;
  else if (e.train().max_memory_mb() > 0)
    limit = static_cast<double>(e.train().max_memory_mb()) * 1048576.0;
  train::MemoryPlan plan = train::plan_memory(e, world_size, limit, world, measurable);
  plan.gpus_per_node = std::min(world_size, 8);
  if (vm.count("gpus-per-node")) {
    plan.gpus_per_node = vm["gpus-per-node"].as<int>();
    if (plan.gpus_per_node < 1 || plan.gpus_per_node > world_size) {
      throw InputError("--gpus-per-node must be between 1 and --world-size " +
                       std::to_string(world_size) + ", got " + std::to_string(plan.gpus_per_node));
    }
  }
  if (vm.count("host-memory-mb")) {
    plan.host_limit = vm["host-memory-mb"].as<double>() * 1048576.0;
    train::add_offload_rows(e, &plan);
  }
  if (!measurable) plan.device = "GPU";
  if (vm.count("json"))
    print_json(plan, path);
  else
    print_table(plan, path);
  finalize_world();
  return verdict(plan).code;
}

}  // namespace kiln::launch
