// validate(): the declared ranges (one walk, configs/schema.cc), then the rules that involve
// more than one field, the machine or the file system, by hand; and the batch arithmetic.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>

#include "configs/experiment.h"
#include "configs/internal.h"
#include "configs/schema.h"

namespace kiln::config {
namespace {

using namespace detail;  // NOLINT: the helpers of configs/
using pb::FieldDescriptor;

// Batch arithmetic shared by plan_batches and validate: "" when fine, else the problem.

struct BatchResult {
  BatchPlan plan;
  std::string problem;
  std::string field;  // the field the problem is reported on
};

BatchResult compute_batches(const Experiment& experiment, int world_size) {
  BatchResult result;
  const TrainConfig& train = experiment.train();
  const int per_gpu = train.has_batch_per_gpu() ? train.batch_per_gpu() : 32;
  result.plan.per_gpu = per_gpu;
  result.plan.world_size = world_size;
  if (world_size < 1) {
    result.field = "train.batch_per_gpu";
    result.problem = "the job has " + std::to_string(world_size) + " ranks; need at least 1";
    return result;
  }
  if (per_gpu < 1) {
    result.field = "train.batch_per_gpu";
    result.problem = "must be >= 1";
    return result;
  }
  if (train.has_accumulation_steps() && train.accumulation_steps() < 1) {
    result.field = "train.accumulation_steps";
    result.problem = "must be >= 1 (1 = no accumulation)";
    return result;
  }
  const std::int64_t per_step = static_cast<std::int64_t>(per_gpu) * world_size;
  if (!train.has_global_batch()) {
    result.plan.accumulation = train.has_accumulation_steps() ? train.accumulation_steps() : 1;
    result.plan.global = per_step * result.plan.accumulation;
    return result;
  }
  const std::int64_t global = train.global_batch();
  result.field = "train.global_batch";
  if (global < 1) {
    result.problem =
        "must be >= 1 (or unset, to derive it from batch_per_gpu × "
        "accumulation_steps × ranks)";
    return result;
  }
  const std::string product = std::to_string(per_gpu) + " × " + std::to_string(world_size) + " = " +
                              std::to_string(per_step);
  if (train.has_accumulation_steps()) {
    const std::int64_t implied = per_step * train.accumulation_steps();
    if (implied != global) {
      result.problem =
          "differs from batch_per_gpu × accumulation_steps × ranks = " + std::to_string(per_gpu) +
          " × " + std::to_string(train.accumulation_steps()) + " × " + std::to_string(world_size) +
          " = " + std::to_string(implied) + "; unset one of global_batch and accumulation_steps";
    }
    result.plan.accumulation = train.accumulation_steps();
    result.plan.global = global;
    return result;
  }
  if (global % per_step != 0) {
    const std::int64_t below = global / per_step * per_step;
    std::string suggestion = "global batches that divide: ";
    // The multiple above may not exist: a global batch near the int64 limit has none.
    const bool above_fits = below <= std::numeric_limits<std::int64_t>::max() - per_step;
    if (below > 0) suggestion += std::to_string(below) + (above_fits ? " or " : "");
    if (above_fits) suggestion += std::to_string(below + per_step);
    suggestion += " (multiples of " + std::to_string(per_step) + ")";
    if (global % world_size == 0) {
      const std::int64_t per_rank = global / world_size;
      // The largest divisors that fit batch_per_gpu (an int32), found in pairs up to the root
      // (or up to 2^20: a per-rank batch of 10^18 is not searched for seconds).
      std::vector<std::int64_t> found;
      for (std::int64_t d = 1; d <= per_rank / d && d <= (1 << 20); ++d) {
        if (per_rank % d != 0) continue;
        for (const std::int64_t divisor : {d, per_rank / d}) {
          if (divisor <= std::numeric_limits<int>::max()) found.push_back(divisor);
        }
      }
      std::sort(found.begin(), found.end());
      found.erase(std::unique(found.begin(), found.end()), found.end());
      if (found.size() > 16) found.erase(found.begin(), found.end() - 16);
      std::vector<std::string> divisors;
      for (const std::int64_t d : found) divisors.push_back(std::to_string(d));
      suggestion += "; or a batch_per_gpu dividing " + std::to_string(global) + " / " +
                    std::to_string(world_size) + " = " + std::to_string(per_rank) + ": " +
                    join(divisors, ", ");
    } else {
      suggestion += "; " + std::to_string(global) + " is not even a multiple of the " +
                    std::to_string(world_size) + " ranks";
    }
    result.problem = "not divisible by batch_per_gpu × ranks = " + product +
                     ", so accumulation_steps cannot be derived; " + suggestion;
    return result;
  }
  result.plan.accumulation = static_cast<int>(global / per_step);
  result.plan.global = global;
  return result;
}

class Validator {
 public:
  Validator(const Experiment& experiment, const ValidationContext& context)
      : experiment_(experiment), context_(context), locator_(context) {}

