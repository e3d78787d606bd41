// Conv2d on cuDNN's convolution API (cudnnConvolutionForward / BackwardData / BackwardFilter).
// Lifecycle: can_implement -> setup (choose the algorithms and their workspace, once per geometry,
// cached process-wide) -> run. f32 runs with CUDNN_FMA_MATH so that no TF32 rounding creeps in
// and results match the CPU; f16/bf16 run on tensor cores; compute (accumulation) type is fp32.

// cuDNN 9 marks this API deprecated in favour of its graph API, but it is the supported, tuned
// path on the 9.14 runtime of the GPU machine; the warnings are silenced for this file only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/cuda/cuda_check.h"
#include "core/cuda/cudnn_check.h"
#include "core/cuda/cudnn_descriptors.h"
#include "core/cuda/cudnn_handle.h"
#include "core/cuda/handles.h"
#include "layers/cuda/conv2d_cuda.h"
#include "layers/cuda/conv2d_graph.h"

namespace kiln::cudnn_conv {
namespace {

cudnnDataType_t cudnn_dtype(DType t) {
  switch (t) {
    case DType::F32:
      return CUDNN_DATA_FLOAT;
    case DType::F16:
      return CUDNN_DATA_HALF;
    case DType::BF16:
      return CUDNN_DATA_BFLOAT16;
    case DType::F64:
      return CUDNN_DATA_DOUBLE;
    default:
      KILN_CHECK(false, std::string("cuDNN convolution of ") + dtype_name(t));
  }
  return CUDNN_DATA_FLOAT;
}

using cuda::ConvolutionDescriptor;
using cuda::FilterDescriptor;
using cuda::TensorDescriptor;

// The descriptors of one geometry. Set-up failures come back as a status, not an exception, so
// that can_implement can ask.
struct Descriptors {
  TensorDescriptor x, y;
  FilterDescriptor w;
  ConvolutionDescriptor conv;

  cudnnStatus_t set(const Conv2dGeometry& g) {
    cudnnTensorFormat_t format = g.channels_last ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    cudnnDataType_t dt = cudnn_dtype(g.dtype);
    auto i = [](std::int64_t v) { return static_cast<int>(v); };
    cudnnStatus_t s = cudnnSetTensor4dDescriptor(x.get(), format, dt, i(g.batch), i(g.in_channels),
                                                 i(g.height), i(g.width));
    if (s != CUDNN_STATUS_SUCCESS) return s;
    s = cudnnSetTensor4dDescriptor(y.get(), format, dt, i(g.batch), i(g.out_channels),
                                   i(g.out_height()), i(g.out_width()));
    if (s != CUDNN_STATUS_SUCCESS) return s;
    s = cudnnSetFilter4dDescriptor(w.get(), dt, format, i(g.out_channels),
                                   i(g.in_channels / g.groups), i(g.kernel_h), i(g.kernel_w));
    if (s != CUDNN_STATUS_SUCCESS) return s;
    cudnnDataType_t compute = g.dtype == DType::F64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    s = cudnnSetConvolution2dDescriptor(conv.get(), i(g.pad_h), i(g.pad_w), i(g.stride_h),
                                        i(g.stride_w), i(g.dilation_h), i(g.dilation_w),
                                        CUDNN_CROSS_CORRELATION, compute);
    if (s != CUDNN_STATUS_SUCCESS) return s;
    s = cudnnSetConvolutionGroupCount(conv.get(), i(g.groups));
    if (s != CUDNN_STATUS_SUCCESS) return s;
    return cudnnSetConvolutionMathType(conv.get(), requested_math(g));
  }

