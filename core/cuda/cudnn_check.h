#pragma once
// Checking macro for cuDNN.

#include <cudnn.h>

#include <string>

#include "core/check.h"

#define KILN_CUDNN_CHECK(expr)                                                           \
  do {                                                                                   \
    cudnnStatus_t kiln_status_ = (expr);                                                 \
    if (kiln_status_ != CUDNN_STATUS_SUCCESS) {                                          \
      ::kiln::report_failure("cuDNN",                                                    \
                             std::string(cudnnGetErrorString(kiln_status_)) + " (" +     \
                                 std::to_string(static_cast<int>(kiln_status_)) + ")",   \
                             KILN_SITE(#expr),                                           \
                             kiln_status_ == CUDNN_STATUS_NOT_SUPPORTED                  \
                                 ? "this shape, layout or data type has no cuDNN engine" \
                                 : "");                                                  \
    }                                                                                    \
  } while (0)
