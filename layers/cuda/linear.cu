// Linear on CUDA: cuBLASLt GEMMs with fused epilogues, and the small kernels that stand in for
// an epilogue cuBLASLt does not offer for a dtype combination (or that no epilogue can do:
// the activation derivative of this layer's own output, which precedes both backward GEMMs).
//
// Row-major tensors are column-major transposes, so every GEMM below is written in cuBLASLt's
// column-major terms: y^T (out, M) = W (out, in) [row-major] ^T-view x^T.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <tuple>
#include <utility>

#include "core/cuda/cuda_check.h"
#include "core/cuda/element.cuh"
#include "core/cuda/handles.h"
#include "core/ops.h"
#include "core/stream.h"
#include "layers/conv2d.h"
#include "layers/linear.h"

namespace kiln::cuda {
namespace {

constexpr std::size_t kWorkspaceBytes = 32u << 20;  // cuBLAS's recommendation for Hopper

struct LtGemm {
  // Column-major D (m, n) = op(A) op(B) + beta * D.
  bool trans_a = false, trans_b = false;
  std::int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  std::int64_t lda = 0;
  const void* b = nullptr;
  std::int64_t ldb = 0;
  DType ab_type = DType::F32;
  void* d = nullptr;
  std::int64_t ldd = 0;
  DType d_type = DType::F32;
  double beta = 0;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;  // BIAS epilogues: (m) in d_type; BGRADB: output (n) in d_type
  void* aux = nullptr;         // GELU_AUX: pre-activation (m, n) in d_type, leading dim aux_ld
  std::int64_t aux_ld = 0;
};

// The cuBLASLt descriptors and the heuristic's algorithm for one GEMM shape: made once per
// shape, because the heuristic query costs far more host time than the GEMM launch.
struct LtPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  cublasLtMatmulHeuristicResult_t heuristic{};
  bool supported = false;
  LtPlan() = default;
  LtPlan(const LtPlan&) = delete;
  LtPlan& operator=(const LtPlan&) = delete;
  ~LtPlan() {
    if (preference) KILN_IGNORE_ERROR(cublasLtMatmulPreferenceDestroy(preference));
    if (d) KILN_IGNORE_ERROR(cublasLtMatrixLayoutDestroy(d));
    if (b) KILN_IGNORE_ERROR(cublasLtMatrixLayoutDestroy(b));
    if (a) KILN_IGNORE_ERROR(cublasLtMatrixLayoutDestroy(a));
    if (op) KILN_IGNORE_ERROR(cublasLtMatmulDescDestroy(op));
  }
};

// The largest power of two up to 256 that divides the address (cuBLASLt's alignment classes).
std::uint32_t alignment_of(const void* p) {
  auto v = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t a = 256;
  while (a > 1 && v % a != 0) a /= 2;
  return a;
}

using LtPlanKey =
    std::tuple<int, bool, bool, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
               std::int64_t, std::int64_t, int, int, int, bool, bool, std::int64_t, std::uint32_t,
               std::uint32_t, std::uint32_t, std::uint32_t>;

// The epilogue's bias and aux pointers of this call.
void set_epilogue_pointers(const LtGemm& g, cublasLtMatmulDesc_t op) {
  if (g.bias) {
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias,
                                                     sizeof(g.bias)));
  }
  if (g.aux) {
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                     &g.aux, sizeof(g.aux)));
  }
}

constexpr int kAutotuneCandidates = 8;

// One cublasLtMatmul of `g` with `algo`, writing D to `d` (g.d, or scratch when timing).
cublasStatus_t run_matmul(const LtGemm& g, const LtPlan& plan, const cublasLtMatmulAlgo_t& algo,
                          void* d, void* workspace, std::size_t workspace_bytes,
                          cudaStream_t stream) {
  const bool wide = g.ab_type == DType::F64;
  float alpha32 = 1.0f, beta32 = static_cast<float>(g.beta);
  double alpha64 = 1.0, beta64 = g.beta;
  const void* alpha = wide ? static_cast<const void*>(&alpha64) : &alpha32;
  const void* beta = wide ? static_cast<const void*>(&beta64) : &beta32;
  return cublasLtMatmul(cublaslt_handle(), plan.op, alpha, g.a, plan.a, g.b, plan.b, beta, d,
                        plan.d, d, plan.d, &algo, workspace, workspace_bytes, stream);
}

