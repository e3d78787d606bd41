#include "train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <map>
#include <sstream>
#include <tuple>

#include "comm/communicator.h"
#include "comm/data_parallel.h"
#include "configs/experiment.h"
#include "core/allocator.h"
#include "core/nvml.h"
#include "core/nvtx.h"
#include "core/ops.h"
#include "core/stream.h"
#include "core/system_info.h"
#include "data/factory.h"
#include "data/loader.h"
#include "layers/conv2d.h"
#include "layers/models/model.h"
#include "layers/softmax_cross_entropy.h"
#include "train/checkpoint.h"
#include "train/metrics.h"
#include "train/model_options.h"
#include "train/step_optimizer.h"

namespace kiln::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Dense fp16/bf16 tensor-core peak used for MFU: the datasheet figure of known GPUs.
double peak_flops(Device device) {
  if (!device.is_cuda()) return 0;
  SystemInfo info = collect_system_info();
  for (const GpuInfo& g : info.gpus) {
    if (g.index != device.index) continue;
    if (g.name.find("H200") != std::string::npos || g.name.find("H100") != std::string::npos) {
      return 989e12;
    }
    if (g.name.find("4090") != std::string::npos) return 165e12;
    if (g.name.find("A100") != std::string::npos) return 312e12;
  }
  return 0;
}

std::string data_kind(const config::Experiment& e, const Model& model) {
  switch (e.data().kind()) {
    case config::DataConfig::FASHION_MNIST:
      return "fashion_mnist";
    case config::DataConfig::CIFAR10:
      return "cifar10";
    case config::DataConfig::TOKENS:
      return "tokens_mlm";
    case config::DataConfig::JPEG_FOLDER:
      return "jpeg_folder";
    case config::DataConfig::SYNTHETIC:
      return model.input_dtype == DType::I64 ? "synthetic_tokens" : "synthetic_images";
    default:
      return "?";
  }
}

data::DatasetOptions dataset_options(const config::Experiment& e, const Model& model) {
  data::DatasetOptions o;
  o.seed = e.train().seed();
  o.num_classes = model.num_outputs;
  if (model.input_dtype == DType::I64) {
    o.seq_len = model.sample_shape.at(0);
    o.vocab_size = model.num_outputs;
    o.masking.mask_prob = e.data().mlm_probability();
    o.masking.mask_token_id = 103;  // BERT's [MASK]
  } else if (model.sample_shape.size() == 3) {
    o.channels = static_cast<int>(model.sample_shape[0]);
    o.height = static_cast<int>(model.sample_shape[1]);
    o.width = static_cast<int>(model.sample_shape[2]);
  }
  const config::AugmentationConfig& a = e.data().augmentation();
  bool any_augmentation =
      a.random_crop_padding() > 0 || a.horizontal_flip() || a.normalize_mean_size() > 0;
  if (any_augmentation) {
    data::ImageAugment augment;
    augment.crop_padding = a.random_crop_padding();
    augment.horizontal_flip = a.horizontal_flip();
    if (a.normalize_mean_size() > 0) {
      augment.normalization.mean.assign(a.normalize_mean().begin(), a.normalize_mean().end());
      augment.normalization.stddev.assign(a.normalize_std().begin(), a.normalize_std().end());
    }
    o.image_augment = augment;
  }
  if (e.data().on_corrupt_image() == config::DataConfig::SKIP) {
    o.jpeg.on_corrupt = data::CorruptImagePolicy::kSkip;
  }
  if (model.sample_shape.size() == 3) o.jpeg.image_size = static_cast<int>(model.sample_shape[1]);
  return o;
}

// mpirun gives ranks a pseudo-terminal, so isatty() alone would draw progress bars into logs.
bool launched_by_mpirun() {
  return std::getenv("OMPI_COMM_WORLD_RANK") != nullptr || std::getenv("PMI_RANK") != nullptr ||
         std::getenv("PMIX_RANK") != nullptr || std::getenv("SLURM_PROCID") != nullptr;
}

std::atomic<bool> g_stop{false};

extern "C" void on_stop_signal(int) {
  g_stop = true;
}

}  // namespace

std::atomic<bool>& Trainer::stop_requested() {
  return g_stop;
}

void install_preemption_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
}

