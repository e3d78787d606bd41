#include "train/run_setup.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

#include "core/allocator.h"
#include "core/gemm_algorithm.h"
#include "layers/conv2d.h"

namespace kiln::train {

Device choose_device(const config::TrainConfig& train, const World& world) {
  const bool want_cuda = train.device() == config::TrainConfig::CUDA ||
                         (train.device() == config::TrainConfig::AUTO && cuda_device_count() > 0);
  return want_cuda ? select_local_device(world) : Device::cpu();
}

void configure_process(const config::Experiment& experiment, Device device,
                       bool heuristic_algorithms) {
  const config::TrainConfig& t = experiment.train();
  if (t.deterministic()) {
    // Fixed reduction orders: cuBLAS workspace config, ring all-reduce, deterministic cuDNN.
    setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", 0);
    setenv("NCCL_ALGO", "Ring", 0);
  }
  ConvAlgorithmOptions conv = default_conv_algorithm_options();
  conv.deterministic = t.deterministic();
  conv.search = t.deterministic() || heuristic_algorithms ? ConvAlgorithmSearch::Heuristic
                                                          : ConvAlgorithmSearch::Benchmark;
  set_default_conv_algorithm_options(conv);
  set_default_gemm_algorithm_options({conv.search == ConvAlgorithmSearch::Heuristic
                                          ? GemmAlgorithmSearch::Heuristic
                                          : GemmAlgorithmSearch::Benchmark});
  if (t.max_memory_mb() > 0) {
    const std::size_t limit = static_cast<std::size_t>(t.max_memory_mb()) << 20;
    (device.is_cuda() ? cuda_allocator(device.index) : host_allocator()).set_memory_limit(limit);
  }
}

CommBackend comm_backend(const config::ParallelConfig& parallel) {
  switch (parallel.backend()) {
    case config::ParallelConfig::NCCL:
      return CommBackend::Nccl;
    case config::ParallelConfig::MPI:
      return CommBackend::Mpi;
    default:
      return CommBackend::Auto;
  }
}

GradientCompression gradient_compression(const config::ParallelConfig& parallel) {
  switch (parallel.compression()) {
    case config::ParallelConfig::HALF:
      return GradientCompression::Half;
    case config::ParallelConfig::POWERSGD:
      return GradientCompression::PowerSgd;
    default:
      return GradientCompression::None;
  }
}

bool channels_last(const config::ModelConfig& model, Device device, const PrecisionPolicy& policy) {
  if (!device.is_cuda() || model.memory_format() == config::ModelConfig::NCHW) return false;
  return model.memory_format() == config::ModelConfig::NHWC || policy.matmul != DType::F32;
}

bool progress_bar_wanted(const config::LoggingConfig& logging, const World& world) {
  switch (logging.progress()) {
    case config::LoggingConfig::ON:
      return true;
    case config::LoggingConfig::OFF:
      return false;
    default:
      // mpirun gives ranks a pseudo-terminal, so isatty() alone would draw bars into job logs.
      return isatty(STDOUT_FILENO) && !world.under_launcher;
  }
}

std::string dataset_kind(const config::Experiment& e, const Model& model) {
  switch (e.data().kind()) {
    case config::DataConfig::FASHION_MNIST:
      return "fashion_mnist";
    case config::DataConfig::CIFAR10:
      return "cifar10";
    case config::DataConfig::TOKENS:
      return model.task == Task::CausalLM ? "tokens_clm" : "tokens_mlm";
    case config::DataConfig::JPEG_FOLDER:
      return "jpeg_folder";
    case config::DataConfig::SYNTHETIC:
      return model.input_dtype == DType::I64 ? "synthetic_tokens" : "synthetic_images";
    case config::DataConfig::LLMC_SHARDS:
      return "llmc_shards";
    default:
      return "?";
  }
}

std::string dataset_path(const config::Experiment& e, const std::string& split) {
  if (e.data().kind() == config::DataConfig::LLMC_SHARDS && split == "test") {
    return e.data().eval_path();
  }
  return e.data().path();
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
  const bool any_augmentation = a.random_crop_padding() > 0 || a.horizontal_flip() ||
                                a.normalize_mean_size() > 0 ||
                                a.random_resized_crop_scale_size() > 0;
  if (any_augmentation) {
    data::ImageAugment augment;
    augment.crop_padding = a.random_crop_padding();
    augment.horizontal_flip = a.horizontal_flip();
    if (a.normalize_mean_size() > 0) {
      augment.normalization.mean.assign(a.normalize_mean().begin(), a.normalize_mean().end());
      augment.normalization.stddev.assign(a.normalize_std().begin(), a.normalize_std().end());
    }
    if (a.random_resized_crop_scale_size() == 2) {
      augment.resized_crop_scale_min = a.random_resized_crop_scale(0);
      augment.resized_crop_scale_max = a.random_resized_crop_scale(1);
    }
    o.image_augment = augment;
  }
  if (e.data().on_corrupt_image() == config::DataConfig::SKIP) {
    o.jpeg.on_corrupt = data::CorruptImagePolicy::kSkip;
  }
  if (model.sample_shape.size() == 3) o.jpeg.image_size = static_cast<int>(model.sample_shape[1]);
  return o;
}

data::LoaderOptions loader_options(const config::Experiment& e, const config::BatchPlan& plan,
                                   const World& world, Device device) {
  data::LoaderOptions lo;
  lo.batch_size = plan.per_gpu;
  lo.workers = e.data().workers();
  lo.prefetch = e.data().prefetch();
  lo.shuffle = e.data().shuffle();
  lo.seed = e.train().seed();
  lo.drop_last = e.data().drop_last();
  lo.rank = world.rank;
  lo.world_size = world.size;
  lo.device = device;
  lo.train = true;
  switch (e.data().decode()) {
    case config::DataConfig::CPU:
      lo.decode = data::LoaderOptions::ImageDecode::kHost;
      break;
    case config::DataConfig::GPU:
      lo.decode = data::LoaderOptions::ImageDecode::kDevice;
      break;
    default:
      lo.decode = data::LoaderOptions::ImageDecode::kAuto;
      break;
  }
  if (e.data().has_document_boundary_token()) {
    lo.document_boundary_token = e.data().document_boundary_token() >= 0
                                     ? e.data().document_boundary_token()
                                     : data::llmc_first_token(e.data().path());
  }
  return lo;
}

DataParallelOptions data_parallel_options(const config::Experiment& e) {
  const config::ParallelConfig& parallel = e.parallel();
  DataParallelOptions dp;
  dp.bucket_bytes = static_cast<std::size_t>(parallel.bucket_mb() * (1 << 20));
  dp.compression = gradient_compression(parallel);
  if (parallel.has_first_bucket_mb()) {
    dp.first_bucket_bytes = static_cast<std::size_t>(parallel.first_bucket_mb() * (1 << 20));
  }
  dp.half_dtype = e.precision().half() == config::PrecisionConfig::BF16 ? DType::BF16 : DType::F16;
  dp.powersgd.rank = parallel.powersgd_rank();
  dp.powersgd.seed = static_cast<std::uint64_t>(e.train().seed());
  dp.powersgd_start_step = parallel.powersgd_start_step();
  dp.zero_stage = parallel.zero_stage();
  dp.shards_in_host_memory = e.train().offload() == config::TrainConfig::OPTIMIZER_AND_WEIGHTS;
  dp.accumulate_in_shards = parallel.zero_accumulate_in_shards();
  return dp;
}

bool reduces_in_buckets(const config::Experiment& e, int world_size) {
  return world_size > 1 || e.train().offload() == config::TrainConfig::OPTIMIZER_AND_WEIGHTS;
}

StepMode choose_step_mode(const config::Experiment& e, bool cuda, int world_size,
                          std::string* note) {
  const config::TrainConfig& t = e.train();
  note->clear();
  if (!t.cuda_graphs()) return StepMode::Eager;  // filled by config::fill_device_defaults
  if (reduces_in_buckets(e, world_size) && e.parallel().zero_stage() > 0) {
    *note =
        "cuda_graphs: off, parallel.zero_stage > 0 combines the gradient norms on the host "
        "every step";
    return StepMode::Eager;
  }
  if (offload_update(e) == config::TrainConfig::HOST_CORES) {
    *note = "cuda_graphs: off, train.offload runs each step's update on the host's cores";
    return StepMode::Eager;
  }
  if (e.parallel().compression() == config::ParallelConfig::POWERSGD) {
    *note =
        "cuda_graphs: off, parallel.compression POWERSGD resets its error feedback on the "
        "host after a skipped step";
    return StepMode::Eager;
  }
  if (cuda) return StepMode::Graphed;
  *note =
      "cuda_graphs: the CPU has nothing to capture: steps run eagerly, with the step state "
      "resident";
  return StepMode::Resident;
}

CheckpointerOptions checkpointer_options(const config::Experiment& e,
                                         const std::string& resume_override, bool evaluate_only,
                                         std::int64_t total_steps) {
  CheckpointerOptions o;
  o.dir = e.checkpoint().dir();
  o.keep_last = e.checkpoint().keep_last();
  o.every_steps = e.checkpoint().every_steps();
  o.total_steps = total_steps;
  o.resume = resume_override.empty() ? e.checkpoint().resume() : resume_override;
  o.resume_from_command_line = !resume_override.empty();
  o.evaluate_only = evaluate_only;
  o.powersgd_start_step = e.parallel().powersgd_start_step();
  return o;
}

EvaluatorOptions evaluator_options(const config::Experiment& e, std::int64_t total_steps) {
  return {e.train().eval_every(), e.train().eval_batches(), total_steps};
}

std::int64_t total_steps(const config::TrainConfig& t, std::int64_t batches_per_epoch,
                         int accumulation) {
  if (t.duration_case() == config::TrainConfig::kSteps) return t.steps();
  const double micro =
      t.epochs() * static_cast<double>(std::max<std::int64_t>(1, batches_per_epoch));
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(micro / accumulation)));
}