  static cudnnMathType_t requested_math(const Conv2dGeometry& g) {
    return is_half(g.dtype) ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH;
  }
};

std::string key_of(const Conv2dGeometry& g) {
  int device = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  return "cuda:" + std::to_string(device) + " " + g.str();
}

std::string key_of(const Conv2dGeometry& g, const ConvAlgorithmOptions& o) {
  return key_of(g) + (o.search == ConvAlgorithmSearch::Benchmark ? " benchmark" : " heuristic") +
         (o.deterministic ? " deterministic" : "") + " ws " + std::to_string(o.workspace_limit);
}

struct Cache {
  std::mutex mutex;
  std::map<std::string, std::unique_ptr<Descriptors>> descriptors;
  std::map<std::string, ConvAlgorithmChoice> choices;
};

Cache& cache() {
  static Cache c;
  return c;
}

// The descriptors of g, created once; stable for the life of the process.
Descriptors& descriptors_for(const Conv2dGeometry& g) {
  std::string key = key_of(g);
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  auto it = c.descriptors.find(key);
  if (it != c.descriptors.end()) return *it->second;
  auto d = std::make_unique<Descriptors>();
  KILN_CUDNN_CHECK(d->set(g));
  Descriptors& ref = *d;
  c.descriptors.emplace(key, std::move(d));
  return ref;
}

// An algorithm result is usable when it ran, fits the workspace limit, is deterministic when
// asked, and does not use TF32 for f32 data.
template <typename Perf>
bool acceptable(const Perf& p, const Conv2dGeometry& g, const ConvAlgorithmOptions& o) {
  if (p.status != CUDNN_STATUS_SUCCESS || p.memory > o.workspace_limit) return false;
  if (o.deterministic && p.determinism != CUDNN_DETERMINISTIC) return false;
  if (!is_half(g.dtype) &&
      (p.mathType == CUDNN_TENSOR_OP_MATH || p.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION)) {
    return false;
  }
  return true;
}

// KILN_CONV_LOG=1: one stderr line per choice, with what the search measured (ms, MiB) for the
// first results, to find the geometries and directions where cuDNN has no fast algorithm.
template <typename Perf>
void log_choice(const Conv2dGeometry& g, const char* direction, const std::vector<Perf>& perf,
                int returned, int chosen) {
  std::string line = "kiln conv: " + g.str() + " " + direction + ": chose algo " +
                     std::to_string(static_cast<int>(perf[chosen].algo)) + "; results";
  for (int i = 0; i < returned && i < 6; ++i) {
    char item[96];
    std::snprintf(item, sizeof item, " [%d: %.3f ms, %.0f MiB%s]", static_cast<int>(perf[i].algo),
                  perf[i].time, perf[i].memory / 1048576.0,
                  perf[i].status == CUDNN_STATUS_SUCCESS ? "" : ", failed");
    line += item;
  }
  std::fprintf(stderr, "%s\n", line.c_str());
}

// Picks the first usable result of a heuristic query or a benchmark (both come sorted best
// first). `query(perf, n, returned, workspace, workspace_bytes)` fills results; the heuristic
// query ignores the workspace. The benchmark gets as much workspace as the heuristics say the
// largest usable algorithm needs.
template <typename Perf, typename Heuristic, typename Benchmark>
Perf choose(const Conv2dGeometry& g, const ConvAlgorithmOptions& o, int max_count,
            Heuristic heuristic, Benchmark benchmark, const char* direction) {
  std::vector<Perf> perf(static_cast<std::size_t>(std::max(max_count, 1)));
  int returned = 0;
  heuristic(perf.data(), max_count, &returned);
  if (o.search == ConvAlgorithmSearch::Benchmark) {
    std::size_t workspace_bytes = 0;
    for (int i = 0; i < returned; ++i) {
      if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= o.workspace_limit) {
        workspace_bytes = std::max(workspace_bytes, perf[i].memory);
      }
    }
    int device = 0;
    KILN_CUDA_CHECK(cudaGetDevice(&device));
    Tensor workspace =
        Tensor::empty({static_cast<std::int64_t>(std::max<std::size_t>(workspace_bytes, 1))},
                      DType::U8, Device::cuda(device));
    returned = 0;
    benchmark(perf.data(), max_count, &returned, workspace.data(), workspace_bytes);
  }
  for (int i = 0; i < returned; ++i) {
    if (acceptable(perf[i], g, o)) {
      if (std::getenv("KILN_CONV_LOG")) log_choice(g, direction, perf, returned, i);
      return perf[i];
    }
  }
  throw Error(std::string("cuDNN offers no usable ") + direction + " algorithm for " + g.str() +
              (o.deterministic ? " (deterministic only)" : "") + " within a workspace of " +
              std::to_string(o.workspace_limit) + " bytes");
}

Tensor workspace_tensor(std::size_t bytes, Device device) {
  if (bytes == 0) return Tensor();
  return Tensor::empty({static_cast<std::int64_t>(bytes)}, DType::U8, device);
}

void* data_or_null(const Tensor& t) {
  return t.defined() ? t.data() : nullptr;
}

// alpha and beta are float for float/half data, double for double data.
struct Scalars {
  float f[2];
  double d[2];
  bool is_double;
  Scalars(double alpha, double beta, DType dtype)
      : f{static_cast<float>(alpha), static_cast<float>(beta)},
        d{alpha, beta},
        is_double(dtype == DType::F64) {}
  const void* alpha() const { return is_double ? static_cast<const void*>(&d[0]) : &f[0]; }
  const void* beta() const { return is_double ? static_cast<const void*>(&d[1]) : &f[1]; }
};

void check_operand(const Tensor& t, const Shape& shape, DType dtype, const char* what) {
  KILN_CHECK(t.device().is_cuda() && t.is_contiguous() && t.shape() == shape && t.dtype() == dtype,
             std::string("cudnn_conv: ") + what + " is " + t.str() + ", expected " +
                 dtype_name(dtype) + " " + shape_str(shape) + " contiguous on CUDA");
}

Shape x_shape(const Conv2dGeometry& g) {
  return g.channels_last ? Shape{g.batch, g.height, g.width, g.in_channels}
                         : Shape{g.batch, g.in_channels, g.height, g.width};
}
Shape y_shape(const Conv2dGeometry& g) {
  return g.channels_last ? Shape{g.batch, g.out_height(), g.out_width(), g.out_channels}
                         : Shape{g.batch, g.out_channels, g.out_height(), g.out_width()};
}
Shape w_shape(const Conv2dGeometry& g) {
  std::int64_t c = g.in_channels / g.groups;
  return g.channels_last ? Shape{g.out_channels, g.kernel_h, g.kernel_w, c}
                         : Shape{g.out_channels, c, g.kernel_h, g.kernel_w};
}

}  // namespace

