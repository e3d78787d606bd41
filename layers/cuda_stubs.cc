// The layers' CUDA entry points in a build without CUDA (-DKILN_CUDA=OFF): layer sources call
// them on CUDA tensors without #if, and reaching one is a usage error, reported plainly. Each
// definition matches a declaration in layers/cuda/*_cuda.h.

#include "layers/cuda/activations_cuda.h"
#include "layers/cuda/attention_cuda.h"
#include "layers/cuda/batchnorm_cuda.h"
#include "layers/cuda/conv2d_cuda.h"
#include "layers/cuda/conv_bn_fusion_cuda.h"
#include "layers/cuda/dropout_cuda.h"
#include "layers/cuda/embedding_cuda.h"
#include "layers/cuda/layernorm_cuda.h"
#include "layers/cuda/linear_cuda.h"
#include "layers/cuda/pooling_cuda.h"
#include "layers/cuda/relu_cuda.h"
#include "layers/cuda/softmax_cross_entropy_cuda.h"

namespace kiln {
namespace {
[[noreturn]] void not_built(const char* what) {
  throw Error(std::string(what) +
              " on CUDA was called, but this Kiln was built without CUDA (-DKILN_CUDA=OFF)");
}
}  // namespace

namespace cuda {
void activation_forward(Activation, const Tensor&, Tensor&) {
  not_built("an activation");
}
void activation_backward(Activation, const Tensor&, const Tensor&, Tensor&) {
  not_built("an activation");
}

void add_bias(Tensor&, const Tensor&) {
  not_built("add_bias");
}
void to_heads(const Tensor&, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
              Tensor&) {
  not_built("attention");
}
void from_heads(const Tensor&, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                Tensor&) {
  not_built("attention");
}
void accumulate_bias_grad(const Tensor&, Tensor&) {
  not_built("accumulate_bias_grad");
}
void attention_softmax_forward(const Tensor&, const Tensor&, std::int64_t, bool, double,
                               std::uint64_t, std::uint64_t, const std::uint64_t*, Tensor&,
                               Tensor&) {
  not_built("attention");
}
void attention_softmax_backward(const Tensor&, const Tensor&, double, std::uint64_t, std::uint64_t,
                                const std::uint64_t*, Tensor&) {
  not_built("attention");
}
std::int64_t attention_workspace_limit_bytes() {
  not_built("attention");
}
bool flash_attention_supported(DType, std::int64_t, std::int64_t, std::int64_t) {
  not_built("attention");
}
void flash_attention_forward(const Tensor&, std::int64_t, std::int64_t, const Tensor&, bool, double,
                             std::uint64_t, std::uint64_t, const std::uint64_t*, Tensor&, Tensor&) {
  not_built("attention");
}
void flash_attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              const Tensor&, std::int64_t, std::int64_t, bool, double,
                              std::uint64_t, std::uint64_t, const std::uint64_t*, Tensor&) {
  not_built("attention");
}
bool cudnn_attention_forward(const Tensor&, std::int64_t, std::int64_t, bool, Tensor&, Tensor&) {
  not_built("attention");
}
void cudnn_attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              std::int64_t, std::int64_t, bool, Tensor&) {
  not_built("attention");
}

void dropout_apply(const Tensor&, Tensor&, std::uint64_t, std::uint64_t, const std::uint64_t*,
                   double, double) {
  not_built("Dropout");
}

void embedding_forward(const Tensor&, const Tensor&, Tensor&) {
  not_built("Embedding");
}
void embedding_backward(const Tensor&, const Tensor&, std::int64_t, Tensor&) {
  not_built("Embedding");
}

void layernorm_forward(const Tensor&, const Tensor&, const Tensor&, double, Tensor&, Tensor&,
                       Tensor&) {
  not_built("LayerNorm");
}
void layernorm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                        Tensor&, Tensor&, Tensor&) {
  not_built("LayerNorm");
}

void linear_forward(const Tensor&, const Tensor&, const Tensor&, Activation, Tensor&, Tensor&,
                    std::int64_t&) {
  not_built("Linear");
}
void linear_backward(const Tensor&, const Tensor&, const Tensor&, Activation, const Tensor&,
                     std::int64_t, Tensor&, Tensor*, Tensor&) {
  not_built("Linear");
}

void softmax_cross_entropy_forward(const Tensor&, const Tensor&, double, std::int64_t, Tensor&,
                                   Tensor&, Tensor&, Tensor&, Tensor&) {
  not_built("SoftmaxCrossEntropy");
}
void softmax_cross_entropy_backward(const Tensor&, const Tensor&, double, std::int64_t,
                                    const Tensor&, const Tensor&, double, const double*,
                                    std::int64_t, Tensor&) {
  not_built("SoftmaxCrossEntropy");
}
}  // namespace cuda

