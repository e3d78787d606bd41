#pragma once
// NumPy's .npy format (version 1.0), for tensors that Python compares with other runtimes
// (`kiln eval --dump-logits`): a magic string, a header dict padded to 64 bytes, the C-order data.

#include <string>

#include "core/tensor.h"

namespace kiln {

// The .npy bytes of `t` (f32, f64, f16, i32, i64 or u8; any device, any strides).
std::string encode_npy(const Tensor& t);

}  // namespace kiln
