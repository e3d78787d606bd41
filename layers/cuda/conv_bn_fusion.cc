// cuDNN's fused convolution + batch-norm patterns through the cuDNN frontend's graph API; see
// conv_bn_fusion_cuda.h. One graph per pattern, geometry and device is built on first use and
// kept; a pattern cuDNN declines for a geometry is remembered and told once on stderr.

#include <cuda_runtime.h>
#include <cudnn_frontend.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/cuda/cuda_check.h"
#include "core/cuda/cudnn_handle.h"
#include "core/device.h"
#include "core/tensor.h"
#include "layers/cuda/conv_bn_fusion_cuda.h"
#include "layers/cuda/plan_cache.h"

namespace kiln::conv_bn_fusion {
namespace {

namespace fe = cudnn_frontend;
using TensorRef = std::shared_ptr<fe::graph::Tensor_attributes>;

struct Plan {
  bool supported = false;
  std::string reason;
  std::shared_ptr<fe::graph::Graph> graph;
  std::int64_t workspace = 0;
  // Forward: x, scale, bias, w, y, sum, sq_sum. Filter: x, scale, bias, dy, dw.
  // Data: dy, w, x, mean, invstd, gamma, beta, grad, dscale, dbias, eq_dy, eq_x, eq_bias.
  std::vector<TensorRef> io;
};

struct Registry {
  PlanCache<Plan> plans;
  std::mutex counts_mutex;  // taken inside the cache's lock, never around it
  Counts counts;
};

Registry& registry() {
  static Registry r;
  return r;
}

const char* pattern_name(Pattern p) {
  return p == Pattern::Forward          ? "scale-bias-relu + convolution + statistics"
         : p == Pattern::BackwardFilter ? "scale-bias-relu + weight gradient"
                                        : "data gradient + relu backward + batch-norm weight sums";
}

fe::DataType_t io_type(DType t) {
  return t == DType::BF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
}

// (N, C, H, W) with NHWC strides; (K, C, R, S) filters are KRSC the same way.
std::vector<std::int64_t> nhwc(std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w) {
  (void)n;
  return {h * w * c, 1, w * c, c};
}

TensorRef activation(fe::graph::Graph& graph, const char* name, std::int64_t n, std::int64_t c,
                     std::int64_t h, std::int64_t w) {
  return graph.tensor(fe::graph::Tensor_attributes()
                          .set_name(name)
                          .set_dim({n, c, h, w})
                          .set_stride(nhwc(n, c, h, w)));
}

TensorRef channel_vector(fe::graph::Graph& graph, const char* name, std::int64_t c,
                         fe::DataType_t type) {
  return graph.tensor(fe::graph::Tensor_attributes()
                          .set_name(name)
                          .set_dim({1, c, 1, 1})
                          .set_stride({c, 1, c, c})
                          .set_data_type(type));
}

void as_channel_output(const TensorRef& t, std::int64_t c) {
  t->set_output(true)
      .set_data_type(fe::DataType_t::FLOAT)
      .set_dim({1, c, 1, 1})
      .set_stride({c, 1, c, c});
}

TensorRef pointwise(fe::graph::Graph& graph, fe::PointwiseMode_t mode, const TensorRef& a,
                    const TensorRef& b = nullptr) {
  auto attributes = fe::graph::Pointwise_attributes().set_mode(mode);
  return b ? graph.pointwise(a, b, attributes) : graph.pointwise(a, attributes);
}

// relu(x * scale + bias): the next convolution's prologue.
TensorRef prologue(fe::graph::Graph& graph, const TensorRef& x, const TensorRef& scale,
                   const TensorRef& bias) {
  return pointwise(graph, fe::PointwiseMode_t::RELU_FWD,
                   pointwise(graph, fe::PointwiseMode_t::ADD,
                             pointwise(graph, fe::PointwiseMode_t::MUL, x, scale), bias));
}

std::shared_ptr<fe::graph::Graph> new_graph(DType dtype, bool half_intermediates) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(io_type(dtype))
      .set_intermediate_data_type(half_intermediates ? io_type(dtype) : fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

void build_forward(Plan& p, const Conv2dGeometry& g) {
  auto& graph = *(p.graph = new_graph(g.dtype, false));
  const std::int64_t n = g.batch, c = g.in_channels, k = g.out_channels;
  auto x = activation(graph, "x", n, c, g.height, g.width);
  auto scale = channel_vector(graph, "scale", c, io_type(g.dtype));
  auto bias = channel_vector(graph, "bias", c, io_type(g.dtype));
  auto w = activation(graph, "w", k, c, g.kernel_h, g.kernel_w);
  auto y = graph.conv_fprop(prologue(graph, x, scale, bias), w,
                            fe::graph::Conv_fprop_attributes()
                                .set_padding({g.pad_h, g.pad_w})
                                .set_stride({g.stride_h, g.stride_w})
                                .set_dilation({g.dilation_h, g.dilation_w}));
  const std::int64_t oh = g.out_height(), ow = g.out_width();
  y->set_output(true).set_dim({n, k, oh, ow}).set_stride(nhwc(n, k, oh, ow));
  auto [sum, sq_sum] = graph.genstats(y, fe::graph::Genstats_attributes());
  as_channel_output(sum, k);
  as_channel_output(sq_sum, k);
  p.io = {x, scale, bias, w, y, sum, sq_sum};
}

void build_backward_filter(Plan& p, const Conv2dGeometry& g) {
  auto& graph = *(p.graph = new_graph(g.dtype, true));  // the wgrad pattern's prologue is in T
  const std::int64_t n = g.batch, c = g.in_channels, k = g.out_channels;
  auto x = activation(graph, "x", n, c, g.height, g.width);
  auto scale = channel_vector(graph, "scale", c, io_type(g.dtype));
  auto bias = channel_vector(graph, "bias", c, io_type(g.dtype));
  auto dy = activation(graph, "dy", n, k, g.out_height(), g.out_width());
  auto dw = graph.conv_wgrad(dy, prologue(graph, x, scale, bias),
                             fe::graph::Conv_wgrad_attributes()
                                 .set_padding({g.pad_h, g.pad_w})
                                 .set_stride({g.stride_h, g.stride_w})
                                 .set_dilation({g.dilation_h, g.dilation_w}));
  dw->set_output(true)
      .set_dim({k, c, g.kernel_h, g.kernel_w})
      .set_stride(nhwc(k, c, g.kernel_h, g.kernel_w));
  p.io = {x, scale, bias, dy, dw};
}

void build_backward_data(Plan& p, const Conv2dGeometry& g) {
  auto& graph = *(p.graph = new_graph(g.dtype, false));
  const std::int64_t n = g.batch, c = g.in_channels, k = g.out_channels;
  auto dy = activation(graph, "dy", n, k, g.out_height(), g.out_width());
  auto w = activation(graph, "w", k, c, g.kernel_h, g.kernel_w);
  auto da = graph.conv_dgrad(dy, w,
                             fe::graph::Conv_dgrad_attributes()
                                 .set_padding({g.pad_h, g.pad_w})
                                 .set_stride({g.stride_h, g.stride_w})
                                 .set_dilation({g.dilation_h, g.dilation_w}));
  da->set_dim({n, c, g.height, g.width});
  auto x = activation(graph, "x", n, c, g.height, g.width);
  auto mean = channel_vector(graph, "mean", c, fe::DataType_t::FLOAT);
  auto invstd = channel_vector(graph, "invstd", c, fe::DataType_t::FLOAT);
  auto gamma = channel_vector(graph, "gamma", c, fe::DataType_t::FLOAT);
  auto beta = channel_vector(graph, "beta", c, fe::DataType_t::FLOAT);
  // Batch norm's output before the ReLU, recomputed from its input: the ReLU's mask.
  auto normalized =
      pointwise(graph, fe::PointwiseMode_t::ADD,
                pointwise(graph, fe::PointwiseMode_t::MUL,
                          pointwise(graph, fe::PointwiseMode_t::MUL,
                                    pointwise(graph, fe::PointwiseMode_t::SUB, x, mean), invstd),
                          gamma),
                beta);
  auto grad = pointwise(graph, fe::PointwiseMode_t::RELU_BWD, da, normalized);
  grad->set_output(true)
      .set_data_type(io_type(g.dtype))
      .set_dim({n, c, g.height, g.width})
      .set_stride(nhwc(n, c, g.height, g.width));
  auto [dscale, dbias, eq_dy, eq_x, eq_bias] =
      graph.dbn_weight(grad, x, mean, invstd, gamma, fe::graph::DBN_weight_attributes());
  for (const TensorRef& t : {dscale, dbias, eq_dy, eq_x, eq_bias}) as_channel_output(t, c);
  p.io = {dy, w, x, mean, invstd, gamma, beta, grad, dscale, dbias, eq_dy, eq_x, eq_bias};
}

// Times the first kTunedPlans candidates on scratch tensors and keeps the fastest (benchmark
// mode, as the unfused convolutions do); nothing real is overwritten.
constexpr std::int64_t kTunedPlans = 8;

bool autotune(Plan& p, cudnnHandle_t handle, std::string& reason) {
  fe::graph::Graph& g = *p.graph;
  const std::int64_t count = std::min<std::int64_t>(g.get_execution_plan_count(), kTunedPlans);
  std::int64_t built = 0, workspace = 0;
  for (std::int64_t i = 0; i < count; ++i) {
    if (!g.build_plan_at_index(handle, i).is_good()) continue;
    std::int64_t ws = 0;
    if (g.get_workspace_size_plan_at_index(i, ws).is_good()) workspace = std::max(workspace, ws);
    ++built;
  }
  if (built == 0) {
    reason = "build_plan_at_index: none of " + std::to_string(count) + " candidates built";
    return false;
  }
  int device = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  const Device dev = Device::cuda(device);
  std::vector<Tensor> scratch;
  std::unordered_map<TensorRef, void*> pack;
  for (const TensorRef& t : p.io) {
    std::int64_t n = 1;
    for (std::int64_t d : t->get_dim()) n *= d;
    scratch.push_back(Tensor::zeros({n}, DType::F32, dev));  // room for any element type
    pack[t] = scratch.back().data();
  }
  Tensor ws = Tensor::empty({std::max<std::int64_t>(workspace, 1)}, DType::U8, dev);
  fe::error_t status = g.autotune(handle, pack, ws.data());
  if (!status.is_good()) {
    reason = "autotune: " + status.get_message();
    return false;
  }
  return true;
}

bool finish(Plan& p, cudnnHandle_t handle, const ConvAlgorithmOptions& o) {
  fe::graph::Graph& g = *p.graph;
  auto failed = [&](const char* stage, fe::error_t status) {
    if (status.is_good()) return false;
    p.reason = std::string(stage) + ": " + status.get_message();
    return true;
  };
  if (failed("validate", g.validate()) ||
      failed("build_operation_graph", g.build_operation_graph(handle)) ||
      failed("create_execution_plans",
             g.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}))) {
    return false;
  }
  if (failed("check_support", g.check_support(handle))) return false;
  if (o.search == ConvAlgorithmSearch::Benchmark) {
    if (!autotune(p, handle, p.reason)) return false;
  } else if (failed("build_plans",
                    g.build_plans(handle, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE))) {
    return false;
  }
  return !failed("get_workspace_size", g.get_workspace_size(p.workspace));
}

std::string key_of(Pattern pattern, const Conv2dGeometry& g, const ConvAlgorithmOptions& o,
                   int device) {
  return std::to_string(device) + " " + std::to_string(static_cast<int>(pattern)) + " " + g.str() +
         (o.search == ConvAlgorithmSearch::Benchmark ? " benchmark" : "");
}

// The plan of `pattern` for g on the current device, built on first use.
const Plan& plan_for(Pattern pattern, const Conv2dGeometry& g,
                     const ConvAlgorithmOptions& options) {
  int device = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  const std::string key = key_of(pattern, g, options, device);
  Registry& r = registry();
  auto build = [&] {
    auto p = std::make_unique<Plan>();
    if (g.dtype != DType::F16 && g.dtype != DType::BF16) {
      p->reason = "only f16 and bf16 activations are fused";
    } else if (!g.channels_last || g.groups != 1) {
      p->reason = "only NHWC, ungrouped convolutions are fused";
    } else {
      try {
        switch (pattern) {
          case Pattern::Forward:
            build_forward(*p, g);
            break;
          case Pattern::BackwardFilter:
            build_backward_filter(*p, g);
            break;
          case Pattern::BackwardData:
            build_backward_data(*p, g);
            break;
        }
        p->supported = finish(*p, cuda::cudnn_handle(), options);
      } catch (const std::exception& e) {  // the frontend throws on some malformed graphs
        p->supported = false;
        p->reason = e.what();
      }
    }
    return p;
  };
  auto count = [&](Plan* q) {
    std::lock_guard<std::mutex> lock(r.counts_mutex);
    if (q->supported) {
      ++r.counts.fused;
    } else {
      ++r.counts.refused;
      q->graph.reset();
      std::fprintf(stderr, "kiln: batch norm runs unfused around the convolution %s (%s): %s\n",
                   g.str().c_str(), pattern_name(pattern), q->reason.c_str());
    }
  };
  return *r.plans.find_or_build(key, build, count).plan;
}

void execute(const Plan& p, const std::vector<const Tensor*>& tensors, Device device,
             Pattern pattern) {
  KILN_CHECK(p.supported, std::string("conv_bn_fusion: ") + pattern_name(pattern) +
                              " run without a plan: " + p.reason);
  KILN_CHECK(tensors.size() == p.io.size(), "conv_bn_fusion: wrong number of tensors");
  std::unordered_map<TensorRef, void*> pack;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    KILN_CHECK(tensors[i]->is_contiguous(), "conv_bn_fusion: " + p.io[i]->get_name() +
                                                " must be contiguous, got " + tensors[i]->str());
    pack[p.io[i]] = const_cast<void*>(tensors[i]->data());
  }
  Tensor workspace;
  if (p.workspace > 0) workspace = Tensor::empty({p.workspace}, DType::U8, device);
  fe::error_t status = p.graph->execute(cuda::cudnn_handle(), pack,
                                        workspace.defined() ? workspace.data() : nullptr);
  KILN_CHECK(status.is_good(), std::string("cuDNN fused ") + pattern_name(pattern) +
                                   " failed: " + status.get_message());
}

