// kiln model --name NAME [--batch B] [--json]: the layers, output shapes, parameter count and
// FLOPs of a model.

#include <boost/program_options.hpp>

#include <cstdio>
#include <functional>
#include <iostream>

#include "core/json_writer.h"
#include "launch/commands.h"
#include "layers/models/model.h"
#include "train/model_options.h"

namespace po = boost::program_options;

namespace kiln::launch {
namespace {

struct Row {
  int depth;
  std::string name, type, output;
  std::int64_t parameters;
};

// Walks the layer tree; output shapes are known for the children of sequential containers.
void collect(Layer& layer, int depth, const Shape* input, std::vector<Row>& rows) {
  std::int64_t own = 0;
  for (Parameter* p : layer.parameters()) own += p->value.numel();
  Row row{depth, layer.name().empty() ? "(model)" : layer.name(), layer.type(),
          input ? shape_str(layer.output_shape(*input)) : "", own};
  rows.push_back(row);
  auto* seq = dynamic_cast<Sequential*>(&layer);
  Shape shape = input ? *input : Shape{};
  for (Layer* child : layer.children()) {
    bool known = seq != nullptr && input != nullptr;
    collect(*child, depth + 1, known ? &shape : nullptr, rows);
    if (known) shape = child->output_shape(shape);
  }
}

}  // namespace

int run_model(const Arguments& args) {
  po::options_description options("kiln model: describe a model");
  options.add_options()("help,h", "show this help")("name", po::value<std::string>()->required(),
                                                    "model name (kiln model --list)")(
      "list", "list the model names")("batch", po::value<int>()->default_value(1), "batch size")(
      "depth", po::value<int>()->default_value(2), "levels of the layer tree to print")(
      "num-classes", po::value<int>(), "classes (default: the model's)")(
      "seq-len", po::value<int>(), "BERT sequence length")("json", "print JSON");
  po::variables_map vm;
  po::store(po::command_line_parser(args).options(options).run(), vm);
  if (vm.count("help")) {
    std::cout << "usage: kiln model --name NAME [--batch B] [--json]\n\n" << options << "\n";
    return 0;
  }
  if (vm.count("list")) {
    for (const std::string& n : model_names()) std::cout << n << "\n";
    return 0;
  }
  po::notify(vm);
  ModelOptions mo = train::default_model_options(vm["name"].as<std::string>());
  if (vm.count("num-classes")) mo.num_classes = vm["num-classes"].as<int>();
  if (vm.count("seq-len")) mo.seq_len = vm["seq-len"].as<int>();
  Model model = make_model(mo);
  int batch = vm["batch"].as<int>();
  Shape input = model.sample_shape;
  input.insert(input.begin(), batch);
  std::vector<Row> rows;
  collect(*model.net, 0, &input, rows);
  std::int64_t parameters = model.net->parameter_count();
  double forward = model.net->forward_flops(input) / batch;
  double step = 3.0 * forward;  // backward costs twice the forward
  Shape output = model.net->output_shape(input);
  if (vm.count("json")) {
    JsonWriter j;
    j.begin_object();
    j.field("model", mo.name);
    j.field("parameters", static_cast<long long>(parameters));
    j.field("batch", batch);
    j.field("input_shape", shape_str(input));
    j.field("output_shape", shape_str(output));
    j.field("forward_flops_per_sample", forward);
    j.field("train_step_flops_per_sample", step);
    j.key("layers");
    j.begin_array();
    for (const Row& r : rows) {
      j.begin_object();
      j.field("name", r.name);
      j.field("type", r.type);
      j.field("depth", r.depth);
      j.field("output_shape", r.output);
      j.field("parameters", static_cast<long long>(r.parameters));
      j.end_object();
    }
    j.end_array();
    j.end_object();
    std::cout << j.str() << "\n";
    return 0;
  }
  int max_depth = vm["depth"].as<int>();
  std::printf("%-44s %-22s %-22s %14s\n", "layer", "type", "output", "parameters");
  for (const Row& r : rows) {
    if (r.depth > max_depth) continue;
    std::string name = std::string(2 * r.depth, ' ') + r.name;
    std::printf("%-44s %-22s %-22s %14lld\n", name.c_str(), r.type.c_str(), r.output.c_str(),
                static_cast<long long>(r.parameters));
  }
  std::printf("\nmodel %s: %lld parameters, input %s -> output %s\n", mo.name.c_str(),
              static_cast<long long>(parameters), shape_str(input).c_str(),
              shape_str(output).c_str());
  std::printf("FLOPs per sample: forward %.3f GFLOP, training step %.3f GFLOP\n", forward / 1e9,
              step / 1e9);
  return 0;
}

}  // namespace kiln::launch