  // Throws "WHERE: PATH = VALUE: PROBLEM".
  [[noreturn]] void fail(const std::string& path, const std::string& value,
                         const std::string& problem) const {
    const Origin origin = locator_.locate(path);
    std::string message = origin.where + ": " + path + " = " + value;
    if (origin.is_default) message += " (the default)";
    throw ConfigError(message + ": " + problem);
  }

  void check(bool ok, const std::string& path, const std::string& value,
             const std::string& problem) const {
    if (!ok) fail(path, value, problem);
  }
  void check(bool ok, const std::string& path, double value, const std::string& problem) const {
    if (!ok) fail(path, number_text(value), problem);
  }

  void run() const {
    check(context_.world_size >= 1, "train.batch_per_gpu", std::to_string(context_.world_size),
          "the job reports fewer than 1 rank");
    const std::string& name = experiment_.name();
    // The name is a directory's (runs/<name>): at most NAME_MAX bytes, and shown cut short.
    check(name.size() <= kMaxNameLength, "name",
          quote(name.substr(0, 40)) + "... (" + std::to_string(name.size()) + " characters)",
          "must be at most " + std::to_string(kMaxNameLength) +
              " characters (it names the run's directory, runs/<name>)");
    check(!name.empty() && name.find('/') == std::string::npos, "name", quote(name),
          "must be non-empty and contain no '/' (it names directories)");
    const bool on_cpu = check_device();
    if (const auto problem = find_range_problem(experiment_)) {
      fail(problem->path, problem->value, problem->problem);
    }
    check_model();
    check_data();
    check_optimizer();
    check_schedule();
    check_precision(on_cpu);
    check(!(on_cpu && experiment_.parallel().backend() == ParallelConfig::NCCL), "parallel.backend",
          "NCCL", "NCCL needs CUDA and training runs on the CPU; use MPI or AUTO");
    check(!experiment_.parallel().allreduce_in_half() ||
              experiment_.parallel().compression() == ParallelConfig::HALF,
          "parallel.allreduce_in_half", "true",
          "is the deprecated spelling of parallel.compression: HALF, and parallel.compression "
          "is " +
              ParallelConfig::Compression_Name(experiment_.parallel().compression()) +
              ": drop allreduce_in_half");
    // ZeRO reduce-scatters the gradients in their own dtype: no strategy compresses them.
    check(experiment_.parallel().zero_stage() == 0 ||
              experiment_.parallel().compression() == ParallelConfig::NONE,
          "parallel.compression",
          ParallelConfig::Compression_Name(experiment_.parallel().compression()),
          "is not supported with parallel.zero_stage " +
              std::to_string(experiment_.parallel().zero_stage()) +
              " (ZeRO reduce-scatters the gradients in their own dtype): set "
              "parallel.compression: NONE or parallel.zero_stage: 0");
    check(!experiment_.parallel().zero3_gather_once_per_step() ||
              experiment_.parallel().zero_stage() == 3,
          "parallel.zero3_gather_once_per_step", "true",
          "shapes ZeRO-3's weight gathers and parallel.zero_stage is " +
              std::to_string(experiment_.parallel().zero_stage()) +
              ": set parallel.zero_stage: 3 or drop it");
    check_train();
    check(!experiment_.parallel().zero_accumulate_in_shards() ||
              experiment_.parallel().zero_stage() >= 2,
          "parallel.zero_accumulate_in_shards", "true",
          "adds each micro-step's gradients into ZeRO's shards and parallel.zero_stage is " +
              std::to_string(experiment_.parallel().zero_stage()) +
              " (whole gradients kept between steps): set parallel.zero_stage: 2 or 3, or drop it");
    check_checkpoint();
    check(!experiment_.logging().dir().empty(), "logging.dir", "\"\"", "must be a directory");
  }

 private:
  static constexpr std::size_t kMaxNameLength = 255;  // NAME_MAX on Linux file systems

