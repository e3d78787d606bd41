// ResNet-18 and ResNet-50 in torchvision's layout and parameter names (conv1, bn1, layer1.0.conv1,
// layer1.0.downsample.0/1, ..., fc), so that weights load from / into PyTorch.
//   (N, C, H, W) conv1 7x7/2 - bn1 - relu - maxpool 3x3/2 - layer1..layer4 - avgpool - fc
//   cifar_stem: conv1 3x3/1 and no max-pool, for 32x32 images.
// Blocks: BasicBlock (18: [2, 2, 2, 2]) and Bottleneck (50: [3, 4, 6, 3], stride on the 3x3
// conv as torchvision's v1.5). Init as torchvision: convolutions kaiming_normal(fan_out, relu),
// batch norm weight 1 bias 0, fc PyTorch's Linear default.

#include <cmath>
#include <functional>
#include <memory>

#include "core/ops.h"
#include "layers/batchnorm.h"
#include "layers/conv2d.h"
#include "layers/conv_bn_chain.h"
#include "layers/linear.h"
#include "layers/models/model.h"
#include "layers/pooling.h"
#include "layers/relu.h"

namespace kiln {
namespace {

std::unique_ptr<Conv2d> conv_no_bias(std::int64_t in, std::int64_t out, std::int64_t kernel,
                                     std::int64_t stride, std::int64_t padding) {
  return std::make_unique<Conv2d>(in, out, std::make_pair(kernel, kernel),
                                  std::make_pair(stride, stride), std::make_pair(padding, padding),
                                  std::make_pair<std::int64_t, std::int64_t>(1, 1), 1, false);
}

// A residual block: y = relu(body(x) + shortcut(x)), body = conv-bn-relu-conv-bn(-relu-conv-bn).
// Children carry torchvision's names; the addition keeps the activations' memory order. With
// `fuse`, the body trains on CUDA with batch norm fused into the convolutions where it can
// (ConvBatchNormChain; the block's input is a ReLU's output, as the chain asks).
class ResNetBlock : public Layer {
 public:
  ResNetBlock(std::int64_t in_planes, std::int64_t planes, std::int64_t stride, bool bottleneck,
              bool fuse) {
    const std::int64_t out_planes = bottleneck ? planes * 4 : planes;
    if (bottleneck) {
      convs_.push_back(&add_child("conv1", conv_no_bias(in_planes, planes, 1, 1, 0)));
      bns_.push_back(&add_child("bn1", std::make_unique<BatchNorm2d>(planes)));
      convs_.push_back(&add_child("conv2", conv_no_bias(planes, planes, 3, stride, 1)));
      bns_.push_back(&add_child("bn2", std::make_unique<BatchNorm2d>(planes)));
      convs_.push_back(&add_child("conv3", conv_no_bias(planes, out_planes, 1, 1, 0)));
      bns_.push_back(&add_child("bn3", std::make_unique<BatchNorm2d>(out_planes)));
    } else {
      convs_.push_back(&add_child("conv1", conv_no_bias(in_planes, planes, 3, stride, 1)));
      bns_.push_back(&add_child("bn1", std::make_unique<BatchNorm2d>(planes)));
      convs_.push_back(&add_child("conv2", conv_no_bias(planes, planes, 3, 1, 1)));
      bns_.push_back(&add_child("bn2", std::make_unique<BatchNorm2d>(planes)));
    }
    // The ReLUs inside the body run fused into the batch norm before them; the last one follows
    // the residual addition.
    for (std::size_t i = 0; i + 1 < bns_.size(); ++i) bns_[i]->set_fused_relu(true);
    relu_ = &add_child("relu" + std::to_string(convs_.size()), std::make_unique<ReLU>(true));
    if (stride != 1 || in_planes != out_planes) {
      auto down = std::make_unique<Sequential>();
      down->add("0", conv_no_bias(in_planes, out_planes, 1, stride, 0));
      down->add("1", std::make_unique<BatchNorm2d>(out_planes));
      downsample_ = &add_child("downsample", std::move(down));
    }
    if (fuse) chain_ = std::make_unique<ConvBatchNormChain>(convs_, bns_);
  }

  std::string type() const override { return convs_.size() == 3 ? "Bottleneck" : "BasicBlock"; }

  Shape output_shape(const Shape& input) const override {
    Shape s = input;
    for (const Conv2d* c : convs_) s = c->output_shape(s);
    return s;
  }

  double forward_flops(const Shape& input) const override {
    double f = 0;
    Shape s = input;
    for (std::size_t i = 0; i < convs_.size(); ++i) {
      f += convs_[i]->forward_flops(s);
      s = convs_[i]->output_shape(s);
      f += bns_[i]->forward_flops(s);
    }
    if (downsample_) f += downsample_->forward_flops(input);
    return f + static_cast<double>(shape_numel(s));  // the addition
  }

