// kiln export --config FILE --onnx OUT.onnx [--checkpoint latest|DIR | --random-init]
//             [--opset 17] [--half] [--batch N | --dynamic-batch]:
// the experiment's model in eval mode as an ONNX graph (infer/onnx_export.h, docs/deploy.md),
// with the preprocessing it expects in metadata_props.
// kiln export --config FILE --hf DIR [--checkpoint latest|DIR | --random-init]
//             [--dtype auto|fp32|bf16|fp16] [--max-shard-size 5GB]:
// a GPT-2 or llama-family model as a transformers model folder (infer/hf_export.h,
// docs/llama.md), LoRA adapters merged into it; with --lora-only the adapters alone as a PEFT
// folder (infer/lora_export.h, docs/finetune.md). Without --checkpoint: the newest checkpoint,
// else model.init_from's weights.
// Runs on the CPU whatever train.device says.

#include <boost/program_options.hpp>

#include <cstdio>
#include <iostream>
#include <sstream>

#include "configs/experiment.h"
#include "configs/hf_config.h"
#include "core/check.h"
#include "core/file_kind.h"
#include "core/safetensors.h"
#include "core/system_info.h"
#include "infer/hf_export.h"
#include "infer/lora_export.h"
#include "infer/onnx_export.h"
#include "launch/commands.h"
#include "train/checkpoint.h"
#include "train/init_from.h"
#include "train/model_options.h"
#include "train/parameter_loader.h"

namespace po = boost::program_options;