bool can_implement(const Conv2dGeometry& g, std::string* why) {
  auto no = [&](const std::string& reason) {
    if (why) *why = reason;
    return false;
  };
  if (g.dtype != DType::F32 && g.dtype != DType::F16 && g.dtype != DType::BF16) {
    return no(std::string("dtype ") + dtype_name(g.dtype) + " (f32, f16 and bf16 are supported)");
  }
  if (g.groups <= 0 || g.in_channels % g.groups != 0 || g.out_channels % g.groups != 0) {
    return no("channels are not multiples of groups");
  }
  if (g.out_height() <= 0 || g.out_width() <= 0) return no("the kernel does not fit the input");
  const std::int64_t int_max = 2147483647;
  if (g.batch * g.in_channels * g.height * g.width > int_max ||
      g.batch * g.out_channels * g.out_height() * g.out_width() > int_max) {
    return no("a tensor has more than 2^31 elements");
  }
  Descriptors d;
  cudnnStatus_t s = d.set(g);
  if (s != CUDNN_STATUS_SUCCESS) return no(std::string("descriptor: ") + cudnnGetErrorString(s));
  int n = 0, c = 0, h = 0, w = 0;
  s = cudnnGetConvolution2dForwardOutputDim(d.conv.get(), d.x.get(), d.w.get(), &n, &c, &h, &w);
  if (s != CUDNN_STATUS_SUCCESS) return no(std::string("output size: ") + cudnnGetErrorString(s));
  if (n != g.batch || c != g.out_channels || h != g.out_height() || w != g.out_width()) {
    return no("cuDNN computes a different output size");
  }
  return true;
}

