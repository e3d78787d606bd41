// Convolutions through cuDNN's graph (backend) API with cached execution plans; see
// conv2d_graph.h. Every descriptor a plan was built from is kept with it for the plan's life.

#include "layers/cuda/conv2d_graph.h"

#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/cuda/cuda_check.h"
#include "core/cuda/cudnn_check.h"
#include "core/cuda/cudnn_descriptors.h"
#include "core/cuda/cudnn_handle.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "layers/cuda/plan_cache.h"

namespace kiln::cudnn_conv::graph {
namespace {

using Descriptor = cuda::BackendDescriptor;
using DescriptorPtr = std::unique_ptr<Descriptor>;

DescriptorPtr make(cudnnBackendDescriptorType_t type) {
  return std::make_unique<Descriptor>(type);
}

constexpr std::int64_t kAlignment = 16;
constexpr std::int64_t kIdA = 1, kIdB = 2, kIdOut = 3;

cudnnDataType_t data_type(DType t) {
  switch (t) {
    case DType::F16:
      return CUDNN_DATA_HALF;
    case DType::BF16:
      return CUDNN_DATA_BFLOAT16;
    default:
      return CUDNN_DATA_FLOAT;
  }
}

// A logical (N, C, H, W) tensor with NCHW or NHWC strides.
DescriptorPtr tensor(std::int64_t id, DType dtype, std::int64_t n, std::int64_t c, std::int64_t h,
                     std::int64_t w, bool channels_last) {
  auto d = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const cudnnDataType_t dt = data_type(dtype);
  const std::int64_t dims[4] = {n, c, h, w};
  const std::int64_t nchw[4] = {c * h * w, h * w, w, 1};
  const std::int64_t nhwc[4] = {h * w * c, 1, w * c, c};
  d->set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, &dt);
  d->set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, dims, 4);
  d->set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, channels_last ? nhwc : nchw, 4);
  d->set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, &id);
  d->set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, &kAlignment);
  d->finalize();
  return d;
}

struct Plan {
  std::vector<DescriptorPtr> keep;  // tensors, convolution, operation, graph, engine config
  DescriptorPtr plan;
  std::int64_t workspace = 0;
};

PlanCache<Plan>& plans() {
  static PlanCache<Plan> cache;
  return cache;
}

const char* direction_name(Direction d) {
  return d == Direction::Forward        ? "forward"
         : d == Direction::BackwardData ? "backward-data"
                                        : "backward-filter";
}

// The descriptor type and attribute names of one direction's convolution operation.
struct OperationAttributes {
  cudnnBackendDescriptorType_t type;
  cudnnBackendAttributeName_t x, w, y, conv, alpha, beta;
};

const OperationAttributes& attributes_of(Direction d) {
  static const OperationAttributes forward{CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
                                           CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
                                           CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
                                           CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
                                           CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
                                           CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
                                           CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA};
  static const OperationAttributes data{
      CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA};
  static const OperationAttributes filter{
      CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA};
  return d == Direction::Forward ? forward : d == Direction::BackwardData ? data : filter;
}

// The engine's numerical notes rule it out for these options: TF32 (tensor cores or down-
// converted inputs) for f32 data, half-precision accumulation for halves, non-determinism when
// determinism is asked.
bool engine_acceptable(cudnnBackendDescriptor_t config, const Conv2dGeometry& g,
                       const ConvAlgorithmOptions& o) {
  Descriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  std::int64_t n = 0;
  cudnnBackendDescriptor_t e = engine.get();
  if (cudnnBackendGetAttribute(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                               1, &n, &e) != CUDNN_STATUS_SUCCESS) {
    return false;
  }
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  n = 0;
  if (cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n,
                               notes) != CUDNN_STATUS_SUCCESS) {
    return false;
  }
  for (std::int64_t i = 0; i < n; ++i) {
    const cudnnBackendNumericalNote_t note = notes[i];
    if (g.dtype == DType::F32 && (note == CUDNN_NUMERICAL_NOTE_TENSOR_CORE ||
                                  note == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS)) {
      return false;
    }
    if (note == CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION) return false;
    if (o.deterministic && note == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) return false;
  }
  return true;
}

// Runs a plan with these pointers on the current stream.
void run(const Descriptor& plan, void* const pointers[3], void* workspace) {
  static const std::int64_t ids[3] = {kIdA, kIdB, kIdOut};
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, ids, 3);
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, pointers, 3);
  pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, &workspace);
  pack.finalize();
  KILN_CUDNN_CHECK(cudnnBackendExecute(cuda::cudnn_handle(), plan.get(), pack.get()));
}

