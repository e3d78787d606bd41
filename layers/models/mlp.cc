// The multilayer perceptron: Flatten, then Linear + ReLU (fused epilogue) per hidden width, then
// a Linear to the classes. Parameter names "fc1.weight", "fc1.bias", ... (fcK is the classifier).

#include <memory>

#include "layers/linear.h"
#include "layers/models/model.h"
#include "layers/reshape.h"

namespace kiln {

Model make_mlp(const ModelOptions& options) {
  if (options.num_classes <= 0 || options.image_size <= 0 || options.image_channels <= 0) {
    throw InputError("mlp: num_classes, image_size and image_channels must be positive");
  }
  Model model;
  model.sample_shape = {options.image_channels, options.image_size, options.image_size};
  model.input_dtype = DType::F32;
  model.task = Task::Classification;
  model.num_outputs = options.num_classes;
  auto net = std::make_unique<Sequential>();
  net->add("flatten", std::make_unique<Flatten>());
  std::int64_t width = shape_numel(model.sample_shape);
  int index = 0;
  for (int hidden : options.mlp_hidden) {
    if (hidden <= 0) throw InputError("mlp: hidden widths must be positive");
    net->add("fc" + std::to_string(++index),
             std::make_unique<Linear>(width, hidden, true, Activation::ReLU));
    width = hidden;
  }
  net->add("fc" + std::to_string(++index), std::make_unique<Linear>(width, options.num_classes));
  net->set_name("");
  model.net = std::move(net);
  return model;
}

}  // namespace kiln