  // Returns true when training runs on the CPU.
  bool check_device() const {
    const TrainConfig::Device device = experiment_.train().device();
    const bool cuda =
        context_.cuda_available || (context_.assume_named_device && device == TrainConfig::CUDA);
    check(device != TrainConfig::CUDA || cuda, "train.device", "CUDA",
          "no CUDA device is usable by this process; use CPU or AUTO, or check "
          "CUDA_VISIBLE_DEVICES and the driver");
    return device == TrainConfig::CPU || (device == TrainConfig::AUTO && !cuda);
  }

  // A path the experiment names must be of the kind it names: "" when it is, else the problem
  // ("no such file ...", "is a character device, not a safetensors file ...").
  static std::string path_problem(const std::string& path, PathKind want, const std::string& what,
                                  const std::string& missing) {
    std::string kind;
    const PathKind found = path_kind(path, &kind);
    if (found == want) return "";
    if (found == PathKind::kMissing) return missing;
    return "is " + kind + ", not " + what;
  }

  // model.init_from: a safetensors file, or a transformers model folder (config.json and
  // model.safetensors or model.safetensors.index.json; what they hold is read at load time).
  static std::string init_from_problem(const std::string& path) {
    static const std::string kWhat =
        " (a safetensors file, or a transformers model folder: config.json with "
        "model.safetensors or model.safetensors.index.json)";
    if (path_kind(path, nullptr) != PathKind::kDirectory) {
      return path_problem(path, PathKind::kRegular,
                          "a safetensors file or a transformers model folder",
                          "no such file or directory" + kWhat + ", or \"\" for random init");
    }
    const std::filesystem::path dir(path);
    if (path_kind((dir / "config.json").string(), nullptr) != PathKind::kRegular) {
      return "is a directory without config.json" + kWhat;
    }
    if (path_kind((dir / "model.safetensors").string(), nullptr) != PathKind::kRegular &&
        path_kind((dir / "model.safetensors.index.json").string(), nullptr) != PathKind::kRegular) {
      return "is a directory with config.json but no model.safetensors nor "
             "model.safetensors.index.json" +
             kWhat;
    }
    return "";
  }

  void check_model() const {
    const ModelConfig& model = experiment_.model();
    const DataConfig::Kind kind = experiment_.data().kind();
    check(kind != DataConfig::LLMC_SHARDS || is_causal_lm(model.name()), "data.kind", "LLMC_SHARDS",
          "llm.c token shards are next-token data for the GPT-2 models (gpt2, gpt2_medium, "
          "gpt2_large, gpt2_xl) and the llama family (llama, qwen2, qwen2_5_*, llama3_*); "
          "model.name is " +
              quote(model.name()));
    check(experiment_.train().lm_head_chunks() <= 1 || is_causal_lm(model.name()),
          "train.lm_head_chunks", std::to_string(experiment_.train().lm_head_chunks()),
          "chunks of the language-model head are for the causal language models (GPT-2, the llama "
          "family); model.name is " +
              quote(model.name()) + ": leave it at 1");
    if (model.name() == "bert_base") {
      const BertShape& bert = model.bert();
      check(bert.hidden_size() % bert.num_heads() == 0, "model.bert.hidden_size",
            std::to_string(bert.hidden_size()),
            "must be a multiple of model.bert.num_heads = " + std::to_string(bert.num_heads()));
      check(kind == DataConfig::TOKENS || kind == DataConfig::SYNTHETIC, "data.kind",
            DataConfig::Kind_Name(kind), "bert_base needs TOKENS or SYNTHETIC data");
    } else if (is_gpt_model(model.name())) {
      const GptShape& gpt = model.gpt();
      check(gpt.hidden_size() % gpt.num_heads() == 0, "model.gpt.hidden_size",
            std::to_string(gpt.hidden_size()),
            "must be a multiple of model.gpt.num_heads = " + std::to_string(gpt.num_heads()));
      check(gpt.seq_len() <= gpt.max_positions(), "model.gpt.seq_len",
            std::to_string(gpt.seq_len()),
            "must be at most model.gpt.max_positions = " + std::to_string(gpt.max_positions()));
      check(kind == DataConfig::TOKENS || kind == DataConfig::LLMC_SHARDS ||
                kind == DataConfig::SYNTHETIC,
            "data.kind", DataConfig::Kind_Name(kind),
            model.name() + " needs TOKENS, LLMC_SHARDS or SYNTHETIC data");
    } else if (is_llama_model(model.name())) {
      const LlamaShape& l = model.llama();
      check(l.num_heads() % l.num_kv_heads() == 0, "model.llama.num_heads",
            std::to_string(l.num_heads()),
            "must be a multiple of model.llama.num_kv_heads = " + std::to_string(l.num_kv_heads()));
      check(l.head_dim() % 2 == 0, "model.llama.head_dim", std::to_string(l.head_dim()),
            "must be even (rotary positions rotate pairs of columns)");
      check(l.has_head_dim() || l.hidden_size() % l.num_heads() == 0, "model.llama.hidden_size",
            std::to_string(l.hidden_size()),
            "must be a multiple of model.llama.num_heads = " + std::to_string(l.num_heads()) +
                " unless model.llama.head_dim is given");
      check(l.seq_len() <= l.max_positions(), "model.llama.seq_len", std::to_string(l.seq_len()),
            "must be at most model.llama.max_positions = " + std::to_string(l.max_positions()));
      check(kind == DataConfig::TOKENS || kind == DataConfig::LLMC_SHARDS ||
                kind == DataConfig::SYNTHETIC,
            "data.kind", DataConfig::Kind_Name(kind),
            model.name() + " needs TOKENS, LLMC_SHARDS or SYNTHETIC data");
    } else {
      if (model.name() == "vit_b16") {
        check(model.image_size() % 16 == 0, "model.image_size", std::to_string(model.image_size()),
              "vit_b16 needs a multiple of the 16-pixel patch");
      }
      check(kind != DataConfig::TOKENS, "data.kind", "TOKENS",
            "model " + model.name() +
                " takes images; TOKENS data needs a language model (bert_base, gpt2*, the llama "
                "family)");
    }
    if (!model.init_from().empty()) {
      check(init_from_problem(model.init_from()).empty(), "model.init_from",
            quote(model.init_from()), init_from_problem(model.init_from()));
    }
  }