// The index of the fastest of the heuristic's algorithms for `g`, timed on scratch outputs (D,
// and the epilogue's bias gradient or aux when the epilogue writes them), so that the call's own
// outputs are not touched.
int fastest(const LtGemm& g, const LtPlan& plan, const cublasLtMatmulHeuristicResult_t* results,
            int found, Device device) {
  cudaStream_t stream = static_cast<cudaStream_t>(current_stream(device));
  const std::int64_t d_bytes = g.ldd * g.n * static_cast<std::int64_t>(dtype_size(g.d_type));
  Tensor d = Tensor::empty({d_bytes}, DType::U8, device);
  Tensor bias_out, aux_out;
  if (g.epilogue == CUBLASLT_EPILOGUE_BGRADB) {
    bias_out = Tensor::empty({g.n}, g.d_type, device);
    LtGemm bias_only;
    bias_only.bias = bias_out.data();
    set_epilogue_pointers(bias_only, plan.op);
  }
  if (g.aux &&
      (g.epilogue == CUBLASLT_EPILOGUE_GELU_AUX || g.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS)) {
    aux_out = Tensor::empty({g.aux_ld * g.n}, g.d_type, device);
    LtGemm aux_only;
    aux_only.aux = aux_out.data();
    set_epilogue_pointers(aux_only, plan.op);
  }
  cudaEvent_t start, stop;
  KILN_CUDA_CHECK(cudaEventCreate(&start));
  KILN_CUDA_CHECK(cudaEventCreate(&stop));
  int best = 0;
  float best_ms = 1e30f;
  for (int i = 0; i < found; ++i) {
    Tensor ws = Tensor::empty(
        {std::max<std::int64_t>(static_cast<std::int64_t>(results[i].workspaceSize), 1)}, DType::U8,
        device);
    float ms = 1e30f;
    for (int rep = 0; rep < 3; ++rep) {
      KILN_CUDA_CHECK(cudaEventRecord(start, stream));
      cublasStatus_t status = run_matmul(g, plan, results[i].algo, d.data(), ws.data(),
                                         results[i].workspaceSize, stream);
      KILN_CUDA_CHECK(cudaEventRecord(stop, stream));
      KILN_CUDA_CHECK(cudaEventSynchronize(stop));
      if (status != CUBLAS_STATUS_SUCCESS) break;
      float t = 0;
      KILN_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
      if (rep > 0) ms = std::min(ms, t);
    }
    if (ms < best_ms) best = i, best_ms = ms;
  }
  KILN_CUDA_CHECK(cudaEventDestroy(start));
  KILN_CUDA_CHECK(cudaEventDestroy(stop));
  if (std::getenv("KILN_GEMM_LOG")) {
    std::fprintf(stderr, "kiln gemm: m %lld n %lld k %lld epilogue %d: chose %d of %d (%.3f ms)\n",
                 static_cast<long long>(g.m), static_cast<long long>(g.n),
                 static_cast<long long>(g.k), static_cast<int>(g.epilogue), best, found,
                 static_cast<double>(best_ms));
  }
  return best;
}