optim::AmpOptions amp_options(const config::Experiment& e) {
  const config::PrecisionConfig& p = e.precision();
  optim::AmpOptions a;
  a.level = static_cast<optim::OptLevel>(static_cast<int>(p.opt_level()));
  a.half =
      p.half() == config::PrecisionConfig::BF16 ? optim::HalfType::BF16 : optim::HalfType::FP16;
  const config::LossScaleConfig& ls = p.loss_scale();
  if (ls.has_dynamic()) {
    a.loss_scale = ls.dynamic() ? optim::LossScaleMode::Dynamic
                                : (ls.has_static_scale() && ls.static_scale() != 1.0
                                       ? optim::LossScaleMode::Static
                                       : optim::LossScaleMode::None);
  }
  // fp32 gradients need no scaling: O0 runs without a scaler whatever the half type says.
  if (a.level == optim::OptLevel::O0) a.loss_scale = optim::LossScaleMode::None;
  a.scaler.init_scale =
      a.loss_scale == optim::LossScaleMode::Static ? ls.static_scale() : ls.init_scale();
  a.scaler.growth_factor = ls.growth_factor();
  a.scaler.backoff_factor = ls.backoff_factor();
  a.scaler.growth_interval = ls.growth_interval();
  a.scaler.min_scale = ls.min_scale();
  a.scaler.max_scale = ls.max_scale();
  return a;
}

