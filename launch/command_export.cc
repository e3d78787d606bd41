// kiln export --config FILE --onnx OUT.onnx [--checkpoint latest|DIR | --random-init]
//             [--opset 17] [--half] [--batch N | --dynamic-batch]:
// the experiment's model in eval mode as an ONNX graph (infer/onnx_export.h, docs/deploy.md),
// with the preprocessing it expects in metadata_props. Runs on the CPU whatever train.device says.

#include <boost/program_options.hpp>

#include <cstdio>
#include <iostream>
#include <sstream>

#include "configs/experiment.h"
#include "core/check.h"
#include "core/file_kind.h"
#include "core/safetensors.h"
#include "core/system_info.h"
#include "infer/onnx_export.h"
#include "launch/commands.h"
#include "train/checkpoint.h"
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

}  // namespace

int run_export(const Arguments& args) {
  po::options_description options("kiln export: the eval-mode model as ONNX");
  options.add_options()("help,h", "show this help")("config", po::value<std::string>()->required(),
                                                    "experiment file (protobuf text)")(
      "set", po::value<std::vector<std::string>>()->composing(),
      "override a field by its path: --set model.num_classes=5 (repeatable)")(
      "checkpoint", po::value<std::string>()->default_value("latest"),
      "weights: latest (the newest complete checkpoint of the experiment) or a directory")(
      "random-init", "untrained weights from train.seed instead of a checkpoint (tests)")(
      "onnx", po::value<std::string>()->required(), "output file (written atomically)")(
      "opset", po::value<int>()->default_value(17), "ONNX opset, 17 to 21")(
      "half", "fp16 weights, input and output")("batch", po::value<std::int64_t>(),
                                                "fixed batch size (default: dynamic)")(
      "dynamic-batch", "a dynamic batch dimension named 'batch' (the default)");
  po::variables_map vm;
  po::store(po::command_line_parser(args).options(options).run(), vm);
  if (vm.count("help")) {
    std::cout
        << "usage: kiln export --config FILE --onnx OUT.onnx [--checkpoint latest|DIR | "
           "--random-init] [--opset 17] [--half] [--batch N | --dynamic-batch] [--set ...]\n\n"
        << options << "\n";
    return 0;
  }
  po::notify(vm);
  const std::string config_path = vm["config"].as<std::string>();
  std::vector<std::string> overrides;
  if (vm.count("set")) overrides = vm["set"].as<std::vector<std::string>>();
  const bool random_init = vm.count("random-init") > 0;
  if (random_init && !vm["checkpoint"].defaulted()) {
    throw InputError("--random-init and --checkpoint exclude each other");
  }
  if (vm.count("batch") && vm.count("dynamic-batch")) {
    throw InputError("--batch and --dynamic-batch exclude each other");
  }
  infer::OnnxExportOptions eo;
  eo.opset = vm["opset"].as<int>();
  eo.half = vm.count("half") > 0;
  if (vm.count("batch")) {
    eo.batch = vm["batch"].as<std::int64_t>();
    if (eo.batch < 1) throw InputError("--batch " + std::to_string(eo.batch) + ": must be >= 1");
  }

  // Refused before the work, not after: a device node or FIFO at --onnx is never replaced.
  require_replaceable_file(vm["onnx"].as<std::string>(), "--onnx");
  config::Experiment e = config::load_experiment(config_path, overrides);
  // Export uses no device: an experiment written for GPUs validates here as on its own machine.
  config::validate(e, {1, true, config_path, overrides});
  Model model = make_model(train::model_options_from(e));
  model.net->reset_parameters(e.train().seed());
  std::string source = "random-init (train.seed " + std::to_string(e.train().seed()) + ")";
  std::int64_t step = 0;
  if (!random_init) {
    std::string path = vm["checkpoint"].as<std::string>();
    if (path == "latest") {
      train::CheckpointStore store(e.checkpoint().dir(), e.checkpoint().keep_last());
      std::string note;
      auto latest = store.latest_for_reading("--checkpoint", &note);
      if (!note.empty()) std::cerr << "kiln export: " << note << "\n";
      if (!latest) {
        throw InputError("--checkpoint latest: no complete checkpoint in " + store.dir() +
                         " (checkpoint.dir); train first, name one with --checkpoint DIR, or "
                         "export untrained weights with --random-init");
      }
      path = *latest;
    }
    train::Checkpoint c = train::load_model_checkpoint(path, e.model().name(), *model.net);
    source = path;
    step = c.state.step();
  }
  eo.graph_name = e.name().empty() ? e.model().name() : e.name();
  eo.producer_version = kiln_version();
  eo.metadata = metadata(e, model, source, step, eo.half);
  const std::string out = vm["onnx"].as<std::string>();
  std::string bytes = infer::export_onnx(model, eo);
  write_file_atomically(out, bytes);
  std::printf("exported %s (%s, step %lld) to %s: opset %d, %s, batch %s, %.1f MB\n",
              e.model().name().c_str(), source.c_str(), static_cast<long long>(step), out.c_str(),
              eo.opset, eo.half ? "fp16" : "fp32",
              eo.batch ? std::to_string(eo.batch).c_str() : "dynamic",
              static_cast<double>(bytes.size()) / 1e6);
  return 0;
}

}  // namespace kiln::launch