namespace kiln::launch {
namespace {

std::string join(const google::protobuf::RepeatedField<float>& values) {
  std::ostringstream os;
  for (int i = 0; i < values.size(); ++i) os << (i ? "," : "") << values.Get(i);
  return os.str();
}

// What a runtime must do to an input before the graph sees it, and what comes out.
std::vector<std::pair<std::string, std::string>> metadata(const config::Experiment& e,
                                                          const Model& model,
                                                          const std::string& source,
                                                          std::int64_t step, bool half) {
  std::vector<std::pair<std::string, std::string>> m = {
      {"kiln.model", e.model().name()},
      {"kiln.experiment", e.name()},
      {"kiln.weights", source},
      {"kiln.step", std::to_string(step)},
      {"kiln.precision", half ? "fp16" : "fp32"},
      {"kiln.task", model.task == Task::MaskedLM ? "masked_lm" : "classification"},
  };
  if (model.input_dtype == DType::I64) {
    m.push_back({"input.layout", "NT (token ids, int64)"});
    m.push_back({"input.seq_len", std::to_string(model.sample_shape.at(0))});
    m.push_back({"output.vocab_size", std::to_string(model.num_outputs)});
    return m;
  }
  const auto& aug = e.data().augmentation();
  m.push_back({"input.layout", "NCHW"});
  m.push_back({"input.image_channels", std::to_string(model.sample_shape.at(0))});
  m.push_back({"input.image_size", std::to_string(model.sample_shape.at(1))});
  m.push_back({"input.pixel_scale", "1/255 (pixels scaled to [0, 1] before normalisation)"});
  m.push_back(
      {"input.normalize_mean", aug.normalize_mean_size() ? join(aug.normalize_mean()) : "none"});
  m.push_back(
      {"input.normalize_std", aug.normalize_std_size() ? join(aug.normalize_std()) : "none"});
  m.push_back({"output.num_classes", std::to_string(model.num_outputs)});
  return m;
}

// Where the exported weights come from, loaded into `model`.
struct Weights {
  std::string source;
  std::int64_t step = 0;
};

// --random-init: train.seed's; --checkpoint DIR: that checkpoint; --checkpoint latest (typed):
// the newest complete one, or an error; not typed: the newest, else model.init_from, else an
// error (as kiln eval and kiln sample choose).
Weights load_weights(const config::Experiment& e, const po::variables_map& vm, Model& model) {
  model.net->reset_parameters(e.train().seed());
  if (vm.count("random-init")) {
    return {"random-init (train.seed " + std::to_string(e.train().seed()) + ")", 0};
  }
  std::string path = vm["checkpoint"].as<std::string>();
  if (path == "latest") {
    train::CheckpointStore store(e.checkpoint().dir(), e.checkpoint().keep_last());
    std::string note;
    auto latest = store.latest_for_reading("--checkpoint", &note);
    if (!note.empty()) std::cerr << "kiln export: " << note << "\n";
    if (!latest && vm["checkpoint"].defaulted() && !e.model().init_from().empty()) {
      std::cerr << "kiln export: no checkpoint in " << store.dir() << ": exporting model.init_from "
                << e.model().init_from() << "\n";
      train::load_init_from(e.model(), *model.net);
      return {"model.init_from " + e.model().init_from(), 0};
    }
    if (!latest) {
      throw InputError("--checkpoint latest: no complete checkpoint in " + store.dir() +
                       " (checkpoint.dir); train first, name one with --checkpoint DIR, "
                       "export untrained weights with --random-init, or set model.init_from");
    }
    path = *latest;
  }
  train::Checkpoint c = train::load_model_checkpoint(path, e.model().name(), *model.net);
  return {path, c.state.step()};
}

// --dtype auto: the half type the experiment trains its weights in (O2, O3), else fp32. Without
// the experiment (`e` null), only the name is checked.
DType hf_dtype(const std::string& name, const config::Experiment* e) {
  if (name == "fp32") return DType::F32;
  if (name == "bf16") return DType::BF16;
  if (name == "fp16") return DType::F16;
  if (name != "auto") {
    throw InputError("--dtype '" + name + "': expected auto, fp32, bf16 or fp16");
  }
  if (e == nullptr) return DType::F32;
  const auto level = e->precision().opt_level();
  if (level != config::PrecisionConfig::O2 && level != config::PrecisionConfig::O3) {
    return DType::F32;
  }
  return e->precision().half() == config::PrecisionConfig::BF16 ? DType::BF16 : DType::F16;
}

const char* torch_dtype(DType t) {
  return t == DType::BF16 ? "bfloat16" : t == DType::F16 ? "float16" : "float32";
}

int export_hf(const config::Experiment& e, const po::variables_map& vm) {
  const std::string dir = vm["hf"].as<std::string>();
  if (!config::is_causal_lm(e.model().name())) {
    throw InputError("--hf: model " + e.model().name() +
                     " has no transformers causal-LM class; Hugging Face folders are written "
                     "for gpt2* and the llama family (llama, qwen2, qwen2_5_*, llama3_*)");
  }
  infer::HfFolderOptions options;
  options.max_shard_bytes =
      infer::parse_byte_size(vm["max-shard-size"].as<std::string>(), "--max-shard-size");
  const bool lora_only = vm.count("lora-only") > 0;
  // Adapters are trained through fp32 masters: --lora-only keeps them in fp32 unless told.
  const DType dtype = lora_only && vm["dtype"].defaulted()
                          ? DType::F32
                          : hf_dtype(vm["dtype"].as<std::string>(), &e);
  options.config_json = config::hf_config_json(e.model(), torch_dtype(dtype));
  const ModelOptions model_options = train::model_options_from(e);
  if (lora_only && !model_options.lora.enabled()) {
    throw InputError("--lora-only: " + e.model().name() +
                     " has no LoRA adapters (model.lora.rank is 0)");
  }
  Model model = make_model(model_options);
  const Weights weights = load_weights(e, vm, model);
  // transformers' names are Kiln's; a tied head is one parameter (the embedding), as
  // save_pretrained leaves lm_head.weight out; GPT-2's Conv1D weights go back to (in, out).
  NamedTensors tensors;
  for (Parameter* p : model.net->parameters()) {
    tensors.emplace_back(p->name, train::stored_layout(*p).contiguous());
  }
  const NamedTensors stored = lora_only ? infer::peft_adapter_tensors(tensors)
                              : model_options.lora.enabled()
                                  ? infer::merge_lora_adapters(tensors, model_options.lora.scale())
                                  : tensors;
  NamedTensors cast;
  for (const auto& [name, value] : stored) cast.emplace_back(name, value.to(dtype).contiguous());
  const infer::HfFolderSummary summary =
      lora_only ? infer::write_peft_adapter_folder(dir, cast, model_options.lora)
                : infer::write_hf_folder(dir, cast, options);
  if (lora_only) {
    std::printf(
        "exported the LoRA adapters of %s (%s, step %lld) to %s: PEFT LORA r %d, alpha "
        "%g, %zu tensors, %s, %.1f MB\n",
        e.model().name().c_str(), weights.source.c_str(), static_cast<long long>(weights.step),
        dir.c_str(), model_options.lora.rank, model_options.lora.alpha, cast.size(),
        torch_dtype(dtype), static_cast<double>(summary.tensor_bytes) / 1e6);
    return 0;
  }
  std::printf("exported %s (%s, step %lld) to %s: %s, %s, %zu weight file(s), %.1f MB\n",
              e.model().name().c_str(), weights.source.c_str(),
              static_cast<long long>(weights.step), dir.c_str(),
              config::is_gpt_model(e.model().name())
                  ? "GPT2LMHeadModel"
                  : (e.model().llama().qkv_bias() ? "Qwen2ForCausalLM" : "LlamaForCausalLM"),
              torch_dtype(dtype), summary.weight_files.size(),
              static_cast<double>(summary.tensor_bytes) / 1e6);
  return 0;
}

int export_onnx(const config::Experiment& e, const po::variables_map& vm) {
  infer::OnnxExportOptions eo;
  eo.opset = vm["opset"].as<int>();
  eo.half = vm.count("half") > 0;
  if (vm.count("batch")) {
    eo.batch = vm["batch"].as<std::int64_t>();
    if (eo.batch < 1) throw InputError("--batch " + std::to_string(eo.batch) + ": must be >= 1");
  }
  Model model = make_model(train::model_options_from(e));
  const Weights weights = load_weights(e, vm, model);
  eo.graph_name = e.name().empty() ? e.model().name() : e.name();
  eo.producer_version = kiln_version();
  eo.metadata = metadata(e, model, weights.source, weights.step, eo.half);
  const std::string out = vm["onnx"].as<std::string>();
  std::string bytes = infer::export_onnx(model, eo);
  write_file_atomically(out, bytes);
  std::printf("exported %s (%s, step %lld) to %s: opset %d, %s, batch %s, %.1f MB\n",
              e.model().name().c_str(), weights.source.c_str(),
              static_cast<long long>(weights.step), out.c_str(), eo.opset,
              eo.half ? "fp16" : "fp32", eo.batch ? std::to_string(eo.batch).c_str() : "dynamic",
              static_cast<double>(bytes.size()) / 1e6);
  return 0;
}

}  // namespace

int run_export(const Arguments& args) {
  po::options_description options(
      "kiln export: the eval-mode model as ONNX, or a transformers model folder");
  options.add_options()("help,h", "show this help")("config", po::value<std::string>()->required(),
                                                    "experiment file (protobuf text)")(
      "set", po::value<std::vector<std::string>>()->composing(),
      "override a field by its path: --set model.num_classes=5 (repeatable)")(
      "checkpoint", po::value<std::string>()->default_value("latest"),
      "weights: latest (the newest complete checkpoint of the experiment; not typed and none "
      "there: model.init_from) or a directory")(
      "random-init", "untrained weights from train.seed instead of a checkpoint (tests)")(
      "onnx", po::value<std::string>(), "ONNX output file (written atomically)")(
      "opset", po::value<int>()->default_value(17), "ONNX opset, 17 to 21")(
      "half", "ONNX: fp16 weights, input and output")("batch", po::value<std::int64_t>(),
                                                      "ONNX: fixed batch size (default: dynamic)")(
      "dynamic-batch", "ONNX: a dynamic batch dimension named 'batch' (the default)")(
      "hf", po::value<std::string>(),
      "a new transformers model folder (config.json and safetensors; gpt2* and the llama "
      "family), written under a temporary name and renamed when complete")(
      "dtype", po::value<std::string>()->default_value("auto"),
      "--hf weights: fp32, bf16, fp16, or auto (the experiment's half type at O2/O3, else fp32)")(
      "max-shard-size", po::value<std::string>()->default_value("5GB"),
      "--hf: weight files of at most this size (5GB = 5e9 bytes, 2GiB, 500MB); more than one "
      "file gets model.safetensors.index.json")(
      "lora-only",
      "--hf: the LoRA adapters alone, as a PEFT folder (adapter_config.json, "
      "adapter_model.safetensors; fp32 unless --dtype says); without it --hf merges them");
  po::variables_map vm;
  po::store(po::command_line_parser(args).options(options).run(), vm);
  if (vm.count("help")) {
    std::cout << "usage: kiln export --config FILE (--onnx OUT.onnx [--opset 17] [--half] "
                 "[--batch N | --dynamic-batch] | --hf DIR [--dtype auto|fp32|bf16|fp16] "
                 "[--max-shard-size 5GB] [--lora-only]) [--checkpoint latest|DIR | --random-init] "
                 "[--set ...]\n\n"
              << options << "\n";
    return 0;
  }
  po::notify(vm);
  const bool onnx = vm.count("onnx") > 0, hf = vm.count("hf") > 0;
  if (onnx == hf) {
    throw InputError(onnx ? "--onnx and --hf exclude each other: one export per command"
                          : "kiln export needs --onnx OUT.onnx or --hf DIR (see --help)");
  }
  for (const char* only_onnx : {"half", "batch", "dynamic-batch"}) {
    if (hf && vm.count(only_onnx)) {
      throw InputError(std::string("--") + only_onnx + " is an ONNX option; --hf takes --dtype");
    }
  }
  if (hf && !vm["opset"].defaulted()) throw InputError("--opset is an ONNX option, not --hf's");
  if (onnx && vm.count("lora-only")) throw InputError("--lora-only is an option of --hf");
  for (const char* only_hf : {"dtype", "max-shard-size"}) {
    if (onnx && !vm[only_hf].defaulted()) {
      throw InputError(std::string("--") + only_hf + " is an option of --hf, not of --onnx");
    }
  }
  const std::string config_path = vm["config"].as<std::string>();
  std::vector<std::string> overrides;
  if (vm.count("set")) overrides = vm["set"].as<std::vector<std::string>>();
  if (vm.count("random-init") && !vm["checkpoint"].defaulted()) {
    throw InputError("--random-init and --checkpoint exclude each other");
  }
  if (vm.count("batch") && vm.count("dynamic-batch")) {
    throw InputError("--batch and --dynamic-batch exclude each other");
  }
  // Refused before the work, not after: a device node or FIFO at --onnx is never replaced.
  if (onnx) require_replaceable_file(vm["onnx"].as<std::string>(), "--onnx");
  if (hf) {
    infer::parse_byte_size(vm["max-shard-size"].as<std::string>(), "--max-shard-size");
    hf_dtype(vm["dtype"].as<std::string>(), nullptr);
  }
  config::Experiment e = config::load_experiment(config_path, overrides);
  // Export uses no device: an experiment written for GPUs validates here as on its own machine.
  config::validate(e, {1, true, config_path, overrides});
  return hf ? export_hf(e, vm) : export_onnx(e, vm);
}

}  // namespace kiln::launch