struct Trainer::State {
  config::Experiment e;
  World world;
  TrainerOptions options;
  Device device;
  Model model;
  std::vector<Parameter*> parameters;  // model.net->parameters(), listed once, not every step
  PrecisionChoice precision;
  config::BatchPlan plan;
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<DataParallel> dp;
  std::unique_ptr<StepOptimizer> optimizer;
  std::shared_ptr<data::Dataset> train_set, eval_set;
  std::unique_ptr<data::DataLoader> loader;
  SoftmaxCrossEntropy loss_fn;
  std::unique_ptr<CheckpointStore> store;
  std::unique_ptr<JsonlWriter> jsonl;
  std::unique_ptr<TensorBoardWriter> tensorboard;
  std::int64_t step = 0;        // optimizer steps completed
  std::int64_t micro_step = 0;  // forward/backward passes completed
  std::int64_t total_steps = 0;
  std::int64_t skipped = 0;
  double flops_per_sample = 0;  // forward + backward
  // Fault injection for the reliability tests (KILN_FAULT_KIND, KILN_FAULT_STEP, KILN_FAULT_RANK).
  std::string fault_kind;
  std::int64_t fault_step = -1;
  bool fault_here = false;
  double peak = 0;
  bool rank0() const { return world.rank == 0; }
  Context make_context(bool training) const;
  StepOutcome run_step(Context& ctx, Tensor& loss_sum, std::int64_t* micro_count,
                       std::int64_t* sample_count);

  void log(const std::string& line) const {
    if (rank0() && !options.quiet) {
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    }
  }
};

