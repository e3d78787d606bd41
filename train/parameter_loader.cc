#include "train/parameter_loader.h"

#include <google/protobuf/text_format.h>
#include <google/protobuf/util/message_differencer.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <utility>

#include "core/check.h"

namespace kiln::train {
namespace {

// A file's tensor fits a model's tensor when the dtypes are the same or both floating point (a
// float32 checkpoint into bf16 weights, an fp16 Hub file into float32 ones: the values are
// rounded, never reinterpreted); integers are never read as weights, nor weights as integers.
// One exception: a buffer Kiln counts in floating point that PyTorch keeps as an integer (batch
// norm's num_batches_tracked, int64 in PyTorch's files).
// Floating-point values must be finite: a NaN or inf weight would train to NaN from step 1.
void check_loadable(const NamedTensorSource& source, const std::string& kind,
                    const std::string& name, const Tensor& stored, DType target) {
  const DType have = stored.dtype();
  const bool integer_counter = kind == "buffer" && !is_floating(have) && is_floating(target);
  if (have != target && !(is_floating(have) && is_floating(target)) && !integer_counter) {
    throw InputError(source.file + ": " + kind + " '" + name + "' is " + dtype_name(have) +
                     ", the model holds it as " + dtype_name(target) +
                     " (only floating-point types convert into each other)" + source.what);
  }
  if (!is_floating(have) || stored.numel() == 0) return;
  const Tensor values = stored.to(DType::F64).contiguous();
  const double* v = values.data<double>();
  std::int64_t bad = 0, first = -1;
  for (std::int64_t i = 0; i < values.numel(); ++i) {
    if (!std::isfinite(v[i])) {
      if (first < 0) first = i;
      ++bad;
    }
  }
  if (bad == 0) return;
  throw InputError(source.file + ": " + kind + " '" + name + "' holds " + std::to_string(bad) +
                   " non-finite value(s) (the first, " + std::to_string(v[first]) +
                   ", at flat index " + std::to_string(first) +
                   "): the file was saved from a diverged run or is corrupt");
}

}  // namespace

void load_named_tensors(const NamedTensorSource& source, const std::vector<Parameter*>& parameters,
                        const std::vector<Buffer*>& buffers, bool buffers_required) {
  static const std::string kBaseModelPrefix = "transformer.";
  const auto find = [&](const std::string& kind, const std::string& name, const Shape& shape,
                        DType target_dtype) -> const Tensor* {
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
    check_loadable(source, kind, name, it->second, target_dtype);
    return &it->second;
  };
  for (Parameter* p : parameters) {
    const Tensor& stored = *find("parameter", p->name, stored_shape(*p), p->value.dtype());
    p->value.copy_from(p->stored_transposed ? stored.transpose(0, 1) : stored);
  }
  for (Buffer* b : buffers) {
    if (buffers_required) {
      b->value.copy_from(*find("buffer", b->name, b->value.shape(), b->value.dtype()));
      continue;
    }
    auto it = source.tensors->find(b->name);
    if (it != source.tensors->end() && it->second.shape() == b->value.shape()) {
      check_loadable(source, "buffer", b->name, it->second, b->value.dtype());
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
