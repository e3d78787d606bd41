#pragma once
// The cuDNN handle of the current device, bound to its current stream.

#include <cudnn.h>

#include <cstddef>

namespace kiln::cuda {

cudnnHandle_t cudnn_handle();
// cudnnGetVersion() of the library loaded at run time (may be older than the headers).
std::size_t cudnn_runtime_version();

}  // namespace kiln::cuda