Trainer::Trainer(const config::Experiment& experiment, const World& world, TrainerOptions options)
    : s_(std::make_unique<State>()) {
  State& s = *s_;
  s.e = experiment;
  s.world = world;
  s.options = options;
  const config::TrainConfig& t = s.e.train();
  bool want_cuda = t.device() == config::TrainConfig::CUDA ||
                   (t.device() == config::TrainConfig::AUTO && cuda_device_count() > 0);
  s.device = want_cuda ? select_local_device(world) : Device::cpu();
  if (t.deterministic()) {
    // Fixed reduction orders: cuBLAS workspace config, ring all-reduce, deterministic cuDNN.
    setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", 0);
    setenv("NCCL_ALGO", "Ring", 0);
  }
  if (t.cuda_graphs() && world.rank == 0) {
    std::fprintf(stderr,
                 "kiln: warning: train.cuda_graphs is not implemented yet; the step runs "
                 "uncaptured\n");
  }
  ConvAlgorithmOptions conv = default_conv_algorithm_options();
  conv.deterministic = t.deterministic();
  conv.search = t.deterministic() ? ConvAlgorithmSearch::Heuristic : ConvAlgorithmSearch::Benchmark;
  set_default_conv_algorithm_options(conv);
  if (s.device.is_cuda() && t.max_memory_mb() > 0) {
    cuda_allocator(s.device.index)
        .set_memory_limit(static_cast<std::size_t>(t.max_memory_mb()) << 20);
  } else if (t.max_memory_mb() > 0) {
    host_allocator().set_memory_limit(static_cast<std::size_t>(t.max_memory_mb()) << 20);
  }

  if (const char* kind = std::getenv("KILN_FAULT_KIND")) {
    s.fault_kind = kind;
    s.fault_step =
        std::atoll(std::getenv("KILN_FAULT_STEP") ? std::getenv("KILN_FAULT_STEP") : "0");
    const char* rank = std::getenv("KILN_FAULT_RANK");
    s.fault_here = (rank ? std::atoi(rank) : 0) == world.rank;
  }
  s.plan = config::plan_batches(s.e, world.size);
  CommunicatorOptions comm_options;
  comm_options.timeout_s = s.e.parallel().collective_timeout_s();
  s.comm = make_communicator(world, s.device, comm_options);
  s.comm->check_same_on_all_ranks(config::experiment_hash(s.e),
                                  "the experiment (config file and --set overrides)");

  // Model: deterministic fp32 initialisation on the host, then to the device and dtype.
  s.model = make_model(model_options_from(s.e));
  s.model.net->reset_parameters(t.seed());
  // Nothing consumes the gradient of the model's input: its first layer may skip computing it.
  for (Layer* first = s.model.net.get(); first != nullptr;) {
    first->set_input_gradient(false);
    auto children = first->children();
    first = children.empty() ? nullptr : children.front();
  }
  if (!s.e.model().init_from().empty()) {
    SafetensorsFile f = load_safetensors(s.e.model().init_from());
    for (Parameter* p : s.model.net->parameters()) {
      auto it = f.tensors.find(p->name);
      if (it == f.tensors.end()) {
        throw InputError(s.e.model().init_from() + ": no tensor '" + p->name + "' for model " +
                         s.e.model().name());
      }
      if (it->second.shape() != p->value.shape()) {
        throw InputError(s.e.model().init_from() + ": tensor '" + p->name + "' has shape " +
                         shape_str(it->second.shape()) + ", the model needs " +
                         shape_str(p->value.shape()));
      }
      p->value.copy_from(it->second);
    }
    for (Buffer* b : s.model.net->buffers()) {
      auto it = f.tensors.find(b->name);
      if (it != f.tensors.end() && it->second.shape() == b->value.shape())
        b->value.copy_from(it->second);
    }
  }
  NamedTensors fp32_init;
  for (Parameter* p : s.model.net->parameters())
    fp32_init.emplace_back(p->name, p->value.to(s.device));
  s.parameters = s.model.net->parameters();
  s.precision = precision_for(s.e, s.device);
  s.model.net->to(s.device, s.device.is_cpu() && s.precision.parameter_dtype == DType::F32
                                ? DType::F32
                                : s.precision.parameter_dtype);
  if (world.size > 1) {
    DataParallelOptions dp;
    dp.bucket_bytes = static_cast<std::size_t>(s.e.parallel().bucket_mb() * (1 << 20));
    dp.reduce_in_half = s.e.parallel().allreduce_in_half();
    dp.half_dtype =
        s.e.precision().half() == config::PrecisionConfig::BF16 ? DType::BF16 : DType::F16;
    s.dp = std::make_unique<DataParallel>(s.model.net->parameters(), s.model.net->buffers(),
                                          *s.comm, dp);
  }

  // Data.
  std::string kind = data_kind(s.e, s.model);
  data::DatasetOptions dopt = dataset_options(s.e, s.model);
  std::string path = s.e.data().path();
  s.train_set = data::make_dataset(kind, path, "train", dopt);
  if (s.e.data().eval_split() != "none") {
    s.eval_set = data::make_dataset(kind, path, s.e.data().eval_split(), dopt);
  }
  data::LoaderOptions lo;
  lo.batch_size = s.plan.per_gpu;
  lo.workers = s.e.data().workers();
  lo.prefetch = s.e.data().prefetch();
  lo.shuffle = s.e.data().shuffle();
  lo.seed = t.seed();
  lo.drop_last = s.e.data().drop_last();
  lo.rank = world.rank;
  lo.world_size = world.size;
  lo.device = s.device;
  lo.train = true;
  s.loader = std::make_unique<data::DataLoader>(s.train_set, lo);

  std::int64_t batches_per_epoch = std::max<std::int64_t>(1, s.loader->batches_per_epoch());
  if (t.has_steps() || t.duration_case() == config::TrainConfig::kSteps) {
    s.total_steps = t.steps();
  } else {
    double micro = t.epochs() * static_cast<double>(batches_per_epoch);
    s.total_steps = std::max<std::int64_t>(
        1, static_cast<std::int64_t>(std::ceil(micro / s.plan.accumulation)));
  }
  s.optimizer =
      std::make_unique<StepOptimizer>(s.model.net->parameters(), fp32_init, s.e, s.total_steps);
  Shape input = s.model.sample_shape;
  input.insert(input.begin(), 1);
  s.flops_per_sample = 3.0 * s.model.net->forward_flops(input);
  s.peak = peak_flops(s.device);

  std::string ckpt_dir = s.e.checkpoint().dir();
  s.store = std::make_unique<CheckpointStore>(ckpt_dir, s.e.checkpoint().keep_last());
  if (s.rank0()) {
    std::string logdir = s.e.logging().dir();
    std::string mk = "mkdir -p '" + logdir + "'";
    if (std::system(mk.c_str()) != 0) throw Error("cannot create logging.dir " + logdir);
    bool resuming = !(options.resume.empty() ? s.e.checkpoint().resume() : options.resume).empty();
    if (s.e.logging().jsonl())
      s.jsonl = std::make_unique<JsonlWriter>(logdir + "/metrics.jsonl", resuming);
    if (s.e.logging().tensorboard()) s.tensorboard = std::make_unique<TensorBoardWriter>(logdir);
  }

  // Resume: verified before step 1; a checkpoint of another model or batch layout is refused.
  std::string resume = options.resume.empty() ? s.e.checkpoint().resume() : options.resume;
  if (resume == "latest") {
    if (s.rank0()) s.store->remove_partial();
    s.comm->barrier();  // no rank looks for the latest while rank 0 still removes partial ones
    auto latest = s.store->latest();
    if (latest) {
      resume = *latest;
    } else if (!options.resume.empty()) {
      throw InputError("--resume latest: no complete checkpoint in " + ckpt_dir +
                       " (checkpoint.dir); start without --resume, or point it at a checkpoint");
    } else {
      // checkpoint.resume "latest" in a config: a job's first run starts fresh, its requeued
      // runs continue from their checkpoints.
      if (s.rank0())
        s.log("checkpoint.resume latest: no checkpoint in " + ckpt_dir + " yet; starting fresh");
      resume.clear();
    }
  }
  if (!resume.empty()) {
    std::string path_to_load = resume;
    Checkpoint c = CheckpointStore::load(path_to_load);
    const config::CheckpointState& st = c.state;
    if (st.model_name() != s.e.model().name()) {
      throw InputError(path_to_load + ": checkpoint of model '" + st.model_name() +
                       "', this experiment trains '" + s.e.model().name() + "'");
    }
    for (Parameter* p : s.model.net->parameters()) {
      auto it = c.model.tensors.find(p->name);
      if (it == c.model.tensors.end() || it->second.shape() != p->value.shape()) {
        throw InputError(path_to_load + "/model.safetensors: parameter '" + p->name +
                         (it == c.model.tensors.end()
                              ? "' is missing"
                              : "' has shape " + shape_str(it->second.shape()) +
                                    ", the model needs " + shape_str(p->value.shape())) +
                         " (a checkpoint of a different model configuration)");
      }
      p->value.copy_from(it->second);
    }
    for (Buffer* b : s.model.net->buffers()) {
      auto it = c.model.tensors.find(b->name);
      if (it == c.model.tensors.end())
        throw InputError(path_to_load + "/model.safetensors: buffer '" + b->name + "' is missing");
      b->value.copy_from(it->second);
    }
    s.optimizer->load_state(c.optimizer.tensors);
    s.optimizer->load_scaler_state(st.loss_scaler());
    if (!options.evaluate_only &&
        (st.world_size() != world.size ||
         st.data().batches_per_epoch() != s.loader->batches_per_epoch())) {
      throw InputError(path_to_load + "/state.pbtxt: written by " +
                       std::to_string(st.world_size()) + " rank(s) with " +
                       std::to_string(st.data().batches_per_epoch()) +
                       " batches per epoch; this run has " + std::to_string(world.size) +
                       " rank(s) and " + std::to_string(s.loader->batches_per_epoch()) +
                       ": resume with the same world size and batch size");
    }
    data::LoaderState ls;
    ls.seed = st.data().seed();
    ls.epoch = st.data().epoch();
    ls.next_batch = st.data().next_batch();
    ls.batches_per_epoch = st.data().batches_per_epoch();
    if (!options.evaluate_only) s.loader->restore(ls);
    s.step = st.step();
    s.micro_step = st.micro_step();
    s.skipped = st.loss_scaler().skipped_steps();
    s.log("resumed from " + path_to_load + " at step " + std::to_string(s.step) + " (" + ls.str() +
          ")");
  }
}