std::optional<config::TrainConfig::OffloadUpdate> offload_update(const config::Experiment& e) {
  if (e.train().offload() == config::TrainConfig::OFFLOAD_NONE) return std::nullopt;
  return e.train().offload_update();
}

optim::OptimizerOptions optimizer_options(const config::Experiment& e) {
  const config::OptimizerConfig& c = e.optimizer();
  optim::OptimizerOptions o;
  // The schema's kind names are the rules' names in capitals, so a new optimizer needs no case
  // here.
  std::string kind_name = config::OptimizerConfig::Kind_Name(c.kind());
  std::transform(kind_name.begin(), kind_name.end(), kind_name.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  o.kind = optim::optimizer_kind_from_name(kind_name);
  o.lr = c.lr();
  o.weight_decay = c.weight_decay();
  o.momentum = c.momentum();
  o.nesterov = c.nesterov();
  if (c.betas_size() == 2) {
    o.beta1 = c.betas(0);
    o.beta2 = c.betas(1);
  }
  o.eps = c.eps();
  o.amsgrad = c.amsgrad();
  o.bias_correction = c.bias_correction();
  o.max_grad_norm = c.max_grad_norm();
  o.exclude_flagged_from_decay = c.no_weight_decay_for_bias_and_norm();
  o.moments_dtype = c.moments_dtype() == config::OptimizerConfig::BF16 ? optim::MomentsDtype::BF16
                                                                       : optim::MomentsDtype::FP32;
  if (offload_update(e) == config::TrainConfig::DEVICE_KERNELS) {
    o.state_memory = optim::StateMemory::kPinnedHost;
  }
  for (const config::ParamGroup& g : c.param_groups()) {
    optim::ParamGroupRule rule;
    rule.pattern = g.name_pattern();
    rule.lr_multiplier = g.has_lr_multiplier() ? g.lr_multiplier() : 1.0;
    rule.weight_decay = g.has_weight_decay() ? g.weight_decay() : -1.0;
    o.groups.push_back(rule);
  }
  return o;
}

optim::ScheduleOptions schedule_options(const config::Experiment& e, std::int64_t total_steps) {
  const config::ScheduleConfig& c = e.schedule();
  optim::ScheduleOptions o;
  switch (c.kind()) {
    case config::ScheduleConfig::WARMUP_COSINE:
      o.kind = optim::ScheduleKind::Cosine;
      break;
    case config::ScheduleConfig::WARMUP_LINEAR:
      o.kind = optim::ScheduleKind::Linear;
      break;
    case config::ScheduleConfig::WARMUP_POLY:
      o.kind = optim::ScheduleKind::Polynomial;
      break;
    case config::ScheduleConfig::STEP:
      o.kind = optim::ScheduleKind::Step;
      break;
    default:
      o.kind = optim::ScheduleKind::Constant;
      break;
  }
  o.base_lr = e.optimizer().lr();
  o.min_lr = c.min_lr();
  o.warmup_steps = c.warmup_steps();
  o.total_steps = total_steps;
  o.power = c.power();
  o.gamma = c.gamma();
  o.step_size = c.step_size();
  return o;
}

}  // namespace kiln::train
