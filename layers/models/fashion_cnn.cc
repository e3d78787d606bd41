// fashion_cnn: a small convolutional net for 28x28 greyscale images (Fashion-MNIST), cheap enough
// to train on two CPU cores:
//   (N, 1, 28, 28) conv1 3x3 32 - bn1 - pool 2 - relu -> (N, 32, 14, 14)
//                  conv2 3x3 64 - bn2 - pool 2 - relu -> (N, 64, 7, 7)
// (max-pool and ReLU commute; pooling first leaves ReLU a quarter of the work.)
//                  flatten - fc1 128 + relu - [dropout] - fc2 num_classes -> (N, num_classes)
// Convolutions have no bias (batch norm follows). 421,738 parameters for 10 classes.

#include <memory>

#include "layers/batchnorm.h"
#include "layers/conv2d.h"
#include "layers/dropout.h"
#include "layers/linear.h"
#include "layers/models/model.h"
#include "layers/pooling.h"
#include "layers/relu.h"
#include "layers/reshape.h"

namespace kiln {
namespace {

// A square convolution without bias (batch norm follows it).
std::unique_ptr<Conv2d> conv_no_bias(std::int64_t in, std::int64_t out, std::int64_t kernel,
                                     std::int64_t padding) {
  return std::make_unique<Conv2d>(
      in, out, std::make_pair(kernel, kernel), std::make_pair<std::int64_t, std::int64_t>(1, 1),
      std::make_pair(padding, padding), std::make_pair<std::int64_t, std::int64_t>(1, 1), 1, false);
}

}  // namespace

Model make_fashion_cnn(const ModelOptions& options) {
  if (options.image_size < 4 || options.image_channels <= 0 || options.num_classes <= 0) {
    throw InputError("fashion_cnn: needs images of at least 4x4 pixels and at least one class");
  }
  const std::int64_t c = options.image_channels, side = options.image_size / 2 / 2;
  auto net = std::make_unique<Sequential>();
  net->add("conv1", conv_no_bias(c, 32, 3, 1));
  net->add("bn1", std::make_unique<BatchNorm2d>(32));
  net->add("pool1", std::make_unique<MaxPool2d>(2));
  net->add("relu1", std::make_unique<ReLU>(true));
  net->add("conv2", conv_no_bias(32, 64, 3, 1));
  net->add("bn2", std::make_unique<BatchNorm2d>(64));
  net->add("pool2", std::make_unique<MaxPool2d>(2));
  net->add("relu2", std::make_unique<ReLU>(true));
  net->add("flatten", std::make_unique<Flatten>());
  net->add("fc1", std::make_unique<Linear>(64 * side * side, 128, true, Activation::ReLU));
  // Optional dropout before the classifier (model.dropout): it regularises the fc layers, which
  // hold most of the parameters.
  if (options.dropout > 0) net->add("dropout", std::make_unique<Dropout>(options.dropout));
  net->add("fc2", std::make_unique<Linear>(128, options.num_classes));
  return image_model(std::move(net), options);
}

}  // namespace kiln