Trainer::~Trainer() = default;

namespace {

// Logits and targets as the loss wants them: (N, C) and (N).
void flatten_for_loss(Tensor& logits, Tensor& targets) {
  if (logits.dim() == 3) logits = logits.reshape({-1, logits.size(-1)});
  if (targets.dim() == 2) targets = targets.reshape({-1});
}

Tensor prepare_inputs(const Tensor& inputs, const PrecisionPolicy& policy) {
  if (is_floating(inputs.dtype()) && inputs.dtype() != policy.activation) {
    return inputs.to(policy.activation);
  }
  return inputs;
}

}  // namespace

Context Trainer::State::make_context(bool training) const {
  Context ctx;
  ctx.device = device;
  ctx.training = training;
  ctx.precision = precision.policy;
  ctx.seed = e.train().seed();
  ctx.channels_last = device.is_cuda() && e.model().memory_format() != config::ModelConfig::NCHW &&
                      (e.model().memory_format() == config::ModelConfig::NHWC ||
                       precision.policy.matmul != DType::F32);
  if (dp && training) ctx.on_grad_ready = dp->grad_ready_hook();
  return ctx;
}

// One optimizer step: accumulation micro-batches of forward and backward, the gradient
// all-reduce, the optimizer. No host synchronisation except inside the optimizer's inf check.
StepOutcome Trainer::State::run_step(Context& ctx, Tensor& loss_sum, std::int64_t* micro_count,
                                     std::int64_t* sample_count) {
  NvtxRange step_range("step");
  if (dp) {
    dp->zero_grad();
  } else {
    for (Parameter* p : parameters) p->grad.zero();
  }
  int accumulation = plan.accumulation;
  double scale = optimizer->loss_scale();
  for (int micro = 0; micro < accumulation; ++micro) {
    data::Batch batch = loader->next();
    if (dp) dp->set_accumulation_micro_step(micro + 1 < accumulation);
    ctx.step = static_cast<std::uint64_t>(micro_step);
    Tensor inputs = prepare_inputs(batch.inputs, ctx.precision);
    if (fault_here && fault_kind == "nan-input" && step == fault_step &&
        is_floating(inputs.dtype())) {
      inputs = inputs.clone();
      inputs.fill(std::nan(""));
    }
    Tensor logits = model.net->forward(ctx, inputs);
    Tensor targets = batch.targets;
    flatten_for_loss(logits, targets);
    Tensor loss = loss_fn.forward(ctx, logits, targets);
    ops::axpy(1.0, loss, loss_sum);
    Tensor dlogits = loss_fn.backward(ctx, scale / accumulation);
    logits = Tensor();  // the loss is done with it: freed before the model's backward
    model.net->backward(ctx, dlogits);
    ++micro_step;
    ++*micro_count;
    *sample_count += batch.size();
  }
  if (fault_here && ((fault_kind == "inf-grad" && step == fault_step) ||
                     (fault_kind == "inf-grad-always" && step >= fault_step))) {
    Tensor g = model.net->parameters().front()->grad;
    g.slice(0, 0, 1).fill(std::numeric_limits<double>::infinity());
  }
  if (dp) dp->finish();
  StepOutcome outcome;
  {
    NvtxRange range("optimizer");
    outcome = optimizer->step(step, comm.get());
  }
  ctx.weights_version = optimizer->weights_version();
  if (outcome.skipped) ++skipped;
  if (outcome.found_inf && !outcome.skipped) {
    throw Error("non-finite gradients (inf/NaN) at step " + std::to_string(step + 1) + " on rank " +
                std::to_string(world.rank) + " of " + std::to_string(world.size) +
                " with no loss scaler to skip the step (the loss diverged or the batch holds "
                "NaN/inf): lower optimizer.lr, check the data, or use precision.half: FP16 with "
                "dynamic loss scaling");
  }
  ++step;
  return outcome;
}