namespace batchnorm_cuda {
void forward_training(const Tensor&, const Tensor&, const Tensor&, bool, double, double, bool,
                      Tensor&, Tensor&, Tensor&, Tensor&, Tensor&, bool) {
  not_built("BatchNorm2d");
}
void forward_inference(const Tensor&, const Tensor&, const Tensor&, bool, double, const Tensor&,
                       const Tensor&, Tensor&, Tensor&, bool) {
  not_built("BatchNorm2d");
}
void backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
              const Tensor&, bool, bool, bool, Tensor&, Tensor&, Tensor&) {
  not_built("BatchNorm2d");
}
}  // namespace batchnorm_cuda

namespace conv_bn_fusion {
bool supported(Pattern, const Conv2dGeometry&, const ConvAlgorithmOptions&) {
  not_built("A fused convolution");
}
Counts counts() {
  return {};
}
void forward(const Conv2dGeometry&, const ConvAlgorithmOptions&, const Tensor&, const Tensor&,
             const Tensor&, const Tensor&, Tensor&, Tensor&, Tensor&) {
  not_built("A fused convolution");
}
void backward_filter(const Conv2dGeometry&, const ConvAlgorithmOptions&, const Tensor&,
                     const Tensor&, const Tensor&, const Tensor&, Tensor&) {
  not_built("A fused convolution");
}
void backward_data(const Conv2dGeometry&, const ConvAlgorithmOptions&, const Tensor&, const Tensor&,
                   const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                   Tensor&, Tensor&, Tensor&, Tensor&, Tensor&, Tensor&) {
  not_built("A fused convolution");
}
void finalize(const Tensor&, const Tensor&, std::int64_t, const Tensor&, const Tensor&, double,
              double, bool, Tensor&, Tensor&, Tensor&, Tensor&, Tensor&, Tensor&, Tensor&) {
  not_built("A fused convolution");
}
void scale_bias_relu(const Tensor&, const Tensor&, const Tensor&, Tensor&) {
  not_built("A fused convolution");
}
void apply_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                    Tensor&) {
  not_built("A fused convolution");
}
}  // namespace conv_bn_fusion

namespace cudnn_conv {
bool can_implement(const Conv2dGeometry&, std::string*) {
  not_built("Conv2d");
}
ConvAlgorithmChoice setup(const Conv2dGeometry&, const ConvAlgorithmOptions&) {
  not_built("Conv2d");
}
void forward(const Conv2dGeometry&, const ConvAlgorithmChoice&, const Tensor&, const Tensor&,
             Tensor&) {
  not_built("Conv2d");
}
void backward_data(const Conv2dGeometry&, const ConvAlgorithmChoice&, const Tensor&, const Tensor&,
                   Tensor&) {
  not_built("Conv2d");
}
void backward_filter(const Conv2dGeometry&, const ConvAlgorithmChoice&, const Tensor&,
                     const Tensor&, Tensor&, double) {
  not_built("Conv2d");
}
void add_bias(Tensor&, const Tensor&, bool) {
  not_built("Conv2d");
}
std::size_t cached_plans() {
  not_built("Conv2d");
}
}  // namespace cudnn_conv

namespace pooling_cuda {
void max_forward(const PoolGeometry&, const Tensor&, Tensor&, Tensor&) {
  not_built("MaxPool2d");
}
void max_backward(const PoolGeometry&, const Tensor&, const Tensor&, Tensor&) {
  not_built("MaxPool2d");
}
void avg_forward(const PoolGeometry&, const Tensor&, Tensor&) {
  not_built("AvgPool2d");
}
void avg_backward(const PoolGeometry&, const Tensor&, Tensor&) {
  not_built("AvgPool2d");
}
void global_avg_forward(const PoolGeometry&, const Tensor&, Tensor&) {
  not_built("GlobalAvgPool");
}
void global_avg_backward(const PoolGeometry&, const Tensor&, Tensor&) {
  not_built("GlobalAvgPool");
}
}  // namespace pooling_cuda

namespace relu_cuda {
void forward(const Tensor&, Tensor&) {
  not_built("ReLU");
}
void forward_add(const Tensor&, const Tensor&, Tensor&) {
  not_built("ReLU");
}
void backward(const Tensor&, const Tensor&, Tensor&) {
  not_built("ReLU");
}
}  // namespace relu_cuda

}  // namespace kiln
