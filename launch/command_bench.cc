// kiln bench --model M --batch B --amp O1|O2 [--half fp16|bf16] [--steps N] [--json] [--profile]:
// training throughput on synthetic data (AdamW), median step time from CUDA events.

#include <boost/program_options.hpp>

#include <algorithm>
#include <cstdio>
#include <iostream>

#include "comm/world.h"
#include "configs/experiment.h"
#include "core/check.h"
#include "core/device.h"
#include "core/json_writer.h"
#include "core/system_info.h"
#include "launch/commands.h"
#include "launch/run_ranks.h"
#include "train/trainer.h"

namespace po = boost::program_options;

namespace kiln::launch {

int run_bench(const Arguments& args) {
  po::options_description options("kiln bench: training throughput on synthetic data");
  options.add_options()("help,h", "show this help")("model", po::value<std::string>()->required(),
                                                    "resnet50, bert_base, vit_b16, ...")(
      "batch", po::value<int>()->required(), "samples per GPU")(
      "amp", po::value<std::string>()->default_value("O2"), "O0, O1, O2 or O3")(
      "half", po::value<std::string>()->default_value("fp16"), "fp16 or bf16")(
      "steps", po::value<int>()->default_value(30), "timed steps")(
      "warmup", po::value<int>()->default_value(10), "untimed steps first")(
      "optimizer", po::value<std::string>()->default_value("adamw"), "adamw, lamb or sgd")(
      "device", po::value<std::string>()->default_value("auto"), "auto, cpu or cuda")(
      "set", po::value<std::vector<std::string>>()->composing(), "any experiment field")(
      "profile", "forward and backward time per layer")("json", "print JSON");
  po::variables_map vm;
  po::store(po::command_line_parser(args).options(options).run(), vm);
  if (vm.count("help")) {
    std::cout
        << "usage: kiln bench --model M --batch B [--amp O2] [--half fp16] [--steps N] [--json]\n"
           "       mpirun -np N kiln bench ...   (per-GPU and total figures)\n\n"
        << options << "\n";
    return 0;
  }
  po::notify(vm);
  return run_on_all_ranks("bench", [&](const World& world) {
    std::string amp = vm["amp"].as<std::string>(), half = vm["half"].as<std::string>();
    std::string device = vm["device"].as<std::string>();
    std::string optimizer = vm["optimizer"].as<std::string>();
    int steps = vm["steps"].as<int>(), warmup = vm["warmup"].as<int>();
    std::vector<std::string> overrides = {
        "model.name=" + vm["model"].as<std::string>(),
        "data.kind=SYNTHETIC",
        "data.workers=4",  // synthetic 224x224 images are generated on the host
        "train.batch_per_gpu=" + std::to_string(vm["batch"].as<int>()),
        "train.steps=" + std::to_string(steps + warmup),
        "train.device=" + device,
        "precision.opt_level=" + amp,
        "precision.half=" + half,
        "optimizer.kind=" + optimizer,
        "data.eval_split=none",
        "logging.dir=/tmp/kiln-bench",  // the same on every rank: the experiment hash must agree
        "logging.jsonl=false",
    };
    // The models made for Fashion-MNIST take its 28x28 greyscale images, not the schema's
    // ImageNet-sized default (224x224x3); --set model.image_size=... still wins.
    const std::string model_name = vm["model"].as<std::string>();
    if (model_name == "fashion_cnn" || model_name == "mlp") {
      for (const char* o :
           {"model.image_size=28", "model.image_channels=1", "model.num_classes=10"})
        overrides.push_back(o);
    }
    if (vm.count("set")) {
      for (const auto& o : vm["set"].as<std::vector<std::string>>()) overrides.push_back(o);
    }
    config::Experiment e;
    for (const auto& o : overrides) config::apply_override(e, o);
    config::fill_defaults(e);
    config::validate(e, {world.size, cuda_device_count() > 0, "", overrides});
    // What the step computes in: O0 is fp32 whatever --half says.
    const std::string precision =
        e.precision().opt_level() == config::PrecisionConfig::O0
            ? "fp32"
            : (e.precision().half() == config::PrecisionConfig::BF16 ? "bf16" : "fp16");
    std::string input;
    const std::string& name = e.model().name();
    if (e.model().has_image_size() && !config::is_causal_lm(name) && name != "bert_base") {
      input = std::to_string(e.model().image_channels()) + "x" +
              std::to_string(e.model().image_size()) + "x" +
              std::to_string(e.model().image_size()) + " images";
    } else {
      const int seq_len = config::is_gpt_model(name)     ? e.model().gpt().seq_len()
                          : config::is_llama_model(name) ? e.model().llama().seq_len()
                                                         : e.model().bert().seq_len();
      input = std::to_string(seq_len) + " tokens";
    }
    train::TrainerOptions to;
    to.quiet = true;
    train::Trainer trainer(e, world, to);
    train::BenchResult r = trainer.benchmark(warmup, steps, vm.count("profile") > 0);
    if (world.rank == 0) {
      SystemInfo info = collect_system_info();
      std::string gpu = info.gpus.empty() ? "cpu" : info.gpus[0].name;
      if (vm.count("json")) {
        JsonWriter j;
        j.begin_object();
        j.field("model", vm["model"].as<std::string>());
        j.field("batch_per_gpu", vm["batch"].as<int>());
        j.field("amp", amp);
        j.field("half", precision == "fp32" ? std::string("none") : precision);
        j.field("precision", precision);
        j.field("fp8", e.precision().fp8().enabled());
        j.field("input", input);
        j.field("gpus", world.size);
        j.field("device", gpu);
        j.field("median_step_ms", r.median_ms);
        j.field("samples_per_s", r.samples_per_s);
        j.field("samples_per_s_per_gpu", r.samples_per_s / world.size);
        j.field("gflop_per_step_per_gpu", r.flops_per_sample * vm["batch"].as<int>() / 1e9);
        j.field("tflops_per_gpu", r.tflops_per_gpu);
        j.field("mfu", r.mfu);
        j.field("peak_allocated_bytes", static_cast<double>(r.peak_allocated_bytes));
        j.field("graph_pool_bytes", static_cast<double>(r.graph_pool_bytes));
        j.field("peak_reserved_bytes", static_cast<double>(r.peak_reserved_bytes));
        j.field("fragmentation", r.fragmentation);
        j.field("raw_allocations_in_timed_steps",
                static_cast<double>(r.raw_allocations_in_timed_steps));
        j.field("data_wait_fraction", r.data_wait_fraction);
        j.field("graph", r.graph);
        j.field("host_ms_per_step", r.host_ms_per_step);
        j.field("gemms_counted", static_cast<double>(r.gemms.gemms));
        j.field("fp8_gemm_flop_share", r.gemms.fp8_flop_share());
        if (r.gemms_timed) {
          j.field("gemm_ms_per_step", r.gemms.ms / std::max(steps, 1));
          j.field("fp8_gemm_time_share", r.gemms.fp8_time_share());
        }
        auto layer_times = [&j](const char* key, const char* name_key,
                                const std::vector<train::LayerTime>& times) {
          j.key(key);
          j.begin_array();
          for (const auto& l : times) {
            j.begin_object();
            j.field(name_key, l.layer);
            j.field("forward_ms", l.forward_ms);
            j.field("backward_ms", l.backward_ms);
            if (l.host_forward_ms > 0 || l.host_backward_ms > 0) {
              j.field("host_forward_ms", l.host_forward_ms);
              j.field("host_backward_ms", l.host_backward_ms);
            }
            j.end_object();
          }
          j.end_array();
        };
        layer_times("layers", "layer", r.layers);
        layer_times("layer_types", "type", r.layer_types);
        if (r.exposed_comm_ms >= 0) j.field("exposed_comm_ms", r.exposed_comm_ms);
        if (!r.comm_timeline.buckets.empty()) {
          j.field("backward_end_ms", r.comm_timeline.backward_end_ms);
          j.field("reduced_ms", r.comm_timeline.reduced_ms);
          j.key("buckets");
          j.begin_array();
          for (std::size_t i = 0; i < r.comm_timeline.buckets.size(); ++i) {
            const auto& b = r.comm_timeline.buckets[i];
            j.begin_object();
            j.field("bucket", static_cast<int>(i));
            j.field("bytes", static_cast<double>(r.bucket_bytes[i]));
            j.field("ready_ms", b.ready_ms);
            j.field("start_ms", b.start_ms);
            j.field("end_ms", b.end_ms);
            j.end_object();
          }
          j.end_array();
        }
        j.end_object();
        std::printf("%s\n", j.str().c_str());
      } else {
        std::printf("%s batch %d/GPU x %d GPU(s) of %s, %s %s on %s\n",
                    vm["model"].as<std::string>().c_str(), vm["batch"].as<int>(), world.size,
                    input.c_str(), amp.c_str(), precision.c_str(), gpu.c_str());
        std::printf("  median step %.2f ms over %d steps; %.1f samples/s total, %.1f per GPU\n",
                    r.median_ms, steps, r.samples_per_s, r.samples_per_s / world.size);
        std::printf("  %.1f TFLOP/s per GPU (%.1f GFLOP/sample), MFU %.1f%%\n", r.tflops_per_gpu,
                    r.flops_per_sample / 1e9, 100 * r.mfu);
        std::printf(
            "  peak memory %.2f GiB in use (%.2f GiB of it the CUDA graphs' pool), %.2f GiB "
            "reserved, fragmentation %.1f%%; %llu device allocations in timed steps; data wait "
            "%.2f%%\n",
            r.peak_allocated_bytes / 1073741824.0, r.graph_pool_bytes / 1073741824.0,
            r.peak_reserved_bytes / 1073741824.0, 100 * r.fragmentation,
            static_cast<unsigned long long>(r.raw_allocations_in_timed_steps),
            100 * r.data_wait_fraction);
        std::printf("  %s; host %.3f ms per step\n",
                    r.graph ? "CUDA graph (train.cuda_graphs)" : "eager (no CUDA graph)",
                    r.host_ms_per_step);
        if (r.gemms.fp8_gemms > 0) {
          std::printf("  FP8: %.1f%% of the GEMMs' FLOPs", 100 * r.gemms.fp8_flop_share());
          if (r.gemms_timed) {
            std::printf(", %.1f%% of their time (%.3f ms of GEMMs per step)",
                        100 * r.gemms.fp8_time_share(), r.gemms.ms / std::max(steps, 1));
          }
          std::printf("\n");
        }
        if (r.exposed_comm_ms >= 0) {
          std::printf("  exposed communication %.3f ms per step (not hidden behind backward)\n",
                      r.exposed_comm_ms);
        }
        if (!r.comm_timeline.buckets.empty()) {
          std::printf(
              "\n  %-8s %12s %10s %10s %10s   (ms from the step's start; backward ends at "
              "%.3f, gradients reduced at %.3f)\n",
              "bucket", "MiB", "ready", "start", "end", r.comm_timeline.backward_end_ms,
              r.comm_timeline.reduced_ms);
          for (std::size_t i = 0; i < r.comm_timeline.buckets.size(); ++i) {
            const auto& b = r.comm_timeline.buckets[i];
            std::printf("  %-8zu %12.3f %10.3f %10.3f %10.3f\n", i, r.bucket_bytes[i] / 1048576.0,
                        b.ready_ms, b.start_ms, b.end_ms);
          }
        }
        if (!r.layers.empty()) {
          std::printf("\n  %-36s %12s %12s\n", "layer", "forward ms", "backward ms");
          for (const auto& l : r.layers) {
            std::printf("  %-36s %12.3f %12.3f\n", l.layer.c_str(), l.forward_ms, l.backward_ms);
          }
          std::printf("\n  %-36s %12s %12s %8s %12s %12s\n", "leaf layers by type (per step)",
                      "forward ms", "backward ms", "of step", "host fwd ms", "host bwd ms");
          for (const auto& l : r.layer_types) {
            std::printf("  %-36s %12.3f %12.3f %7.1f%% %12.3f %12.3f\n", l.layer.c_str(),
                        l.forward_ms, l.backward_ms,
                        100 * (l.forward_ms + l.backward_ms) / r.median_ms, l.host_forward_ms,
                        l.host_backward_ms);
          }
        }
      }
    }
    return 0;
  });
}

}  // namespace kiln::launch