// KILN_CONV_BN_PATTERNS="forward,filter,data" (a subset) limits the fusion to those patterns,
// for measuring what each one brings; unset: all three.
bool pattern_enabled(Pattern pattern) {
  static const std::string chosen = [] {
    const char* v = std::getenv("KILN_CONV_BN_PATTERNS");
    return v ? "," + std::string(v) + "," : std::string(",forward,filter,data,");
  }();
  const char* name = pattern == Pattern::Forward          ? ",forward,"
                     : pattern == Pattern::BackwardFilter ? ",filter,"
                                                          : ",data,";
  return chosen.find(name) != std::string::npos;
}

}  // namespace

bool supported(Pattern pattern, const Conv2dGeometry& g, const ConvAlgorithmOptions& options) {
  return pattern_enabled(pattern) && plan_for(pattern, g, options).supported;
}

Counts counts() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.counts_mutex);
  return r.counts;
}

void forward(const Conv2dGeometry& g, const ConvAlgorithmOptions& options, const Tensor& x,
             const Tensor& scale, const Tensor& bias, const Tensor& w, Tensor& y, Tensor& sum,
             Tensor& sq_sum) {
  execute(plan_for(Pattern::Forward, g, options), {&x, &scale, &bias, &w, &y, &sum, &sq_sum},
          x.device(), Pattern::Forward);
}

void backward_filter(const Conv2dGeometry& g, const ConvAlgorithmOptions& options, const Tensor& x,
                     const Tensor& scale, const Tensor& bias, const Tensor& dy, Tensor& dw) {
  execute(plan_for(Pattern::BackwardFilter, g, options), {&x, &scale, &bias, &dy, &dw}, x.device(),
          Pattern::BackwardFilter);
}

void backward_data(const Conv2dGeometry& g, const ConvAlgorithmOptions& options, const Tensor& dy,
                   const Tensor& w, const Tensor& x, const Tensor& mean, const Tensor& invstd,
                   const Tensor& gamma, const Tensor& beta, Tensor& grad, Tensor& dscale,
                   Tensor& dbias, Tensor& eq_dy, Tensor& eq_x, Tensor& eq_bias) {
  execute(
      plan_for(Pattern::BackwardData, g, options),
      {&dy, &w, &x, &mean, &invstd, &gamma, &beta, &grad, &dscale, &dbias, &eq_dy, &eq_x, &eq_bias},
      x.device(), Pattern::BackwardData);
}

}  // namespace kiln::conv_bn_fusion
