#include "train/parameter_loader.h"

#include "core/check.h"

namespace kiln::train {

void load_named_tensors(const NamedTensorSource& source, const std::vector<Parameter*>& parameters,
                        const std::vector<Buffer*>& buffers, bool buffers_required) {
  const auto find = [&](const std::string& kind, const std::string& name,
                        const Tensor& target) -> const Tensor* {
    auto it = source.tensors->find(name);
    if (it == source.tensors->end()) {
      throw InputError(source.file + ": " + kind + " '" + name + "' is missing" + source.what);
    }
    if (it->second.shape() != target.shape()) {
      throw InputError(source.file + ": " + kind + " '" + name + "' has shape " +
                       shape_str(it->second.shape()) + ", the model needs " +
                       shape_str(target.shape()) + source.what);
    }
    return &it->second;
  };
  for (Parameter* p : parameters) p->value.copy_from(*find("parameter", p->name, p->value));
  for (Buffer* b : buffers) {
    if (buffers_required) {
      b->value.copy_from(*find("buffer", b->name, b->value));
      continue;
    }
    auto it = source.tensors->find(b->name);
    if (it != source.tensors->end() && it->second.shape() == b->value.shape()) {
      b->value.copy_from(it->second);
    }
  }
}

}  // namespace kiln::train
