// cuBLASLt GEMMs with cached plans and optional autotuning; see cublaslt_gemm.h.

#include "core/cuda/cublaslt_gemm.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <tuple>
#include <utility>

#include "core/cuda/cuda_check.h"
#include "core/cuda/handles.h"
#include "core/gemm_algorithm.h"
#include "core/gemm_tally.h"
#include "core/stream.h"
#include "core/tensor.h"

namespace kiln::cuda {
namespace {

constexpr std::size_t kWorkspaceBytes = 32u << 20;  // cuBLAS's recommendation for Hopper

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
               std::uint32_t, std::uint32_t, std::uint32_t, int>;

// The plan key's FP8 part: none, or both formats and the accumulation mode.
int fp8_kind(const LtGemm& g) {
  if (!g.fp8) return 0;
  return 1 + static_cast<int>(g.a_format) * 4 + static_cast<int>(g.b_format) * 2 +
         (g.fast_accumulation ? 1 : 0);
}

cudaDataType_t operand_type(const LtGemm& g, bool a) {
  if (!g.fp8) return cuda_data_type(g.ab_type);
  return (a ? g.a_format : g.b_format) == Fp8Format::E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}

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
  if (g.a_scale) {
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                     &g.a_scale, sizeof(g.a_scale)));
  }
  if (g.b_scale) {
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                     &g.b_scale, sizeof(g.b_scale)));
  }
}

constexpr int kAutotuneCandidates = 8;

// One cublasLtMatmul of `g` with `algo`, writing D to `d` (g.d, or scratch when timing) and
// reading C from `c`.
cublasStatus_t run_matmul(const LtGemm& g, const LtPlan& plan, const cublasLtMatmulAlgo_t& algo,
                          const void* c, void* d, void* workspace, std::size_t workspace_bytes,
                          cudaStream_t stream) {
  const bool wide = g.ab_type == DType::F64;
  float alpha32 = static_cast<float>(g.alpha), beta32 = static_cast<float>(g.beta);
  double alpha64 = g.alpha, beta64 = g.beta;
  const void* alpha = wide ? static_cast<const void*>(&alpha64) : &alpha32;
  const void* beta = wide ? static_cast<const void*>(&beta64) : &beta32;
  return cublasLtMatmul(cublaslt_handle(), plan.op, alpha, g.a, plan.a, g.b, plan.b, beta, c,
                        plan.d, d, plan.d, &algo, workspace, workspace_bytes, stream);
}

// The index of the fastest of the heuristic's algorithms for `g`, timed on scratch outputs (the
// epilogue's bias gradient or aux when the epilogue writes them, and D when the call accumulates
// into it), so that the call's own results are not touched. A D that is only written (beta 0) is
// timed in place: the call overwrites it next, and a scratch copy of, say, GPT-2's logits (1.5 GiB
// at 16 x 1024) would stay in the allocator's cache for the rest of the run.
int fastest(const LtGemm& g, const LtPlan& plan, const cublasLtMatmulHeuristicResult_t* results,
            int found, Device device) {
  cudaStream_t stream = static_cast<cudaStream_t>(current_stream(device));
  const std::int64_t d_bytes = g.ldd * g.n * static_cast<std::int64_t>(dtype_size(g.d_type));
  Tensor scratch_d;
  if (g.beta != 0.0) scratch_d = Tensor::empty({d_bytes}, DType::U8, device);
  void* d_out = g.beta != 0.0 ? scratch_d.data() : g.d;
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
  Event start(device, /*timing=*/true), stop(device, /*timing=*/true);
  int best = 0;
  float best_ms = 1e30f;
  for (int i = 0; i < found; ++i) {
    Tensor ws = Tensor::empty(
        {std::max<std::int64_t>(static_cast<std::int64_t>(results[i].workspaceSize), 1)}, DType::U8,
        device);
    float ms = 1e30f;
    for (int rep = 0; rep < 3; ++rep) {
      start.record(stream);
      cublasStatus_t status = run_matmul(g, plan, results[i].algo, d_out, d_out, ws.data(),
                                         results[i].workspaceSize, stream);
      stop.record(stream);
      stop.synchronize();
      if (status != CUBLAS_STATUS_SUCCESS) break;
      float t = start.elapsed_ms(stop);
      if (rep > 0) ms = std::min(ms, t);
    }
    if (ms < best_ms) best = i, best_ms = ms;
  }
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
  if (g.fp8) {
    const std::int8_t fast = g.fast_accumulation ? 1 : 0;
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM,
                                                     &fast, sizeof(fast)));
    if (g.bias) {  // FP8 GEMMs take the bias type from here (the output's: bf16 or f16)
      const cudaDataType_t bias_type = cuda_data_type(g.d_type);
      KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                       &bias_type, sizeof(bias_type)));
    }
  }
  if (g.aux) {
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                     &g.aux_ld, sizeof(g.aux_ld)));
  }
  auto rows_of = [](bool trans, std::int64_t r, std::int64_t c) { return trans ? c : r; };
  auto cols_of = [](bool trans, std::int64_t r, std::int64_t c) { return trans ? r : c; };
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(
      &plan.a, operand_type(g, true), static_cast<std::uint64_t>(rows_of(g.trans_a, g.m, g.k)),
      static_cast<std::uint64_t>(cols_of(g.trans_a, g.m, g.k)), g.lda));
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(
      &plan.b, operand_type(g, false), static_cast<std::uint64_t>(rows_of(g.trans_b, g.k, g.n)),
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
  // Benchmark mode (cudnn.benchmark's analogue) times cuBLASLt's candidates once per shape: its
  // first choice can be 10-30 % slower on some of them.
  const bool autotune = default_gemm_algorithm_options().search == GemmAlgorithmSearch::Benchmark;
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

}  // namespace

bool lt_matmul(const LtGemm& g, Device device) {
  if (g.m == 0 || g.n == 0) return true;
  cudaStream_t stream = static_cast<cudaStream_t>(current_stream(device));
  std::uint32_t align_a = alignment_of(g.a), align_b = alignment_of(g.b),
                align_d = std::min(alignment_of(g.d), g.c ? alignment_of(g.c) : 256u),
                align_bias = g.bias ? alignment_of(g.bias) : 0;
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
                align_bias,
                fp8_kind(g)};
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
  GemmRecord record(
      2.0 * static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k), g.fp8,
      device);
  cublasStatus_t status = run_matmul(g, plan, plan.heuristic.algo, g.c ? g.c : g.d, g.d,
                                     workspace.data(), plan.heuristic.workspaceSize, stream);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) return false;
  KILN_CUBLAS_CHECK(status);
  return true;
}

}  // namespace kiln::cuda