void make_plan(const LtGemm& g, std::uint32_t align_a, std::uint32_t align_b, std::uint32_t align_d,
               Device device, LtPlan& plan) {
  bool wide = g.ab_type == DType::F64;
  cublasComputeType_t compute = wide ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F;
  cudaDataType_t scale_type = wide ? CUDA_R_64F : CUDA_R_32F;
  KILN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.op, compute, scale_type));
  cublasOperation_t opa = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t opb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  KILN_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
  KILN_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
  KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                   &g.epilogue, sizeof(g.epilogue)));
  // The heuristic must see the pointers' kinds (set or not); their values are set per call.
  set_epilogue_pointers(g, plan.op);
  if (g.aux) {
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                     &g.aux_ld, sizeof(g.aux_ld)));
  }
  auto rows_of = [](bool trans, std::int64_t r, std::int64_t c) { return trans ? c : r; };
  auto cols_of = [](bool trans, std::int64_t r, std::int64_t c) { return trans ? r : c; };
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(
      &plan.a, cuda_data_type(g.ab_type), static_cast<std::uint64_t>(rows_of(g.trans_a, g.m, g.k)),
      static_cast<std::uint64_t>(cols_of(g.trans_a, g.m, g.k)), g.lda));
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(
      &plan.b, cuda_data_type(g.ab_type), static_cast<std::uint64_t>(rows_of(g.trans_b, g.k, g.n)),
      static_cast<std::uint64_t>(cols_of(g.trans_b, g.k, g.n)), g.ldb));
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.d, cuda_data_type(g.d_type),
                                               static_cast<std::uint64_t>(g.m),
                                               static_cast<std::uint64_t>(g.n), g.ldd));
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&plan.preference));
  std::size_t workspace_bytes = kWorkspaceBytes;
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      plan.preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
      sizeof(workspace_bytes)));
  // Algorithms that need more alignment than these pointers have are excluded (the default
  // assumes 256 bytes, which a view into a larger tensor need not have).
  const std::pair<cublasLtMatmulPreferenceAttributes_t, std::uint32_t> alignments[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_d},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d}};
  for (const auto& [attribute, value] : alignments) {
    KILN_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(plan.preference, attribute, &value, sizeof(value)));
  }
  // Benchmark mode (the analogue of cudnn.benchmark, set for convolutions) also times cuBLASLt's
  // candidates once per shape: its first choice can be 10-30 % slower on some of them.
  const bool autotune = default_conv_algorithm_options().search == ConvAlgorithmSearch::Benchmark;
  cublasLtMatmulHeuristicResult_t results[kAutotuneCandidates];
  int found = 0;
  cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      cublaslt_handle(), plan.op, plan.a, plan.b, plan.d, plan.d, plan.preference,
      autotune ? kAutotuneCandidates : 1, results, &found);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || (status == CUBLAS_STATUS_SUCCESS && found == 0)) {
    plan.supported = false;
    return;
  }
  KILN_CUBLAS_CHECK(status);
  plan.supported = true;
  plan.heuristic = results[found > 1 ? fastest(g, plan, results, found, device) : 0];
}

// Runs `g`; false when cuBLASLt has no algorithm for its epilogue and types (the caller falls
// back), any other failure throws.
bool lt_matmul(const LtGemm& g, Device device) {
  if (g.m == 0 || g.n == 0) return true;
  cudaStream_t stream = static_cast<cudaStream_t>(current_stream(device));
  std::uint32_t align_a = alignment_of(g.a), align_b = alignment_of(g.b),
                align_d = alignment_of(g.d), align_bias = g.bias ? alignment_of(g.bias) : 0;
  LtPlanKey key{device.index,
                g.trans_a,
                g.trans_b,
                g.m,
                g.n,
                g.k,
                g.lda,
                g.ldb,
                g.ldd,
                static_cast<int>(g.ab_type),
                static_cast<int>(g.d_type),
                static_cast<int>(g.epilogue),
                g.bias != nullptr,
                g.aux != nullptr,
                g.aux_ld,
                align_a,
                align_b,
                align_d,
                align_bias};
  // One cache per thread: the descriptors are updated with each call's pointers.
  thread_local std::map<LtPlanKey, std::unique_ptr<LtPlan>> plans;
  std::unique_ptr<LtPlan>& slot = plans[key];
  if (!slot) {
    auto plan = std::make_unique<LtPlan>();
    make_plan(g, align_a, align_b, align_d, device, *plan);
    slot = std::move(plan);
  }
  LtPlan& plan = *slot;
  if (!plan.supported) return false;
  set_epilogue_pointers(g, plan.op);
  Tensor workspace =
      Tensor::empty({static_cast<std::int64_t>(plan.heuristic.workspaceSize)}, DType::U8, device);
  cublasStatus_t status = run_matmul(g, plan, plan.heuristic.algo, g.d, workspace.data(),
                                     plan.heuristic.workspaceSize, stream);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) return false;
  KILN_CUBLAS_CHECK(status);
  return true;
}