// Builds the plan of one direction, or returns null when no engine passes.
std::unique_ptr<Plan> build(const Conv2dGeometry& g, const ConvAlgorithmOptions& o,
                            Direction direction, double beta) {
  auto p = std::make_unique<Plan>();
  const bool cl = g.channels_last;
  DescriptorPtr x, w, y;
  auto retensor = [&](DescriptorPtr& t, std::int64_t id, std::int64_t n, std::int64_t c,
                      std::int64_t h,
                      std::int64_t wd) { t = tensor(id, g.dtype, n, c, h, wd, cl); };
  // Unique ids in the order a call passes its pointers: (a, b, out).
  switch (direction) {
    case Direction::Forward:  // a = x, b = w, out = y
      retensor(x, kIdA, g.batch, g.in_channels, g.height, g.width);
      retensor(w, kIdB, g.out_channels, g.in_channels, g.kernel_h, g.kernel_w);
      retensor(y, kIdOut, g.batch, g.out_channels, g.out_height(), g.out_width());
      break;
    case Direction::BackwardData:  // a = dy, b = w, out = dx
      retensor(y, kIdA, g.batch, g.out_channels, g.out_height(), g.out_width());
      retensor(w, kIdB, g.out_channels, g.in_channels, g.kernel_h, g.kernel_w);
      retensor(x, kIdOut, g.batch, g.in_channels, g.height, g.width);
      break;
    case Direction::BackwardFilter:  // a = x, b = dy, out = dw
      retensor(x, kIdA, g.batch, g.in_channels, g.height, g.width);
      retensor(y, kIdB, g.batch, g.out_channels, g.out_height(), g.out_width());
      retensor(w, kIdOut, g.out_channels, g.in_channels, g.kernel_h, g.kernel_w);
      break;
  }

  auto conv = make(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const std::int64_t dims = 2;
  const std::int64_t pad[2] = {g.pad_h, g.pad_w}, stride[2] = {g.stride_h, g.stride_w},
                     dilation[2] = {g.dilation_h, g.dilation_w};
  conv->set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &compute);
  conv->set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, &mode);
  conv->set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, &dims);
  conv->set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, pad, 2);
  conv->set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, pad, 2);
  conv->set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, stride, 2);
  conv->set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, dilation, 2);
  conv->finalize();

  // The operation of this direction: x, w and y are its (d)x, (d)w and (d)y.
  const OperationAttributes& a = attributes_of(direction);
  const float alpha = 1.0f, beta_f = static_cast<float>(beta);
  DescriptorPtr op = make(a.type);
  op->set(a.x, *x);
  op->set(a.w, *w);
  op->set(a.y, *y);
  op->set(a.conv, *conv);
  op->set(a.alpha, CUDNN_TYPE_FLOAT, &alpha);
  op->set(a.beta, CUDNN_TYPE_FLOAT, &beta_f);
  op->finalize();

  cudnnHandle_t handle = cuda::cudnn_handle();
  auto op_graph = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  cudnnBackendDescriptor_t ops[1] = {op->get()};
  op_graph->set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, ops, 1);
  op_graph->set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, &handle);
  if (!op_graph->try_finalize()) return nullptr;

  auto heuristics = make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  const cudnnBackendHeurMode_t heur_mode = CUDNN_HEUR_MODE_A;
  heuristics->set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, *op_graph);
  heuristics->set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, &heur_mode);
  if (!heuristics->try_finalize()) return nullptr;
  std::int64_t count = 0;
  if (cudnnBackendGetAttribute(heuristics->get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                               nullptr) != CUDNN_STATUS_SUCCESS ||
      count <= 0) {
    return nullptr;
  }
  std::vector<DescriptorPtr> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (std::int64_t i = 0; i < count; ++i) {
    configs.push_back(make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
    raw.push_back(configs.back()->get());
  }
  std::int64_t returned = 0;
  if (cudnnBackendGetAttribute(heuristics->get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &returned,
                               raw.data()) != CUDNN_STATUS_SUCCESS) {
    return nullptr;
  }

  // Candidates: the heuristics' order, filtered; benchmark mode times the first few.
  struct Candidate {
    std::size_t config;
    DescriptorPtr plan;
    std::int64_t workspace;
  };
  std::vector<Candidate> candidates;
  const std::size_t wanted = o.search == ConvAlgorithmSearch::Benchmark ? 8 : 1;
  for (std::size_t i = 0; i < static_cast<std::size_t>(returned) && candidates.size() < wanted;
       ++i) {
    if (!engine_acceptable(raw[i], g, o)) continue;
    auto plan = make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    plan->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, &handle);
    plan->set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, *configs[i]);
    if (!plan->try_finalize()) continue;
    std::int64_t ws = 0, n = 0;
    KILN_CUDNN_CHECK(cudnnBackendGetAttribute(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                              CUDNN_TYPE_INT64, 1, &n, &ws));
    if (ws < 0 || static_cast<std::size_t>(ws) > o.workspace_limit) continue;
    candidates.push_back({i, std::move(plan), ws});
  }
  if (candidates.empty()) return nullptr;

  std::size_t best = 0;
  if (candidates.size() > 1) {
    // Time each candidate on scratch tensors (nothing real is overwritten): one warm-up run,
    // then the best of three.
    int device = 0;
    KILN_CUDA_CHECK(cudaGetDevice(&device));
    const Device dev = Device::cuda(device);
    auto scratch = [&](std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t wd) {
      return Tensor::zeros({n * c * h * wd}, g.dtype, dev);
    };
    Tensor tx = scratch(g.batch, g.in_channels, g.height, g.width);
    Tensor tw = scratch(g.out_channels, g.in_channels, g.kernel_h, g.kernel_w);
    Tensor ty = scratch(g.batch, g.out_channels, g.out_height(), g.out_width());
    void* pointers[3];
    switch (direction) {
      case Direction::Forward:
        pointers[0] = tx.data(), pointers[1] = tw.data(), pointers[2] = ty.data();
        break;
      case Direction::BackwardData:
        pointers[0] = ty.data(), pointers[1] = tw.data(), pointers[2] = tx.data();
        break;
      case Direction::BackwardFilter:
        pointers[0] = tx.data(), pointers[1] = ty.data(), pointers[2] = tw.data();
        break;
    }
    void* stream = current_stream(dev);
    Event start(dev, /*timing=*/true), stop(dev, /*timing=*/true);
    float best_ms = 0;
    std::string log;
    for (std::size_t c = 0; c < candidates.size(); ++c) {
      Tensor ws =
          Tensor::empty({std::max<std::int64_t>(candidates[c].workspace, 1)}, DType::U8, dev);
      float ms = 1e30f;
      for (int rep = 0; rep < 4; ++rep) {
        start.record(stream);
        run(*candidates[c].plan, pointers, ws.data());
        stop.record(stream);
        stop.synchronize();
        float t = start.elapsed_ms(stop);
        if (rep > 0) ms = std::min(ms, t);
      }
      if (c == 0 || ms < best_ms) best = c, best_ms = ms;
      char item[64];
      std::snprintf(item, sizeof item, " [%zu: %.3f ms, %.0f MiB]", candidates[c].config,
                    static_cast<double>(ms), candidates[c].workspace / 1048576.0);
      log += item;
    }
    if (std::getenv("KILN_CONV_LOG")) {
      std::fprintf(stderr, "kiln conv graph: %s %s beta %g: chose config %zu;%s\n", g.str().c_str(),
                   direction_name(direction), beta, candidates[best].config, log.c_str());
    }
  }
  p->plan = std::move(candidates[best].plan);
  p->workspace = candidates[best].workspace;
  p->keep.push_back(std::move(x));
  p->keep.push_back(std::move(w));
  p->keep.push_back(std::move(y));
  p->keep.push_back(std::move(conv));
  p->keep.push_back(std::move(op));
  p->keep.push_back(std::move(op_graph));
  p->keep.push_back(std::move(configs[candidates[best].config]));
  return p;
}

}  // namespace