TrainResult Trainer::train() {
  State& s = *s_;
  TrainResult result;
  Context ctx = s.make_context(true);
  s.model.net->set_training(true);

  const config::TrainConfig& t = s.e.train();
  int accumulation = s.plan.accumulation;
  std::int64_t log_every = std::max(1, t.log_every());
  bool progress = s.rank0() && !s.options.quiet &&
                  (s.e.logging().progress() == config::LoggingConfig::ON ||
                   (s.e.logging().progress() == config::LoggingConfig::AUTO &&
                    isatty(STDOUT_FILENO) && !launched_by_mpirun()));
  ProgressBar bar(s.total_steps, progress);

  s.log("training " + s.e.model().name() + " (" + std::to_string(s.model.net->parameter_count()) +
        " parameters) on " + s.device.str() + " x" + std::to_string(s.world.size) + ", batch " +
        std::to_string(s.plan.per_gpu) + " x " + std::to_string(accumulation) + " x " +
        std::to_string(s.world.size) + " = " + std::to_string(s.plan.global) + ", " +
        std::to_string(s.total_steps) + " steps");

  Tensor loss_sum = Tensor::zeros({}, DType::F32, s.device);
  std::int64_t interval_micro = 0, interval_samples = 0;
  auto interval_start = Clock::now();
  auto run_start = Clock::now();
  double wait_at_interval_start = s.loader->wait_time();
  std::int64_t run_samples = 0;
  std::int64_t last_checkpoint_step = -1;

  auto save_checkpoint = [&]() {
    if (s.dp) s.dp->broadcast_buffers();
    config::CheckpointState st;
    st.set_step(s.step);
    st.set_micro_step(s.micro_step);
    st.set_samples_seen(s.step * s.plan.global);
    data::LoaderState ls = s.loader->state();
    st.mutable_data()->set_seed(ls.seed);
    st.mutable_data()->set_epoch(ls.epoch);
    st.mutable_data()->set_next_batch(ls.next_batch);
    st.mutable_data()->set_batches_per_epoch(ls.batches_per_epoch);
    *st.mutable_loss_scaler() = s.optimizer->scaler_state();
    st.mutable_loss_scaler()->set_skipped_steps(s.skipped);
    st.set_seed(t.seed());
    st.set_world_size(s.world.size);
    st.set_model_name(s.e.model().name());
    st.set_kiln_version(kiln_version());
    st.set_experiment_hash(config::experiment_hash(s.e));
    *st.mutable_experiment() = s.e;
    std::string path;
    if (s.rank0()) {
      NamedTensors model;
      for (Parameter* p : s.model.net->parameters()) model.emplace_back(p->name, p->value);
      for (Buffer* b : s.model.net->buffers()) model.emplace_back(b->name, b->value);
      path = s.store->save(model, s.optimizer->state(), st);
    }
    s.comm->barrier();  // nobody moves on (or exits) before the checkpoint is complete
    last_checkpoint_step = s.step;
    result.last_checkpoint = s.store->dir() + "/" + checkpoint_name(s.step);
    if (s.rank0()) s.log("checkpoint " + path);
  };

  while (s.step < s.total_steps) {
    if (s.fault_here && s.step == s.fault_step) {
      std::fflush(stdout);
      if (s.fault_kind == "kill") std::raise(SIGKILL);
      if (s.fault_kind == "exit3") std::_Exit(3);
      if (s.fault_kind == "hang") std::raise(SIGSTOP);
    }
    StepOutcome outcome = s.run_step(ctx, loss_sum, &interval_micro, &interval_samples);
    run_samples += s.plan.global;

    bool log_now = s.step % log_every == 0 || s.step == s.total_steps;
    if (log_now) {
      s.loss_fn.check_targets();
      double mean_loss = loss_sum.item() / std::max<std::int64_t>(interval_micro, 1);
      if (s.world.size > 1) mean_loss = s.comm->all_reduce_host(mean_loss, HostReduceOp::Average);
      if (!std::isfinite(mean_loss) && !(s.precision.policy.matmul == DType::F16)) {
        throw Error("the training loss is " + std::to_string(mean_loss) + " at step " +
                    std::to_string(s.step) + " on rank " + std::to_string(s.world.rank) +
                    ": lower optimizer.lr, or check the data");
      }
      double elapsed = seconds_since(interval_start);
      double samples_per_s = interval_samples * s.world.size / std::max(elapsed, 1e-9);
      double tflops = samples_per_s * s.flops_per_sample / 1e12;
      double wait = s.loader->wait_time() - wait_at_interval_start;
      result.final_loss = mean_loss;
      if (s.rank0()) {
        Record r = {{"step", static_cast<double>(s.step)},
                    {"epoch", static_cast<double>(s.loader->epoch())},
                    {"loss", mean_loss},
                    {"lr", outcome.lr},
                    {"loss_scale", outcome.loss_scale},
                    {"samples_per_s", samples_per_s},
                    {"tflops", tflops},
                    {"data_wait_fraction", wait / std::max(elapsed, 1e-9)}};
        if (s.peak > 0) r.emplace_back("mfu", tflops * 1e12 / s.world.size / s.peak);
        if (outcome.grad_norm >= 0) r.emplace_back("grad_norm", outcome.grad_norm);
        std::ostringstream line;
        char buf[256];
        std::snprintf(
            buf, sizeof(buf),
            "step %lld/%lld epoch %lld loss %.4f lr %.3g scale %.0f %.0f samples/s %.2f TFLOP/s",
            static_cast<long long>(s.step), static_cast<long long>(s.total_steps),
            static_cast<long long>(s.loader->epoch()), mean_loss, outcome.lr, outcome.loss_scale,
            samples_per_s, tflops);
        line << buf;
        if (s.peak > 0) {
          std::snprintf(buf, sizeof(buf), " MFU %.1f%%",
                        100.0 * tflops * 1e12 / s.world.size / s.peak);
          line << buf;
        }
        if (s.device.is_cuda()) {
          AllocatorStats a = cuda_allocator(s.device.index).stats();
          r.emplace_back("memory_allocated_bytes", static_cast<double>(a.allocated_bytes));
          r.emplace_back("memory_reserved_bytes", static_cast<double>(a.reserved_bytes));
          r.emplace_back("memory_fragmentation", a.fragmentation());
          line << " mem " << format_bytes(a.allocated_bytes) << "/"
               << format_bytes(a.reserved_bytes) << " frag "
               << static_cast<int>(100 * a.fragmentation()) << "%";
          if (auto g = NvmlSampler::instance().sample(s.device.index)) {
            r.emplace_back("gpu_temperature_c", g->temperature_c);
            r.emplace_back("gpu_power_w", g->power_w);
            std::snprintf(buf, sizeof(buf), " %.0fC %.0fW", g->temperature_c, g->power_w);
            line << buf;
          }
        }
        if (outcome.skipped) line << " (step skipped: inf/NaN gradients)";
        if (s.jsonl) s.jsonl->write(r);
        if (s.tensorboard) {
          for (const auto& [k, v] : r) {
            if (k != "step") s.tensorboard->scalar("train/" + k, v, s.step);
          }
          s.tensorboard->flush();
        }
        if (bar.enabled()) {
          char suffix[96];
          std::snprintf(suffix, sizeof(suffix), "loss %.4f %.0f samples/s", mean_loss,
                        samples_per_s);
          bar.update(s.step, suffix);
        } else {
          s.log(line.str());
        }
      }
      loss_sum.zero();
      interval_micro = interval_samples = 0;
      interval_start = Clock::now();
      wait_at_interval_start = s.loader->wait_time();
    }

    bool stop = g_stop.load();
    if (s.world.size > 1) {
      stop = s.comm->all_reduce_host(static_cast<std::int64_t>(stop), HostReduceOp::Max) != 0;
    }
    if (stop) {
      bar.finish();
      s.log("stop requested (SIGTERM): checkpointing at step " + std::to_string(s.step));
      save_checkpoint();
      result.preempted = true;
      break;
    }
    std::int64_t every = s.e.checkpoint().every_steps();
    if (every > 0 && s.step % every == 0 && s.step < s.total_steps) save_checkpoint();
    if (t.eval_every() > 0 && s.step % t.eval_every() == 0 && s.step < s.total_steps &&
        s.eval_set) {
      EvalResult ev = evaluate();
      s.model.net->set_training(true);
      if (s.rank0()) {
        char buf[160];
        std::snprintf(buf, sizeof(buf), "eval at step %lld: loss %.4f accuracy %.2f%%",
                      static_cast<long long>(s.step), ev.loss, 100 * ev.accuracy);
        if (bar.enabled()) std::printf("\n");
        s.log(buf);
        if (s.jsonl)
          s.jsonl->write({{"step", static_cast<double>(s.step)},
                          {"eval_loss", ev.loss},
                          {"eval_accuracy", ev.accuracy}});
        if (s.tensorboard) {
          s.tensorboard->scalar("eval/loss", ev.loss, s.step);
          s.tensorboard->scalar("eval/accuracy", ev.accuracy, s.step);
          s.tensorboard->flush();
        }
      }
    }
  }
  bar.finish();
  result.steps = s.step;
  result.skipped_steps = s.skipped;
  result.samples_per_s = run_samples / std::max(seconds_since(run_start), 1e-9);
  if (result.preempted) return result;
  if (last_checkpoint_step != s.step) save_checkpoint();
  if (s.eval_set) {
    result.eval = evaluate();
    if (s.rank0()) {
      if (s.jsonl) {
        s.jsonl->write({{"step", static_cast<double>(s.step)},
                        {"eval_loss", result.eval.loss},
                        {"eval_accuracy", result.eval.accuracy}});
      }
      if (s.tensorboard) {
        s.tensorboard->scalar("eval/loss", result.eval.loss, s.step);
        s.tensorboard->scalar("eval/accuracy", result.eval.accuracy, s.step);
        s.tensorboard->flush();
      }
    }
  }
  return result;
}

