#include "train/parameter_loader.h"

#include <google/protobuf/text_format.h>
#include <google/protobuf/util/message_differencer.h>

#include <filesystem>

#include <utility>

#include "core/check.h"

namespace kiln::train {

void load_named_tensors(const NamedTensorSource& source, const std::vector<Parameter*>& parameters,
                        const std::vector<Buffer*>& buffers, bool buffers_required) {
  static const std::string kBaseModelPrefix = "transformer.";
  const auto find = [&](const std::string& kind, const std::string& name,
                        const Shape& shape) -> const Tensor* {
    auto it = source.tensors->find(name);
    if (it == source.tensors->end() && name.rfind(kBaseModelPrefix, 0) == 0) {
      it = source.tensors->find(name.substr(kBaseModelPrefix.size()));
    }
    if (it == source.tensors->end()) {
      throw InputError(source.file + ": " + kind + " '" + name + "' is missing" + source.what);
    }
    if (it->second.shape() != shape) {
      throw InputError(source.file + ": " + kind + " '" + name + "' has shape " +
                       shape_str(it->second.shape()) + ", the model needs " + shape_str(shape) +
                       source.what);
    }
    return &it->second;
  };
  for (Parameter* p : parameters) {
    const Tensor& stored = *find("parameter", p->name, stored_shape(*p));
    p->value.copy_from(p->stored_transposed ? stored.transpose(0, 1) : stored);
  }
  for (Buffer* b : buffers) {
    if (buffers_required) {
      b->value.copy_from(*find("buffer", b->name, b->value.shape()));
      continue;
    }
    auto it = source.tensors->find(b->name);
    if (it != source.tensors->end() && it->second.shape() == b->value.shape()) {
      b->value.copy_from(it->second);
    }
  }
}

Checkpoint load_model_checkpoint(const std::string& path, const std::string& model_name,
                                 Layer& net) {
  Checkpoint c = CheckpointStore::load(path);
  if (c.state.model_name() != model_name) {
    throw InputError(path + ": checkpoint of model '" + c.state.model_name() +
                     "', this experiment's model is '" + model_name + "'");
  }
  load_named_tensors({path + "/model.safetensors", &c.model.tensors,
                      " (a checkpoint of a different model configuration)"},
                     net.parameters(), net.buffers(), true);
  return c;
}

Shape stored_shape(const Parameter& p) {
  Shape s = p.value.shape();
  if (p.stored_transposed) std::swap(s.at(0), s.at(1));
  return s;
}

Tensor stored_layout(const Parameter& p) {
  return p.stored_transposed ? p.value.transpose(0, 1).contiguous() : p.value;
}

std::string checkpoint_to_read(const config::Experiment& e, const std::string& choice) {
  if (choice != "latest") return choice;
  const CheckpointStore store(e.checkpoint().dir(), e.checkpoint().keep_last());
  return store.latest().value_or("");
}

std::string take_checkpoint_model(config::Experiment& e, const std::string& checkpoint,
                                  const std::vector<std::string>& overrides) {
  if (checkpoint.empty()) return "";
  const std::string state_path = checkpoint + "/state.pbtxt";
  std::error_code error;
  if (!std::filesystem::is_regular_file(state_path, error)) return "";
  config::CheckpointState state;
  if (!google::protobuf::TextFormat::ParseFromString(read_file(state_path), &state) ||
      !state.has_experiment() || state.experiment().model().name() != e.model().name()) {
    return "";
  }
  config::ModelConfig model = state.experiment().model();
  model.set_init_from(e.model().init_from());
  if (google::protobuf::util::MessageDifferencer::Equals(model, e.model())) return "";
  *e.mutable_model() = model;
  bool overridden = false;
  for (const std::string& assignment : overrides) {
    if (assignment.rfind("model.", 0) != 0) continue;
    config::apply_override(e, assignment);
    overridden = true;
  }
  config::fill_defaults(e);
  return "the model's settings (model.*) come from the experiment recorded in " + state_path +
         (overridden ? ", with this command line's model.* overrides on top" : "");
}

}  // namespace kiln::train