std::int64_t round_up(std::int64_t v, std::int64_t multiple) {
  return (v + multiple - 1) / multiple * multiple;
}

// z (rows, cols; leading dim ldz) += bias; y (rows, cols) = act(z). y may alias z (act None).
template <typename T>
__global__ void bias_activation_kernel(T* z, std::int64_t ldz, const T* bias, Activation act, T* y,
                                       std::int64_t rows, std::int64_t cols) {
  using C = typename Compute<T>::type;
  std::int64_t n = rows * cols;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t r = i / cols, c = i % cols;
    C v = static_cast<C>(load(z[r * ldz + c]));
    if (bias) v += static_cast<C>(load(bias[c]));
    T stored = store<T>(v);
    z[r * ldz + c] = stored;
    // The activation reads z as stored, as the epilogue path's backward will.
    y[i] = store<T>(activation_apply<C>(act, static_cast<C>(load(stored))));
  }
}

// dz (rows, cols) = dy * act'(saved), saved with leading dim lds.
template <typename T, typename TO>
__global__ void activation_grad_kernel(const T* dy, const T* saved, std::int64_t lds,
                                       Activation act, TO* dz, std::int64_t rows,
                                       std::int64_t cols) {
  using C = typename Compute<T>::type;
  std::int64_t n = rows * cols;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t r = i / cols, c = i % cols;
    C s = static_cast<C>(load(saved[r * lds + c]));
    dz[i] = store<TO>(static_cast<C>(load(dy[i])) * activation_grad<C>(act, s));
  }
}

// grad (cols) += column sums of dz (rows, cols). A block owns 32 columns; its 8 row slices are
// summed in a fixed order, so the result is deterministic.
constexpr int kBiasColumns = 32, kBiasSlices = 8;
template <typename TD, typename TG>
__global__ void bias_grad_kernel(const TD* dz, std::int64_t rows, std::int64_t cols, TG* grad) {
  using C = typename Compute<TD>::type;
  __shared__ C partial[kBiasSlices][kBiasColumns];
  std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * kBiasColumns + threadIdx.x;
  C sum = 0;
  if (c < cols) {
    for (std::int64_t r = threadIdx.y; r < rows; r += kBiasSlices) {
      sum += static_cast<C>(load(dz[r * cols + c]));
    }
  }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    C total = 0;
    for (int s = 0; s < kBiasSlices; ++s) total += partial[s][threadIdx.x];
    grad[c] = store<TG>(static_cast<C>(load(grad[c])) + total);
  }
}

void launch_bias_activation(Tensor& z, std::int64_t ldz, const Tensor& bias, Activation act,
                            Tensor& y, std::int64_t rows, std::int64_t cols) {
  std::int64_t n = rows * cols;
  if (n == 0) return;
  auto stream = static_cast<cudaStream_t>(current_stream(z.device()));
  KILN_CUDA_DISPATCH_FLOATING(z.dtype(), T, {
    bias_activation_kernel<T><<<grid_for(n), 256, 0, stream>>>(
        static_cast<T*>(z.data()), ldz,
        bias.defined() ? static_cast<const T*>(bias.data()) : nullptr, act,
        static_cast<T*>(y.data()), rows, cols);
    KILN_CUDA_LAUNCH_CHECK();
  });
}

void launch_bias_grad(const Tensor& dz, Tensor& grad) {
  std::int64_t rows = dz.size(0), cols = dz.size(1);
  if (cols == 0) return;
  auto stream = static_cast<cudaStream_t>(current_stream(dz.device()));
  unsigned blocks = static_cast<unsigned>((cols + kBiasColumns - 1) / kBiasColumns);
  KILN_CUDA_DISPATCH_FLOATING(dz.dtype(), TD, {
    KILN_CUDA_DISPATCH_FLOATING(grad.dtype(), TG, {
      bias_grad_kernel<TD, TG><<<blocks, dim3(kBiasColumns, kBiasSlices), 0, stream>>>(
          static_cast<const TD*>(dz.data()), rows, cols, static_cast<TG*>(grad.data()));
      KILN_CUDA_LAUNCH_CHECK();
    });
  });
}

}  // namespace

