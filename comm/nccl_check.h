#pragma once
// KILN_NCCL_CHECK: a failed NCCL call becomes a kiln::Error naming ncclGetErrorString, NCCL's
// last error message (ncclGetLastError), the call, its location, rank and device, with a hint
// for the common failures. Only compiled in CUDA builds.

#include <nccl.h>

#include <string>

#include "core/check.h"

namespace kiln {

std::string nccl_error_string(ncclResult_t status, ncclComm_t comm = nullptr);
std::string nccl_error_hint(ncclResult_t status);

}  // namespace kiln

#define KILN_NCCL_CHECK(expr)                                                               \
  do {                                                                                      \
    ncclResult_t kiln_nccl_status_ = (expr);                                                \
    if (kiln_nccl_status_ != ncclSuccess && kiln_nccl_status_ != ncclInProgress) {          \
      ::kiln::report_failure("NCCL", ::kiln::nccl_error_string(kiln_nccl_status_),          \
                             KILN_SITE(#expr), ::kiln::nccl_error_hint(kiln_nccl_status_)); \
    }                                                                                       \
  } while (0)