ConvAlgorithmChoice setup(const Conv2dGeometry& g, const ConvAlgorithmOptions& o) {
  std::string key = key_of(g, o);
  {
    std::lock_guard<std::mutex> lock(cache().mutex);
    auto it = cache().choices.find(key);
    if (it != cache().choices.end()) return it->second;
  }
  Descriptors& d = descriptors_for(g);
  cudnnHandle_t handle = cuda::cudnn_handle();
  KILN_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv.get(), Descriptors::requested_math(g)));
  int device = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  const Device dev = Device::cuda(device);
  ConvAlgorithmChoice choice;
  // The graph API's plans first; the legacy algorithms only for a direction without one (their
  // search would cost start-up time for nothing). Graph plans honour `deterministic` by filter.
  choice.graph_forward = graph::plan_for(g, o, graph::Direction::Forward, 0.0);
  choice.graph_backward_data = graph::plan_for(g, o, graph::Direction::BackwardData, 0.0);
  choice.graph_backward_filter = graph::plan_for(g, o, graph::Direction::BackwardFilter, 0.0);
  choice.graph_backward_filter_accumulate =
      graph::plan_for(g, o, graph::Direction::BackwardFilter, 1.0);
  const bool legacy_forward = choice.graph_forward < 0;
  const bool legacy_data = choice.graph_backward_data < 0;
  const bool legacy_filter =
      choice.graph_backward_filter < 0 || choice.graph_backward_filter_accumulate < 0;
  choice.forward_deterministic = choice.backward_data_deterministic =
      choice.backward_filter_deterministic = o.deterministic;

  // Benchmarks run on scratch tensors, so no real output or gradient is overwritten.
  Tensor x, w, y;
  if (o.search == ConvAlgorithmSearch::Benchmark &&
      (legacy_forward || legacy_data || legacy_filter)) {
    x = Tensor::zeros(x_shape(g), g.dtype, dev);
    w = Tensor::zeros(w_shape(g), g.dtype, dev);
    y = Tensor::zeros(y_shape(g), g.dtype, dev);
  }
  int max_count = 0;

  if (legacy_forward) {
    KILN_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(handle, &max_count));
    auto fwd = choose<cudnnConvolutionFwdAlgoPerf_t>(
        g, o, max_count,
        [&](cudnnConvolutionFwdAlgoPerf_t* p, int n, int* returned) {
          KILN_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(
              handle, d.x.get(), d.w.get(), d.conv.get(), d.y.get(), n, returned, p));
        },
        [&](cudnnConvolutionFwdAlgoPerf_t* p, int n, int* returned, void* ws, std::size_t bytes) {
          KILN_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(
              handle, d.x.get(), x.data(), d.w.get(), w.data(), d.conv.get(), d.y.get(), y.data(),
              n, returned, p, ws, bytes));
        },
        "forward");
    choice.forward = static_cast<int>(fwd.algo);
    choice.forward_workspace = fwd.memory;
    choice.forward_deterministic = fwd.determinism == CUDNN_DETERMINISTIC;
    choice.forward_math = static_cast<int>(fwd.mathType);
  }

  if (legacy_data) {
    KILN_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(handle, &max_count));
    auto bwd_data = choose<cudnnConvolutionBwdDataAlgoPerf_t>(
        g, o, max_count,
        [&](cudnnConvolutionBwdDataAlgoPerf_t* p, int n, int* returned) {
          KILN_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
              handle, d.w.get(), d.y.get(), d.conv.get(), d.x.get(), n, returned, p));
        },
        [&](cudnnConvolutionBwdDataAlgoPerf_t* p, int n, int* returned, void* ws,
            std::size_t bytes) {
          KILN_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(
              handle, d.w.get(), w.data(), d.y.get(), y.data(), d.conv.get(), d.x.get(), x.data(),
              n, returned, p, ws, bytes));
        },
        "backward-data");
    choice.backward_data = static_cast<int>(bwd_data.algo);
    choice.backward_data_workspace = bwd_data.memory;
    choice.backward_data_deterministic = bwd_data.determinism == CUDNN_DETERMINISTIC;
    choice.backward_data_math = static_cast<int>(bwd_data.mathType);
  }

  if (legacy_filter) {
    KILN_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(handle, &max_count));
    auto bwd_filter = choose<cudnnConvolutionBwdFilterAlgoPerf_t>(
        g, o, max_count,
        [&](cudnnConvolutionBwdFilterAlgoPerf_t* p, int n, int* returned) {
          KILN_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
              handle, d.x.get(), d.y.get(), d.conv.get(), d.w.get(), n, returned, p));
        },
        [&](cudnnConvolutionBwdFilterAlgoPerf_t* p, int n, int* returned, void* ws,
            std::size_t bytes) {
          KILN_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(
              handle, d.x.get(), x.data(), d.y.get(), y.data(), d.conv.get(), d.w.get(), w.data(),
              n, returned, p, ws, bytes));
        },
        "backward-filter");
    choice.backward_filter = static_cast<int>(bwd_filter.algo);
    choice.backward_filter_workspace = bwd_filter.memory;
    choice.backward_filter_deterministic = bwd_filter.determinism == CUDNN_DETERMINISTIC;
    choice.backward_filter_math = static_cast<int>(bwd_filter.mathType);
  }

  std::lock_guard<std::mutex> lock(cache().mutex);
  cache().choices.emplace(key, choice);
  return choice;
}

