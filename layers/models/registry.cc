#include <functional>
#include <map>
#include <utility>

#include "core/check.h"
#include "layers/models/model.h"

namespace kiln {
namespace {

using Factory = std::function<Model(const ModelOptions&)>;

// Filled explicitly, not by static initialisers, so no model can go missing at link time.
const std::map<std::string, Factory>& registry() {
  static const std::map<std::string, Factory> table = {
      {"mlp", make_mlp},
      {"fashion_cnn", make_fashion_cnn},
      {"resnet18", [](const ModelOptions& o) { return make_resnet(o, 18); }},
      {"resnet50", [](const ModelOptions& o) { return make_resnet(o, 50); }},
      {"bert_base", make_bert},
      {"vit_b16", make_vit_b16},
      {"gpt2", make_gpt2},
      {"gpt2_medium", make_gpt2},
      {"gpt2_large", make_gpt2},
      {"gpt2_xl", make_gpt2},
      {"llama", make_llama},
      {"qwen2", make_llama},
      {"qwen2_5_0_5b", make_llama},
      {"qwen2_5_1_5b", make_llama},
      {"qwen2_5_3b", make_llama},
      {"qwen2_5_7b", make_llama},
      {"llama3_2_1b", make_llama},
      {"llama3_2_3b", make_llama},
      {"llama3_1_8b", make_llama},
  };
  return table;
}

}  // namespace

const std::vector<std::string>& model_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& [name, factory] : registry()) v.push_back(name);
    return v;
  }();
  return names;
}

Model make_model(const ModelOptions& options) {
  auto it = registry().find(options.name);
  if (it == registry().end()) {
    std::string known;
    for (const auto& n : model_names()) known += (known.empty() ? "" : ", ") + n;
    throw InputError("unknown model '" + options.name + "' (known: " + known + ")");
  }
  Model m = it->second(options);
  m.net->set_name("");
  return m;
}

Model token_model(std::unique_ptr<Layer> net, const ModelOptions& options, Task task) {
  Model m;
  m.net = std::move(net);
  m.net->set_name("");
  if (!ParameterShapesOnly::active()) m.net->reset_parameters(0);
  m.sample_shape = {options.seq_len};
  m.input_dtype = DType::I64;
  m.task = task;
  m.num_outputs = options.vocab_size;
  m.max_positions = task == Task::CausalLM ? options.max_positions : 0;
  return m;
}

Model image_model(std::unique_ptr<Layer> net, const ModelOptions& options) {
  Model m;
  m.net = std::move(net);
  m.net->set_name("");
  if (!ParameterShapesOnly::active()) m.net->reset_parameters(0);
  m.sample_shape = {options.image_channels, options.image_size, options.image_size};
  m.input_dtype = DType::F32;
  m.task = Task::Classification;
  m.num_outputs = options.num_classes;
  return m;
}

}  // namespace kiln