  void check_data() const {
    const DataConfig& data = experiment_.data();
    const std::string kind = DataConfig::Kind_Name(data.kind());
    if (data.kind() == DataConfig::LLMC_SHARDS) {
      check(!data.path().empty(), "data.path", "\"\"",
            "a glob of the training shards is required for LLMC_SHARDS (e.g. " +
                quote(kShardGlobExample) + ")");
      check_shard_glob("data.path", data.path());
      if (data.eval_split() == "test") {
        check(!data.eval_path().empty(), "data.eval_path", "\"\"",
              "no default: data.path " + quote(data.path()) +
                  " holds no \"train\" to replace by \"val\"; set data.eval_path to the "
                  "validation shards' glob, or data.eval_split to \"train\" or \"none\"");
        check_shard_glob("data.eval_path", data.eval_path());
      }
    } else if (data.kind() != DataConfig::SYNTHETIC) {
      check(!data.path().empty(), "data.path", "\"\"",
            "a dataset directory is required for " + kind);
      const std::string problem =
          path_problem(data.path(), PathKind::kDirectory, "a directory", "no such directory");
      check(problem.empty(), "data.path", quote(data.path()),
            problem + " (the " + kind + " dataset)");
    }
    if (data.has_document_boundary_token()) {
      const std::string token = std::to_string(data.document_boundary_token());
      const std::string& model = experiment_.model().name();
      check(is_llama_model(model), "data.document_boundary_token", token,
            "packed documents need rotary positions that restart per document: the llama family "
            "(llama, qwen2, qwen2_5_*, llama3_*); model.name is " +
                quote(model) + (is_gpt_model(model) ? " (GPT-2's learned positions cannot)" : ""));
      check(data.kind() == DataConfig::LLMC_SHARDS || data.kind() == DataConfig::TOKENS ||
                data.kind() == DataConfig::SYNTHETIC,
            "data.document_boundary_token", token,
            "applies to token data (LLMC_SHARDS, TOKENS, SYNTHETIC); data.kind is " + kind);
      check(data.document_boundary_token() >= 0 || data.kind() == DataConfig::LLMC_SHARDS,
            "data.document_boundary_token", token,
            "-1 (the first shard's first token) needs LLMC_SHARDS; give the token's id");
      check(!is_llama_model(model) ||
                data.document_boundary_token() < experiment_.model().llama().vocab_size(),
            "data.document_boundary_token", token,
            "must be below model.llama.vocab_size = " +
                std::to_string(experiment_.model().llama().vocab_size()));
    }
    check(!data.has_eval_path() || data.kind() == DataConfig::LLMC_SHARDS, "data.eval_path",
          quote(data.eval_path()),
          "applies to LLMC_SHARDS only (data.kind is " + kind +
              "; other kinds evaluate the split data.eval_split names)");
    const AugmentationConfig& augmentation = data.augmentation();
    const int channels = experiment_.model().image_channels();
    check(augmentation.normalize_mean_size() == augmentation.normalize_std_size(),
          "data.augmentation.normalize_std", list(augmentation.normalize_std()),
          "needs as many values as normalize_mean (" +
              std::to_string(augmentation.normalize_mean_size()) + ")");
    if (augmentation.normalize_mean_size() > 0) {
      check(augmentation.normalize_mean_size() == channels, "data.augmentation.normalize_mean",
            list(augmentation.normalize_mean()),
            "needs one value per image channel (model.image_channels = " +
                std::to_string(channels) + ")");
    }
    const auto& scale = augmentation.random_resized_crop_scale();
    if (!scale.empty()) {
      check(scale.size() == 2 && scale[0] <= scale[1],
            "data.augmentation.random_resized_crop_scale", list(scale),
            "needs two values min, max with 0 < min <= max <= 1 (e.g. 0.08, 1)");
    }
  }

