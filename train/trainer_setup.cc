// Trainer's construction: the experiment translated into each part's options (run_setup.h), and
// the parts built in the order their dependencies need.

#include <algorithm>
#include <filesystem>

#include "core/allocator.h"
#include "core/system_info.h"
#include "data/factory.h"
#include "train/init_from.h"
#include "train/model_options.h"
#include "train/run_setup.h"
#include "train/trainer_state.h"

namespace kiln::train {
namespace {

// precision.fp8 on a GPU without FP8 tensor cores (compute capability below 8.9) is refused.
void require_fp8_tensor_cores(Device device) {
  for (const GpuInfo& gpu : collect_system_info().gpus) {
    if (gpu.index != device.index || gpu.compute_major * 10 + gpu.compute_minor >= 89) continue;
    throw InputError("precision.fp8.enabled: GPU " + std::to_string(gpu.index) + " (" + gpu.name +
                     ") has compute capability " + std::to_string(gpu.compute_major) + "." +
                     std::to_string(gpu.compute_minor) +
                     "; FP8 tensor cores need 8.9 or newer (RTX 4090, L40, H100, H200). Turn "
                     "precision.fp8 off on this GPU");
  }
}

// Deterministic fp32 initialisation on the host (or model.init_from), before any device copy.
void initialise_model(Trainer::State& s) {
  s.model = make_model(model_options_from(s.e));
  s.model.net->reset_parameters(s.e.train().seed());
  // Nothing consumes the gradient of the model's input: its first layer may skip computing it.
  for (Layer* first = s.model.net.get(); first != nullptr;) {
    first->set_input_gradient(false);
    auto children = first->children();
    first = children.empty() ? nullptr : children.front();
  }
  load_init_from(s.e.model(), *s.model.net);
  s.loss_stage = make_loss_stage(s.model, s.loss_fn, s.e.train().lm_head_chunks());
}

// --resume, or checkpoint.resume when it is not given: a run that continues its directory's run.
// ZeRO-3: the trained weights stay on the host, cast, until DataParallel takes them to the device
// a bucket at a time, and get no gradients before backward allocates them: a rank never holds the
// whole model on the device (7B: 15 GB of bf16 weights and as much again of gradients). Buffers
// and frozen weights go to the device as model.to() takes them.
void place_for_weight_sharding(Layer& net, const std::vector<Parameter*>& trained, Device device,
                               DType parameter_dtype) {
  net.to(Device::cpu(), parameter_dtype);
  for (Buffer* b : net.buffers()) b->value = b->value.to(device, b->value.dtype());
  for (Parameter* p : net.parameters()) {
    if (std::find(trained.begin(), trained.end(), p) != trained.end()) {
      p->grad = Tensor();
    } else {
      p->value = p->value.to(device, p->value.dtype());
    }
  }
}

bool resumes(const Trainer::State& s) {
  return !(s.options.resume.empty() ? s.e.checkpoint().resume() : s.options.resume).empty();
}

MetricsSinkOptions metrics_options(const Trainer::State& s) {
  MetricsSinkOptions sink;
  // kiln eval only reads: no logging.dir, no metrics.jsonl (an empty one there would make a later
  // fresh kiln train in that directory refuse it as another run's).
  sink.active = s.rank0() && !s.options.evaluate_only;
  sink.print = !s.options.quiet;
  sink.progress = progress_bar_wanted(s.e.logging(), s.world);
  sink.dir = s.e.logging().dir();
  sink.jsonl = s.e.logging().jsonl();
  sink.tensorboard = s.e.logging().tensorboard();
  sink.append = resumes(s);
  sink.total_steps = s.total_steps;
  sink.device = s.device;
  return sink;
}

// train.epochs: the steps are known once the dataset is (validate() checks train.steps). The same
// rule and words on every rank, reported once (a ConfigError), before any step.
void check_warmup_fits(const Trainer::State& s) {
  const std::int64_t warmup = s.e.schedule().warmup_steps();
  if (s.e.train().has_steps() || warmup <= 0 || warmup < s.total_steps) return;
  char epochs[32];
  std::snprintf(epochs, sizeof(epochs), "%g", s.e.train().epochs());
  throw config::ConfigError(
      "schedule.warmup_steps = " + std::to_string(warmup) + ": must be less than the " +
      std::to_string(s.total_steps) + " optimizer steps train.epochs = " + epochs + " makes (" +
      std::to_string(s.loader->batches_per_epoch()) + " batches per epoch, " +
      std::to_string(s.plan.accumulation) +
      " per step); lower schedule.warmup_steps, raise train.epochs, or set train.steps");
}

// The run's experiment beside its metrics (kiln train, rank 0): the effective one, every default
// filled and every --set applied, written atomically when the run begins. A resumed run keeps the
// one its first start wrote (the hyper-parameters of the run's start) and says when its own
// differs.
void record_experiment(const Trainer::State& s) {
  if (!s.rank0() || !s.options.lock_directories || s.options.evaluate_only) return;
  const std::string path = s.e.logging().dir() + "/experiment.pbtxt";
  const std::string text = config::to_effective_text(s.e);
  std::error_code error;
  if (resumes(s) && std::filesystem::exists(path, error)) {
    if (read_file(path) != text) {
      s.metrics->print("note: this run's experiment differs from " + path +
                       " (written when the run began; kept as it is)");
    }
    return;
  }
  write_file_atomically(path, text);
}

// The optimizer's step state goes resident outside Eager mode; graphs are captured in Graphed.
void set_up_step(Trainer::State& s) {
  std::string note;
  const StepMode mode = s.options.evaluate_only
                            ? StepMode::Eager
                            : choose_step_mode(s.e, s.device.is_cuda(), s.world.size, &note);
  if (!note.empty()) s.metrics->print(note);
  GraphedStepOptions o;
  o.mode = mode;
  o.world_size = s.world.size;
  o.collective_timeout_s = s.e.parallel().collective_timeout_s();
  o.say = [m = s.metrics.get()](const std::string& line) { m->print(line); };
  o.on_capture_failed = [sync = s.sync.get()] { sync->reset_step(); };
  s.graphs = std::make_unique<GraphedStep>(s.device, o, s.counters.micro_step);
  if (mode != StepMode::Eager) s.optimizer->make_resident(s.counters.step, s.counters.skipped);
}

}  // namespace

Trainer::Trainer(const config::Experiment& experiment, const World& world, TrainerOptions options)
    : s_(std::make_unique<State>()) {
  State& s = *s_;
  s.e = experiment;
  s.world = world;
  s.options = options;
  if (options.lock_directories && world.rank == 0) {
    // Before the checkpoint store removes partial checkpoints or metrics.jsonl is truncated:
    // those belong to the run that holds the lock.
    s.directory_locks = lock_run_directories(
        {{"logging.dir", s.e.logging().dir()}, {"checkpoint.dir", s.e.checkpoint().dir()}});
    if (!resumes(s) && !options.evaluate_only) {
      require_unused_run_directories(s.e.logging().dir(), s.e.checkpoint().dir());
    }
  }
  s.device = choose_device(s.e.train(), world);
  if (s.e.precision().fp8().enabled() && s.device.is_cuda()) require_fp8_tensor_cores(s.device);
  config::fill_device_defaults(s.e, s.device.is_cuda());
  configure_process(s.e, s.device, options.heuristic_algorithms);
  s.faults = FaultInjection::from_environment(world.rank);
  s.plan = config::plan_batches(s.e, world.size);
  CommunicatorOptions comm_options;
  comm_options.timeout_s = s.e.parallel().collective_timeout_s();
  comm_options.backend = comm_backend(s.e.parallel());
  s.comm = make_communicator(world, s.device, comm_options);
  s.comm->check_same_on_all_ranks(config::experiment_hash(s.e),
                                  "the experiment (config file and --set overrides)");

  initialise_model(s);
  // Frozen parameters (LoRA's base) get no gradient, reduction, master copy or optimizer state.
  s.parameters = trainable(s.model.net->parameters());
  NamedTensors fp32_init;
  // The host tensors the model was initialised in, kept (not copied) until the masters start
  // from them: a device copy would add 4 bytes per parameter to the start-up peak (12 GB at 3B).
  for (Parameter* p : s.parameters) fp32_init.emplace_back(p->name, p->value);
  s.precision = precision_for(s.e, s.device);
  s.channels_last_layout = channels_last(s.e.model(), s.device, s.precision.policy);
  const DType parameter_dtype = s.device.is_cpu() && s.precision.parameter_dtype == DType::F32
                                    ? DType::F32
                                    : s.precision.parameter_dtype;
  const bool shards_weights =
      reduces_in_buckets(s.e, world.size) && s.e.parallel().zero_stage() == 3;
  if (shards_weights) {
    place_for_weight_sharding(*s.model.net, s.parameters, s.device, parameter_dtype);
  } else {
    s.model.net->to(s.device, parameter_dtype);
  }
  if (reduces_in_buckets(s.e, world.size)) {
    DataParallelOptions dp = data_parallel_options(s.e);
    std::vector<WeightUnit> units;
    if (dp.zero_stage == 3) {
      units = weight_units(*s.model.net);
      for (const WeightUnit& unit : units)
        dp.units.emplace_back(unit.parameters.begin(), unit.parameters.end());
    }
    s.sync = make_data_parallel_sync(
        std::make_unique<DataParallel>(s.parameters, s.model.net->buffers(), *s.comm, dp),
        std::move(units), s.e.parallel().zero3_gather_once_per_step());
  } else {
    s.sync = make_local_gradients(s.parameters);
  }
  s.fp8_amax =
      make_fp8_amax_reduction(s.model.net->buffers(), model_options_from(s.e).fp8, s.comm.get());

  const std::string kind = dataset_kind(s.e, s.model);
  const data::DatasetOptions dataset = dataset_options(s.e, s.model);
  auto train_set = data::make_dataset(kind, dataset_path(s.e, "train"), "train", dataset);
  std::shared_ptr<data::Dataset> eval_set;
  const std::string& eval_split = s.e.data().eval_split();
  if (eval_split != "none") {
    eval_set = data::make_dataset(kind, dataset_path(s.e, eval_split), eval_split, dataset);
  }
  s.loader =
      std::make_unique<data::DataLoader>(train_set, loader_options(s.e, s.plan, world, s.device));
  s.total_steps = total_steps(s.e.train(), s.loader->batches_per_epoch(), s.plan.accumulation);
  check_warmup_fits(s);
  s.token_average = make_step_token_average(s.e, *train_set, s.device);
  // The optimizer's own tensors (masters, moments) as the allocator counts them: ZeRO divides
  // them by the world size.
  const std::size_t allocated_before = allocator_for(s.device).stats().allocated_bytes;
  s.optimizer = std::make_unique<StepOptimizer>(s.parameters, std::move(fp32_init), s.e,
                                                s.total_steps, s.sync->shard_group());
  const std::size_t allocated_after = allocator_for(s.device).stats().allocated_bytes;
  s.optimizer_bytes = allocated_after > allocated_before ? allocated_after - allocated_before : 0;
  Shape input = s.model.sample_shape;
  input.insert(input.begin(), 1);
  s.flops_per_sample = 3.0 * s.model.net->forward_flops(input);
  s.peak_flops = s.device.is_cuda() ? dense_half_peak_flops(s.device.index) : 0;
  if (s.model.input_dtype == DType::I64 && !s.model.sample_shape.empty()) {
    s.tokens_per_sample = static_cast<double>(s.model.sample_shape.at(0));
  }

  s.metrics = std::make_unique<MetricsSink>(metrics_options(s));
  // Which folder or files each split reads (a jpeg_folder's train/ and val/, say).
  s.metrics->print("data train: " + train_set->describe());
  if (eval_set) s.metrics->print("data " + eval_split + ": " + eval_set->describe());
  if (!s.loader->image_decoding().empty()) {
    s.metrics->print("images decoded " + s.loader->image_decoding());
  }
  record_experiment(s);
  CheckpointerOptions checkpointing =
      checkpointer_options(s.e, options.resume, options.evaluate_only, s.total_steps);
  checkpointing.resume_flag = options.resume_flag;
  checkpointing.init_from_fallback = options.init_from_fallback;
  checkpointing.init_from = s.e.model().init_from();
  s.checkpointer = std::make_unique<Checkpointer>(
      checkpointing, Checkpointer::Parts{s.e, s.world, *s.comm, *s.model.net, *s.optimizer, *s.sync,
                                         *s.loader, *s.metrics, s.counters, s.plan.global});
  s.evaluator = std::make_unique<Evaluator>(
      evaluator_options(s.e, s.total_steps),
      Evaluator::Parts{s.world, *s.comm, *s.model.net, *s.sync, *s.loader, *s.metrics},
      std::move(eval_set), s.make_context(false));
  s.checkpointer->resume();
  set_up_step(s);
}

Trainer::~Trainer() = default;

std::string Trainer::weights_source() const {
  const std::string& restored = s_->checkpointer->restored_from();
  if (!restored.empty()) return restored;
  const std::string& init_from = s_->e.model().init_from();
  return init_from.empty() ? "" : "model.init_from " + init_from;
}

}  // namespace kiln::train