void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Activation act, Tensor& y,
                    Tensor& saved, std::int64_t& saved_ld) {
  std::int64_t rows = x.size(0), in = x.size(1), out = w.size(0);  // x (M, in), w (out, in)
  Device device = x.device();
  saved = Tensor();
  saved_ld = out;
  LtGemm g;  // y^T (out, M) = W^T-view (out, in) x^T (in, M)
  g.trans_a = true;
  g.m = out;
  g.n = rows;
  g.k = in;
  g.a = w.data();
  g.lda = in;
  g.b = x.data();
  g.ldb = in;
  g.ab_type = x.dtype();
  g.d = y.data();
  g.ldd = out;
  g.d_type = y.dtype();
  g.bias = bias.defined() ? bias.data() : nullptr;
  bool has_bias = bias.defined();
  switch (act) {
    case Activation::None:
      g.epilogue = has_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
      if (lt_matmul(g, device)) return;
      break;
    case Activation::ReLU:
      g.epilogue = has_bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
      if (lt_matmul(g, device)) {
        saved = y;  // y > 0 is ReLU's mask
        return;
      }
      break;
    case Activation::GELU: {
      // cuBLASLt's GELU is the tanh form; it writes the pre-activation z into aux for backward.
      // Its approximation is good for half outputs only: fp32 takes our kernel.
      if (!is_half(y.dtype())) break;
      std::int64_t ld = round_up(out, 8);
      Tensor aux = Tensor::empty({rows, ld}, y.dtype(), device);  // (M, ld)
      g.epilogue = has_bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
      g.aux = aux.data();
      g.aux_ld = ld;
      if (lt_matmul(g, device)) {
        saved = aux;
        saved_ld = ld;
        return;
      }
      g.aux = nullptr;
      g.aux_ld = 0;
      break;
    }
    case Activation::GELUErf: {
      // No erf-GELU epilogue: GEMM + bias into z, then our kernel.
      Tensor z = Tensor::empty({rows, out}, y.dtype(), device);  // (M, out)
      g.d = z.data();
      g.epilogue = has_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
      if (lt_matmul(g, device)) {
        cuda::activation_forward(act, z, y);
        saved = z;
        return;
      }
      g.d = y.data();
      break;
    }
  }
  // Fallback: plain GEMM into z, then bias and activation in one kernel.
  g.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  g.bias = nullptr;
  Tensor z = act == Activation::None ? y : Tensor::empty({rows, out}, y.dtype(), device);
  g.d = z.data();
  KILN_CHECK(lt_matmul(g, device), std::string("Linear: cuBLASLt has no GEMM for ") +
                                       dtype_name(x.dtype()) + " -> " + dtype_name(y.dtype()));
  if (has_bias || act != Activation::None) {
    Tensor b = bias.defined() && bias.dtype() != z.dtype() ? bias.to(z.dtype()) : bias;
    launch_bias_activation(z, out, b, act, y, rows, out);
  }
  if (act == Activation::ReLU) saved = y;
  if (act == Activation::GELU || act == Activation::GELUErf) saved = z;
}

void linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Activation act,
                     const Tensor& saved, std::int64_t saved_ld, Tensor& weight_grad,
                     Tensor* bias_grad, Tensor& dx) {
  std::int64_t rows = x.size(0), in = x.size(1), out = w.size(0);
  if (rows == 0) return;  // nothing to add, dx is empty
  Device device = x.device();
  DType mm = x.dtype();
  auto stream = static_cast<cudaStream_t>(current_stream(device));
  // dz (M, out) in the GEMM dtype. cuBLASLt's DRELU/DGELU epilogues apply the derivative to a
  // GEMM's output (the previous layer's activation), so this layer's own comes from a kernel.
  Tensor dz;
  if (act == Activation::None) {
    dz = dy.dtype() == mm ? dy : dy.to(mm);
  } else {
    Tensor g = dy.dtype() == saved.dtype() ? dy : dy.to(saved.dtype());
    dz = Tensor::empty({rows, out}, mm, device);
    std::int64_t n = rows * out;
    if (n > 0 && saved_ld == out && saved.dtype() == mm) {
      cuda::activation_backward(act, saved, g, dz);  // contiguous: the packed kernels
    } else if (n > 0) {
      KILN_CUDA_DISPATCH_FLOATING(saved.dtype(), T, {
        KILN_CUDA_DISPATCH_FLOATING(mm, TO, {
          activation_grad_kernel<T, TO><<<grid_for(n), 256, 0, stream>>>(
              static_cast<const T*>(g.data()), static_cast<const T*>(saved.data()), saved_ld, act,
              static_cast<TO*>(dz.data()), rows, out);
          KILN_CUDA_LAUNCH_CHECK();
        });
      });
    }
  }

  // weight.grad (out, in) += dz^T x, i.e. column-major dW^T (in, out) = x^T-view (in, M) dz (M,
  // out).
  LtGemm gw;
  gw.trans_b = true;
  gw.m = in;
  gw.n = out;
  gw.k = rows;
  gw.a = x.data();
  gw.lda = in;
  gw.b = dz.data();
  gw.ldb = out;
  gw.ab_type = mm;
  gw.ldd = in;
  gw.beta = 1.0;
  // Accumulating straight into the grad needs a contiguous grad of a type cuBLASLt can write.
  bool direct = weight_grad.is_contiguous() &&
                (weight_grad.dtype() == mm || (is_half(mm) && weight_grad.dtype() == DType::F32));
  Tensor wg =
      direct ? weight_grad : Tensor::zeros({out, in}, is_half(mm) ? DType::F32 : mm, device);
  gw.d = wg.data();
  gw.d_type = wg.dtype();
  bool bias_done = false;
  if (bias_grad) {
    // BGRADB writes (not accumulates) the column sums of dz: into a temporary, then added.
    Tensor db = Tensor::empty({out}, wg.dtype(), device);
    gw.epilogue = CUBLASLT_EPILOGUE_BGRADB;
    gw.bias = db.data();
    if (lt_matmul(gw, device)) {
      ops::axpy(1.0, db.dtype() == bias_grad->dtype() ? db : db.to(bias_grad->dtype()), *bias_grad);
      bias_done = true;
    }
    gw.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    gw.bias = nullptr;
  }
  if (!bias_done) {
    KILN_CHECK(lt_matmul(gw, device),
               "Linear: cuBLASLt has no weight-gradient GEMM for " + std::string(dtype_name(mm)));
    if (bias_grad) launch_bias_grad(dz, *bias_grad);
  }
  if (!direct) ops::axpy(1.0, wg.to(weight_grad.dtype()), weight_grad);

  // dx (M, in) = dz W, i.e. column-major dx^T (in, M) = W-view (in, out) dz^T (out, M).
  if (dx.defined()) {
    LtGemm gx;
    gx.m = in;
    gx.n = rows;
    gx.k = out;
    gx.a = w.data();
    gx.lda = in;
    gx.b = dz.data();
    gx.ldb = out;
    gx.ab_type = mm;
    gx.d = dx.data();
    gx.ldd = in;
    gx.d_type = dx.dtype();
    if (!lt_matmul(gx, device)) {
      // Half output from a different half input type (or similar): compute in fp32, then cast.
      Tensor dx32 = Tensor::empty({rows, in}, is_half(mm) ? DType::F32 : mm, device);
      gx.d = dx32.data();
      gx.d_type = dx32.dtype();
      KILN_CHECK(lt_matmul(gx, device),
                 "Linear: cuBLASLt has no input-gradient GEMM for " + std::string(dtype_name(mm)));
      dx.copy_from(dx32);
    }
  }
}

}  // namespace kiln::cuda
