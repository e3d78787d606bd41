#pragma once
// The precision a forward/backward runs at: plain data of the run, derived by optim/amp from the
// opt level and read by every layer through Context::precision.

#include "core/dtype.h"

namespace kiln {

struct PrecisionPolicy {
  DType activation = DType::F32;  // dtype of tensors passed between layers
  DType matmul = DType::F32;      // GEMM and convolution inputs (fp32 accumulation always)
  // O1 casts fp32 weights to `matmul` once per weights_version, not once per use.
};

}  // namespace kiln