namespace {

// Runs a graph plan when there is one and the pointers suit it; false: use the legacy call.
bool run_graph(int plan, const void* a, const void* b, void* out, Device device) {
  return plan >= 0 && graph::execute(plan, a, b, out, device);
}

}  // namespace

void forward(const Conv2dGeometry& g, const ConvAlgorithmChoice& algos, const Tensor& x,
             const Tensor& w, Tensor& y) {
  check_operand(x, x_shape(g), g.dtype, "x");
  check_operand(w, w_shape(g), g.dtype, "w");
  check_operand(y, y_shape(g), g.dtype, "y");
  if (run_graph(algos.graph_forward, x.data(), w.data(), y.data(), x.device())) return;
  Descriptors& d = descriptors_for(g);
  KILN_CUDNN_CHECK(
      cudnnSetConvolutionMathType(d.conv.get(), static_cast<cudnnMathType_t>(algos.forward_math)));
  Tensor ws = workspace_tensor(algos.forward_workspace, x.device());
  Scalars s(1.0, 0.0, g.dtype);
  KILN_CUDNN_CHECK(cudnnConvolutionForward(
      cuda::cudnn_handle(), s.alpha(), d.x.get(), x.data(), d.w.get(), w.data(), d.conv.get(),
      static_cast<cudnnConvolutionFwdAlgo_t>(algos.forward), data_or_null(ws),
      algos.forward_workspace, s.beta(), d.y.get(), y.data()));
}

void backward_data(const Conv2dGeometry& g, const ConvAlgorithmChoice& algos, const Tensor& dy,
                   const Tensor& w, Tensor& dx) {
  check_operand(dy, y_shape(g), g.dtype, "dy");
  check_operand(w, w_shape(g), g.dtype, "w");
  check_operand(dx, x_shape(g), g.dtype, "dx");
  if (run_graph(algos.graph_backward_data, dy.data(), w.data(), dx.data(), dy.device())) return;
  Descriptors& d = descriptors_for(g);
  KILN_CUDNN_CHECK(cudnnSetConvolutionMathType(
      d.conv.get(), static_cast<cudnnMathType_t>(algos.backward_data_math)));
  Tensor ws = workspace_tensor(algos.backward_data_workspace, dy.device());
  Scalars s(1.0, 0.0, g.dtype);
  KILN_CUDNN_CHECK(cudnnConvolutionBackwardData(
      cuda::cudnn_handle(), s.alpha(), d.w.get(), w.data(), d.y.get(), dy.data(), d.conv.get(),
      static_cast<cudnnConvolutionBwdDataAlgo_t>(algos.backward_data), data_or_null(ws),
      algos.backward_data_workspace, s.beta(), d.x.get(), dx.data()));
}

void backward_filter(const Conv2dGeometry& g, const ConvAlgorithmChoice& algos, const Tensor& x,
                     const Tensor& dy, Tensor& dw, double beta) {
  check_operand(x, x_shape(g), g.dtype, "x");
  check_operand(dy, y_shape(g), g.dtype, "dy");
  check_operand(dw, w_shape(g), g.dtype, "dw");
  const int plan = beta == 0.0   ? algos.graph_backward_filter
                   : beta == 1.0 ? algos.graph_backward_filter_accumulate
                                 : -1;
  if (run_graph(plan, x.data(), dy.data(), dw.data(), x.device())) return;
  Descriptors& d = descriptors_for(g);
  KILN_CUDNN_CHECK(cudnnSetConvolutionMathType(
      d.conv.get(), static_cast<cudnnMathType_t>(algos.backward_filter_math)));
  Tensor ws = workspace_tensor(algos.backward_filter_workspace, x.device());
  Scalars s(1.0, beta, g.dtype);
  KILN_CUDNN_CHECK(cudnnConvolutionBackwardFilter(
      cuda::cudnn_handle(), s.alpha(), d.x.get(), x.data(), d.y.get(), dy.data(), d.conv.get(),
      static_cast<cudnnConvolutionBwdFilterAlgo_t>(algos.backward_filter), data_or_null(ws),
      algos.backward_filter_workspace, s.beta(), d.w.get(), dw.data()));
}

std::size_t cached_plans() {
  std::lock_guard<std::mutex> lock(cache().mutex);
  return cache().choices.size();
}

}  // namespace kiln::cudnn_conv

#pragma GCC diagnostic pop