  static constexpr const char* kShardGlobExample = "/data/fineweb10B/fineweb_train_*.bin";

  // A glob of llm.c shards must match at least one regular file; the dataset then checks each.
  void check_shard_glob(const std::string& field, const std::string& pattern) const {
    const std::vector<std::string> matches = glob_matches(pattern);
    std::string first_kind;
    for (const std::string& match : matches) {
      std::string described;
      if (path_kind(match, &described) == PathKind::kRegular) return;
      if (first_kind.empty()) first_kind = match + " is " + described;
    }
    const std::string problem = matches.empty() ? "matches no file"
                                                : "matches " + std::to_string(matches.size()) +
                                                      (matches.size() == 1 ? " path" : " paths") +
                                                      ", none a regular file (" + first_kind + ")";
    fail(field, quote(pattern),
         problem + "; LLMC_SHARDS needs a glob of llm.c token shards, such as " +
             quote(kShardGlobExample));
  }

  template <typename Values>
  static std::string list(const Values& values) {
    std::vector<std::string> items;
    for (const auto& value : values) items.push_back(number_text(value));
    return "[" + join(items, ", ") + "]";
  }

  void check_optimizer() const {
    const OptimizerConfig& optimizer = experiment_.optimizer();
    const std::string kind = OptimizerConfig::Kind_Name(optimizer.kind());
    check(optimizer.betas_size() == 2, "optimizer.betas", list(optimizer.betas()),
          "needs exactly two values: beta1, beta2");
    if (optimizer.nesterov()) {
      check(optimizer.kind() == OptimizerConfig::SGD, "optimizer.nesterov", "true",
            "applies to SGD only (optimizer.kind is " + kind + ")");
      check(optimizer.momentum() > 0, "optimizer.nesterov", "true", "needs optimizer.momentum > 0");
    }
    check(!optimizer.amsgrad() || optimizer.kind() == OptimizerConfig::ADAMW, "optimizer.amsgrad",
          "true", "applies to ADAMW only (optimizer.kind is " + kind + ")");
    for (int i = 0; i < optimizer.param_groups_size(); ++i) {
      check(!optimizer.param_groups(i).name_pattern().empty(),
            "optimizer.param_groups[" + std::to_string(i) + "].name_pattern", "\"\"",
            "required: a glob over parameter names such as \"*.bias\"");
    }
  }

  void check_schedule() const {
    const ScheduleConfig& schedule = experiment_.schedule();
    const TrainConfig& train = experiment_.train();
    if (train.has_steps() && schedule.warmup_steps() > 0) {
      check(schedule.warmup_steps() < train.steps(), "schedule.warmup_steps",
            std::to_string(schedule.warmup_steps()),
            "must be less than train.steps = " + std::to_string(train.steps()));
    }
    check(schedule.min_lr() <= experiment_.optimizer().lr(), "schedule.min_lr", schedule.min_lr(),
          "must be in [0, optimizer.lr = " + number_text(experiment_.optimizer().lr()) + "]");
    if (schedule.kind() == ScheduleConfig::STEP) {
      check(schedule.step_size() >= 1, "schedule.step_size", std::to_string(schedule.step_size()),
            "must be >= 1 with kind STEP");
    }
  }