int plan_for(const Conv2dGeometry& g, const ConvAlgorithmOptions& o, Direction direction,
             double beta) {
  static const bool legacy = std::getenv("KILN_CONV_LEGACY") != nullptr;
  if (legacy || g.dtype == DType::F64 || g.groups != 1 || (beta != 0.0 && beta != 1.0)) {
    return -1;
  }
  int device = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  const std::string key = "cuda:" + std::to_string(device) + " " + g.str() + " " +
                          direction_name(direction) + " beta " + std::to_string(beta) +
                          (o.search == ConvAlgorithmSearch::Benchmark ? " benchmark" : "") +
                          (o.deterministic ? " deterministic" : "") + " ws " +
                          std::to_string(o.workspace_limit);
  const auto entry = plans().find_or_build(
      key, [&] { return build(g, o, direction, beta); }, [](Plan*) {});
  return entry.plan != nullptr ? static_cast<int>(entry.index) : -1;
}

bool execute(int plan, const void* a, const void* b, void* out, Device device) {
  for (const void* p : {a, b, static_cast<const void*>(out)}) {
    if (reinterpret_cast<std::uintptr_t>(p) % kAlignment != 0) return false;
  }
  const Plan* p = plans().at(static_cast<std::size_t>(plan));
  Tensor workspace;
  if (p->workspace > 0) workspace = Tensor::empty({p->workspace}, DType::U8, device);
  void* pointers[3] = {const_cast<void*>(a), const_cast<void*>(b), out};
  run(*p->plan, pointers, workspace.defined() ? workspace.data() : nullptr);
  return true;
}

}  // namespace kiln::cudnn_conv::graph