BenchResult Trainer::benchmark(int warmup, int steps, bool profile) {
  State& s = *s_;
  BenchResult r;
  Context ctx = s.make_context(true);
  s.model.net->set_training(true);
  Tensor loss_sum = Tensor::zeros({}, DType::F32, s.device);
  std::int64_t micro = 0, samples = 0;
  for (int i = 0; i < warmup; ++i) s.run_step(ctx, loss_sum, &micro, &samples);
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
    ctx.on_layer = [&](Layer& layer, bool forward, bool begin) {
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
    };
  }
  double wait_before = s.loader->wait_time();
  auto wall_start = Clock::now();
  for (int i = 0; i < steps; ++i) {
    if (s.device.is_cuda()) {
      Event begin(s.device, true), end(s.device, true);
      begin.record(current_stream(s.device));
      s.run_step(ctx, loss_sum, &micro, &samples);
      end.record(current_stream(s.device));
      end.synchronize();
      r.step_ms.push_back(begin.elapsed_ms(end));
    } else {
      auto t0 = Clock::now();
      s.run_step(ctx, loss_sum, &micro, &samples);
      r.step_ms.push_back(1e3 * seconds_since(t0));
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
  r.mfu = s.peak > 0 ? r.tflops_per_gpu * 1e12 / s.peak : 0;
  if (gpu) {
    AllocatorStats a = gpu->stats();
    r.peak_allocated_bytes = a.peak_allocated_bytes;
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

EvalResult Trainer::evaluate() {
  State& s = *s_;
  EvalResult r;
  if (!s.eval_set) return r;
  if (s.dp) s.dp->broadcast_buffers();
  data::LoaderOptions lo = s.loader->options();
  lo.shuffle = false;
  lo.train = false;
  lo.drop_last = false;
  lo.shard_mode = data::ShardMode::kUneven;  // every sample exactly once: exact accuracy
  lo.workers = std::min(lo.workers, 2);
  data::DataLoader loader(s.eval_set, lo);
  Context ctx = s.make_context(false);
  s.model.net->set_training(false);
  SoftmaxCrossEntropy loss_fn;
  Tensor loss_total = Tensor::zeros({}, DType::F32, s.device);
  Tensor correct = Tensor::zeros({}, DType::F32, s.device);
  Tensor counted = Tensor::zeros({}, DType::F32, s.device);
  std::int64_t batches = loader.batches_per_epoch();
  if (s.e.train().eval_batches() > 0) batches = std::min(batches, s.e.train().eval_batches());
  for (std::int64_t i = 0; i < batches; ++i) {
    data::Batch batch = loader.next();
    Tensor logits = s.model.net->forward(ctx, prepare_inputs(batch.inputs, ctx.precision));
    Tensor targets = batch.targets;
    flatten_for_loss(logits, targets);
    Tensor loss = loss_fn.forward(ctx, logits, targets);
    // Weight each batch's mean loss by its row count, so the total is a per-row mean.
    Tensor rows = loss_fn.counted_rows();
    Tensor weighted = ops::mul(loss, rows);
    ops::axpy(1.0, weighted, loss_total);
    ops::axpy(1.0, loss_fn.correct_count(), correct);
    ops::axpy(1.0, rows, counted);
  }
  loss_fn.check_targets();
  std::vector<double> sums = {loss_total.item(), correct.item(), counted.item()};
  if (s.world.size > 1) s.comm->all_reduce_host(sums, HostReduceOp::Sum);
  r.samples = static_cast<std::int64_t>(sums[2]);
  r.loss = sums[2] > 0 ? sums[0] / sums[2] : 0;
  r.accuracy = sums[2] > 0 ? sums[1] / sums[2] : 0;
  return r;
}

}  // namespace kiln::train