  void check_precision(bool on_cpu) const {
    const PrecisionConfig& precision = experiment_.precision();
    const std::string level = PrecisionConfig::OptLevel_Name(precision.opt_level());
    if (on_cpu) {
      check(precision.opt_level() <= PrecisionConfig::O1, "precision.opt_level", level,
            "O2 and O3 need a GPU and training runs on the CPU; the CPU backend allows O0, "
            "or O1 with half BF16");
      check(
          precision.opt_level() == PrecisionConfig::O0 || precision.half() != PrecisionConfig::FP16,
          "precision.half", "FP16",
          "the CPU backend has no fp16 arithmetic; use BF16 or opt_level O0");
    }
    const std::string& model = experiment_.model().name();
    check(!precision.fp8().enabled() || is_gpt_model(model) || is_llama_model(model),
          "precision.fp8.enabled", "true",
          "FP8 projections are built for GPT-2 (gpt2*) and the llama family (llama, qwen2, "
          "qwen2_5_*, llama3_*), not " +
              model);
    const LossScaleConfig& scale = precision.loss_scale();
    const std::string prefix = "precision.loss_scale.";
    check(scale.min_scale() <= scale.init_scale(), prefix + "min_scale", scale.min_scale(),
          "must be in (0, init_scale = " + number_text(scale.init_scale()) + "]");
    check(scale.max_scale() >= scale.init_scale(), prefix + "max_scale", scale.max_scale(),
          "must be >= init_scale = " + number_text(scale.init_scale()));
  }

  void check_train() const {
    const TrainConfig& train = experiment_.train();
    if (train.has_epochs()) {
      check(experiment_.data().kind() != DataConfig::SYNTHETIC, "train.epochs", train.epochs(),
            "SYNTHETIC data has no epochs; set train.steps instead");
    }
    const BatchResult batches = compute_batches(experiment_, context_.world_size);
    if (!batches.problem.empty()) {
      const FieldDescriptor* field =
          TrainConfig::descriptor()->FindFieldByName(batches.field.substr(6));
      std::string value;
      pb::TextFormat::PrintFieldValueToString(train, field, -1, &value);
      fail(batches.field, value, batches.problem);
    }
    // The weights' host shards are ZeRO-3's, updated in place by the device's kernels.
    if (train.offload() == TrainConfig::OPTIMIZER_AND_WEIGHTS) {
      check(experiment_.parallel().zero_stage() == 3, "train.offload", "OPTIMIZER_AND_WEIGHTS",
            "keeps ZeRO-3's shards of the weights in host memory and parallel.zero_stage is " +
                std::to_string(experiment_.parallel().zero_stage()) +
                ": set parallel.zero_stage: 3 (one rank works too), or train.offload: OPTIMIZER");
      check(train.offload_update() == TrainConfig::DEVICE_KERNELS, "train.offload_update",
            "HOST_CORES",
            "is not supported with train.offload OPTIMIZER_AND_WEIGHTS (the device's kernels "
            "update the weights' shards where they are in host memory): set "
            "train.offload_update: DEVICE_KERNELS, or train.offload: OPTIMIZER");
    }
  }

  void check_checkpoint() const {
    const CheckpointConfig& checkpoint = experiment_.checkpoint();
    check(!checkpoint.dir().empty(), "checkpoint.dir", "\"\"", "must be a directory");
    const std::string& resume = checkpoint.resume();
    if (!resume.empty() && resume != "latest") {
      const std::string problem = path_problem(
          resume, PathKind::kDirectory, "a checkpoint directory",
          "no such checkpoint directory; allowed: \"\" (fresh), \"latest\", or an existing "
          "checkpoint path");
      check(problem.empty(), "checkpoint.resume", quote(resume), problem);
    }
  }

  const Experiment& experiment_;
  const ValidationContext& context_;
  FieldLocator locator_;
};

}  // namespace

void validate(const Experiment& experiment, const ValidationContext& context) {
  Validator(experiment, context).run();
}

BatchPlan plan_batches(const Experiment& experiment, int world_size) {
  const BatchResult result = compute_batches(experiment, world_size);
  if (!result.problem.empty()) throw ConfigError(result.field + ": " + result.problem);
  return result.plan;
}

}  // namespace kiln::config
