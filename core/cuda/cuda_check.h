#pragma once
// Checking macros for the CUDA runtime and cuBLAS(Lt). Each names the library's own error string
// and, for the common failures, what to check.

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "core/check.h"

namespace kiln {

std::string cuda_error_hint(cudaError_t status);
std::string cublas_status_string(cublasStatus_t status);
std::string cublas_error_hint(cublasStatus_t status);
[[noreturn]] void report_cuda_failure(cudaError_t status, const SourceSite& site);
int current_cuda_device_or_minus_one();

}  // namespace kiln

#define KILN_CUDA_CHECK(expr)                                      \
  do {                                                             \
    cudaError_t kiln_status_ = (expr);                             \
    if (kiln_status_ != cudaSuccess) {                             \
      ::kiln::report_cuda_failure(kiln_status_, KILN_SITE(#expr)); \
    }                                                              \
  } while (0)

// After every kernel launch: catches bad launch configurations at the launch site.
#define KILN_CUDA_LAUNCH_CHECK() KILN_CUDA_CHECK(cudaGetLastError())

#define KILN_CUBLAS_CHECK(expr)                                                          \
  do {                                                                                   \
    cublasStatus_t kiln_status_ = (expr);                                                \
    if (kiln_status_ != CUBLAS_STATUS_SUCCESS) {                                         \
      ::kiln::report_failure("cuBLAS", ::kiln::cublas_status_string(kiln_status_),       \
                             KILN_SITE(#expr), ::kiln::cublas_error_hint(kiln_status_)); \
    }                                                                                    \
  } while (0)
