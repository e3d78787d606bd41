#include "layers/conv_bn_chain.h"

#include <cstdio>
#include <mutex>
#include <string>
#include <utility>

#include "core/ops.h"
#include "layers/cuda/batchnorm_cuda.h"
#include "layers/cuda/conv2d_cuda.h"
#include "layers/cuda/conv_bn_fusion_cuda.h"

namespace kiln {
namespace {

namespace fusion = conv_bn_fusion;

// A layer's part of the chain, reported as that layer's own forward or backward would be: the
// profiler's and ZeRO-2's observers (ctx.observers), then on_grad_ready for its parameters.
void begin_layer(Context& ctx, Layer& layer, bool forward) {
  notify_observers(ctx, layer, forward, true);
}
void end_layer(Context& ctx, Layer& layer, bool forward) {
  notify_observers(ctx, layer, forward, false);
  if (!forward && ctx.on_grad_ready) {
    for (Parameter* p : layer.parameters()) ctx.on_grad_ready(*p);
  }
}

// The convolution's output, NHWC.
Tensor output_of(const Conv2dGeometry& g, Device device) {
  return Tensor::empty({g.batch, g.out_height(), g.out_width(), g.out_channels}, g.dtype, device);
}

Tensor channel_floats(std::int64_t channels, Device device) {
  return Tensor::empty({channels}, DType::F32, device);
}

}  // namespace

ConvBatchNormChain::ConvBatchNormChain(std::vector<Conv2d*> convs, std::vector<BatchNorm2d*> bns)
    : convs_(std::move(convs)), bns_(std::move(bns)) {
  KILN_CHECK(!convs_.empty() && convs_.size() == bns_.size(),
             "ConvBatchNormChain: one batch norm per convolution");
}

bool ConvBatchNormChain::applicable(const Context& ctx, const Tensor& x) {
  const DType t = ctx.run.precision.activation;
  if (!ctx.training || !x.device().is_cuda() || !ctx.run.channels_last || x.dim() != 4 ||
      (t != DType::F16 && t != DType::BF16) || ctx.run.precision.matmul != t || x.dtype() != t) {
    return false;
  }
  for (const Conv2d* conv : convs_) {
    if (conv->algorithm_options().deterministic) {
      // cuDNN's fused statistics differ between two runs of the same step (its reduction order).
      static std::once_flag told;
      std::call_once(told, [] {
        std::fprintf(stderr,
                     "kiln: model.fuse_conv_batch_norm is off under train.deterministic: cuDNN's "
                     "fused batch-norm statistics are not reproducible bit for bit\n");
      });
      return false;
    }
  }
  Shape s = x.shape();
  for (std::size_t k = 0; k < convs_.size(); ++k) {
    if (convs_[k]->bias() != nullptr || !bns_[k]->training()) return false;
    const Conv2dGeometry g = convs_[k]->geometry(s, t, true);
    const std::int64_t pack = 16 / static_cast<std::int64_t>(dtype_size(t));
    if (g.groups != 1 || g.in_channels % pack != 0 || g.out_channels % pack != 0 ||
        g.batch * g.out_height() * g.out_width() < 2) {
      return false;
    }
    if (!fusion::supported(fusion::Pattern::Forward, g, convs_[k]->algorithm_options())) {
      return false;
    }
    s = convs_[k]->output_shape(s);
  }
  return true;
}

Tensor ConvBatchNormChain::forward(Context& ctx, const Tensor& x) {
  const DType t = ctx.run.precision.activation;
  const Device device = x.device();
  const bool update_running = !ctx.recomputing;  // a recomputed forward has counted this batch
  saved_x_ = to_physical(x, true);
  links_.assign(convs_.size(), Link());
  Shape s = x.shape();
  if (!ones_.defined() || ones_.numel() != s[1] || ones_.dtype() != t || ones_.device() != device) {
    ones_ = Tensor::full({s[1]}, 1.0, t, device);
    zeros_ = Tensor::zeros({s[1]}, t, device);
  }
  Tensor input = saved_x_, scale = ones_, bias = zeros_;
  for (std::size_t k = 0; k < convs_.size(); ++k) {
    Conv2d& conv = *convs_[k];
    BatchNorm2d& bn = *bns_[k];
    Link& link = links_[k];
    link.geometry = conv.geometry(s, t, true);
    const Conv2dGeometry& g = link.geometry;
    link.in_scale = scale;
    link.in_bias = bias;
    begin_layer(ctx, conv, true);
    link.y = output_of(g, device);
    Tensor sum = channel_floats(g.out_channels, device);
    Tensor sq_sum = channel_floats(g.out_channels, device);
    fusion::forward(g, conv.algorithm_options(), input, scale, bias,
                    conv.compute_weight(ctx, t, true), link.y, sum, sq_sum);
    end_layer(ctx, conv, true);

    begin_layer(ctx, bn, true);
    link.mean = channel_floats(g.out_channels, device);
    link.invstd = channel_floats(g.out_channels, device);
    link.var = channel_floats(g.out_channels, device);
    scale = Tensor::empty({g.out_channels}, t, device);
    bias = Tensor::empty({g.out_channels}, t, device);
    fusion::finalize(sum, sq_sum, g.batch * g.out_height() * g.out_width(), bn.weight().value,
                     bn.bias().value, bn.eps(), bn.momentum(), update_running,
                     bn.running_mean().value, bn.running_var().value, link.mean, link.invstd,
                     link.var, scale, bias);
    if (update_running) bn.count_batch();
    end_layer(ctx, bn, true);
    input = link.y;
    s = conv.output_shape(s);
  }
  // The last batch norm, applied by Kiln's kernel with the batch statistics: its invstd is the one
  // its backward uses.
  BatchNorm2d& last = *bns_.back();
  Link& link = links_.back();
  begin_layer(ctx, last, true);
  Tensor out = Tensor::empty(link.y.shape(), t, device);
  batchnorm_cuda::forward_inference(link.y, last.weight().value, last.bias().value, true,
                                    last.eps(), link.mean, link.var, out, link.invstd, false);
  end_layer(ctx, last, true);
  return from_physical(out, true);
}

Tensor ConvBatchNormChain::backward(Context& ctx, const Tensor& dy) {
  KILN_CHECK(saved(), "ConvBatchNormChain: backward without forward");
  const Device device = saved_x_.device();
  const DType t = saved_x_.dtype();
  // The last batch norm, through its batch statistics (no ReLU after it).
  BatchNorm2d& last = *bns_.back();
  begin_layer(ctx, last, false);
  Tensor d = Tensor::empty(links_.back().y.shape(), t, device);
  batchnorm_cuda::backward(links_.back().y, to_physical(dy, true).to(t), last.weight().value,
                           last.bias().value, links_.back().mean, links_.back().invstd, true, true,
                           false, d, last.weight().grad, last.bias().grad);
  end_layer(ctx, last, false);

  Tensor dx;
  for (std::size_t k = convs_.size(); k-- > 0;) {
    Conv2d& conv = *convs_[k];
    const Link& link = links_[k];
    const Conv2dGeometry& g = link.geometry;
    const ConvAlgorithmOptions& options = conv.algorithm_options();
    // The convolution's input as forward saw it: relu(prev.y * scale + bias), or x itself.
    const Tensor& input = k == 0 ? saved_x_ : links_[k - 1].y;
    begin_layer(ctx, conv, false);
    Tensor w = conv.compute_weight(ctx, t, true);
    Tensor dw = Tensor::empty(w.shape(), t, device);
    if (k > 0 && fusion::supported(fusion::Pattern::BackwardFilter, g, options)) {
      fusion::backward_filter(g, options, input, link.in_scale, link.in_bias, d, dw);
    } else {
      const ConvAlgorithmChoice algos = cudnn_conv::setup(g, conv.algorithm_options());
      Tensor a = input;
      if (k > 0) {
        a = Tensor::empty(input.shape(), t, device);
        fusion::scale_bias_relu(input, link.in_scale, link.in_bias, a);
      }
      cudnn_conv::backward_filter(g, algos, a, d, dw, 0.0);
    }
    conv.accumulate_weight_gradient(dw, true);
    if (k == 0) {
      if (conv.input_gradient()) {
        dx = Tensor::empty(saved_x_.shape(), t, device);
        cudnn_conv::backward_data(g, cudnn_conv::setup(g, conv.algorithm_options()), d, w, dx);
      }
      end_layer(ctx, conv, false);
      break;
    }
    // Through this convolution and the previous batch norm's ReLU and batch statistics.
    BatchNorm2d& bn = *bns_[k - 1];
    const Link& prev = links_[k - 1];
    Tensor d_prev = Tensor::empty(prev.y.shape(), t, device);
    if (fusion::supported(fusion::Pattern::BackwardData, g, options)) {
      // The fused kernel reads the batch norm's weights: its backward begins first (ZeRO-3
      // gathers them as it does).
      begin_layer(ctx, bn, false);
      const std::int64_t c = g.in_channels;
      Tensor grad = Tensor::empty(prev.y.shape(), t, device);
      Tensor dscale = channel_floats(c, device), dbias = channel_floats(c, device);
      Tensor eq_dy = channel_floats(c, device), eq_x = channel_floats(c, device),
             eq_bias = channel_floats(c, device);
      fusion::backward_data(g, options, d, w, prev.y, prev.mean, prev.invstd, bn.weight().value,
                            bn.bias().value, grad, dscale, dbias, eq_dy, eq_x, eq_bias);
      end_layer(ctx, conv, false);
      fusion::apply_backward(grad, prev.y, eq_dy, eq_x, eq_bias, d_prev);
      ops::axpy(1.0, dscale, bn.weight().grad);
      ops::axpy(1.0, dbias, bn.bias().grad);
    } else {
      Tensor da = Tensor::empty(prev.y.shape(), t, device);
      cudnn_conv::backward_data(g, cudnn_conv::setup(g, conv.algorithm_options()), d, w, da);
      end_layer(ctx, conv, false);
      begin_layer(ctx, bn, false);
      batchnorm_cuda::backward(prev.y, da, bn.weight().value, bn.bias().value, prev.mean,
                               prev.invstd, true, true, true, d_prev, bn.weight().grad,
                               bn.bias().grad);
    }
    end_layer(ctx, bn, false);
    d = d_prev;
  }
  release();
  return dx.defined() ? from_physical(dx, true) : dx;
}

void ConvBatchNormChain::release() {
  saved_x_ = Tensor();
  links_.clear();
}

}  // namespace kiln