 protected:
  Tensor forward_impl(Context& ctx, const Tensor& x) override {
    Tensor h = x;
    if (chain_) chain_->release();
    if (chain_ && training() && chain_->applicable(ctx, x)) {
      h = chain_->forward(ctx, x);
    } else {
      for (std::size_t i = 0; i < convs_.size(); ++i) {
        h = bns_[i]->forward(ctx, convs_[i]->forward(ctx, h));
      }
    }
    // The residual sum runs fused into the block's last ReLU.
    relu_->set_residual(downsample_ ? downsample_->forward(ctx, x) : x);
    return relu_->forward(ctx, h);
  }

  Tensor backward_impl(Context& ctx, const Tensor& dy) override {
    Tensor g = relu_->backward(ctx, dy);
    Tensor d_shortcut = downsample_ ? downsample_->backward(ctx, g) : g;
    Tensor d = g;
    if (chain_ && chain_->saved()) {
      d = chain_->backward(ctx, g);
    } else {
      for (std::size_t i = convs_.size(); i-- > 0;) {
        d = convs_[i]->backward(ctx, bns_[i]->backward(ctx, d));
      }
    }
    return add_in_order(ctx, d, d_shortcut);
  }

  void release_saved() override {
    if (chain_) chain_->release();
  }

 private:
  // a + b on their dense memory in the context's order (NCHW or NHWC), in a's dtype.
  static Tensor add_in_order(const Context& ctx, const Tensor& a, const Tensor& b) {
    const bool cl = ctx.run.channels_last;
    Tensor pa = to_physical(a, cl);
    Tensor pb = to_physical(b, cl).to(a.dtype());
    Tensor out = Tensor::empty(pa.shape(), pa.dtype(), pa.device());
    ops::add(pa, pb, out);
    return from_physical(out, cl);
  }

  std::vector<Conv2d*> convs_;
  std::vector<BatchNorm2d*> bns_;
  ReLU* relu_ = nullptr;
  Layer* downsample_ = nullptr;
  std::unique_ptr<ConvBatchNormChain> chain_;
};

// The whole network; re-initialises convolutions as torchvision does after the defaults.
class ResNet : public Sequential {
 public:
  std::string type() const override { return "ResNet"; }
  void reset_parameters(std::uint64_t seed) override {
    Sequential::reset_parameters(seed);
    std::uint64_t index = 0;
    std::function<void(Layer&)> visit = [&](Layer& layer) {
      if (auto* conv = dynamic_cast<Conv2d*>(&layer)) {
        const Shape& w = conv->weight().value.shape();  // (K, C/g, R, S)
        const double fan_out = static_cast<double>(w[0] * w[2] * w[3]);
        ops::fill_normal(conv->weight().value, 0.0, std::sqrt(2.0 / fan_out),
                         seed * 1000003ull + 7919ull * (++index));
      }
      for (Layer* child : layer.children()) visit(*child);
    };
    visit(*this);
  }
};

}  // namespace

Model make_resnet(const ModelOptions& options, int depth) {
  if (depth != 18 && depth != 50) {
    throw InputError("resnet: depth " + std::to_string(depth) + " is not built (known: 18, 50)");
  }
  if (options.num_classes <= 0 || options.image_channels <= 0 || options.image_size < 8) {
    throw InputError("resnet: needs at least one class, one channel and 8x8 images");
  }
  const bool bottleneck = depth == 50;
  const int blocks[4] = {depth == 50 ? 3 : 2, depth == 50 ? 4 : 2, depth == 50 ? 6 : 2,
                         2 + (depth == 50)};
  const std::int64_t expansion = bottleneck ? 4 : 1;

  auto net = std::make_unique<ResNet>();
  if (options.cifar_stem) {
    net->add("conv1", conv_no_bias(options.image_channels, 64, 3, 1, 1));
  } else {
    net->add("conv1", conv_no_bias(options.image_channels, 64, 7, 2, 3));
  }
  // The stem's ReLU runs fused into its batch norm.
  auto stem_bn = std::make_unique<BatchNorm2d>(64);
  stem_bn->set_fused_relu(true);
  net->add("bn1", std::move(stem_bn));
  if (!options.cifar_stem) net->add("maxpool", std::make_unique<MaxPool2d>(3, 2, 1));
  std::int64_t in_planes = 64;
  for (int stage = 0; stage < 4; ++stage) {
    const std::int64_t planes = 64ll << stage;
    auto layer = std::make_unique<Sequential>();
    for (int b = 0; b < blocks[stage]; ++b) {
      const std::int64_t stride = (stage > 0 && b == 0) ? 2 : 1;
      layer->add(std::to_string(b),
                 std::make_unique<ResNetBlock>(in_planes, planes, stride, bottleneck,
                                               options.fuse_conv_batch_norm));
      in_planes = planes * expansion;
    }
    layer->set_recompute(options.recompute_blocks);
    net->add("layer" + std::to_string(stage + 1), std::move(layer));
  }
  net->add("avgpool", std::make_unique<GlobalAvgPool>());
  net->add("fc", std::make_unique<Linear>(in_planes, options.num_classes));
  return image_model(std::move(net), options);
}

}  // namespace kiln
