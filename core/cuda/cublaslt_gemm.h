#pragma once
// One cuBLASLt matmul with an optional epilogue, planned once per shape: the descriptors and the
// chosen algorithm are made on a shape's first call (the heuristic query costs far more host
// time than the GEMM launch) and kept per thread; later calls only bind their pointers. How the
// algorithm is chosen is default_gemm_algorithm_options() (core/gemm_algorithm.h) at plan time.
//
// Terms are cuBLASLt's column-major ones: a row-major (r, c) tensor is a column-major (c, r)
// matrix, so a row-major GEMM is written as its transpose.

#include <cublasLt.h>

#include <cstdint>

#include "core/device.h"
#include "core/dtype.h"
#include "core/fp8.h"

namespace kiln::cuda {

struct LtGemm {
  // Column-major D (m, n) = alpha op(A) op(B) + beta * C, C = D unless `c` is set.
  bool trans_a = false, trans_b = false;
  std::int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  std::int64_t lda = 0;
  const void* b = nullptr;
  std::int64_t ldb = 0;
  DType ab_type = DType::F32;
  void* d = nullptr;
  std::int64_t ldd = 0;
  const void* c = nullptr;  // C of beta * C, laid out as D; null: D itself (accumulate in place)
  DType d_type = DType::F32;
  double alpha = 1, beta = 0;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;  // BIAS epilogues: (m) in d_type; BGRADB: output (n) in d_type
  void* aux = nullptr;         // GELU_AUX: pre-activation (m, n) in d_type, leading dim aux_ld
  std::int64_t aux_ld = 0;
  // FP8 operands (issue 37): A and B as E4M3/E5M2 bytes (ab_type then unused), each product
  // multiplied by *a_scale * *b_scale (device floats: the inverses of the casts' scales). cuBLASLt
  // takes them transposed-A, plain-B only (both with k contiguous), m, n, k and lds multiples
  // of 16.
  bool fp8 = false;
  Fp8Format a_format = Fp8Format::E4M3, b_format = Fp8Format::E4M3;
  const float* a_scale = nullptr;
  const float* b_scale = nullptr;
  bool fast_accumulation = false;  // FP8: accumulate in the tensor cores' reduced precision
};

// Runs `g` on the current stream of `device` (fp32 compute and scale, f64 for f64 inputs);
// false when cuBLASLt has no algorithm for its epilogue and types (the caller falls back), any
// other failure throws.
bool lt_matmul(const LtGemm& g, Device device);

}  // namespace kiln::cuda
