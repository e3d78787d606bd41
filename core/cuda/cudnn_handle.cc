#include "core/cuda/cudnn_handle.h"

#include <array>
#include <mutex>

#include "core/cuda/cudnn_check.h"
#include "core/cuda/handles.h"
#include "core/stream.h"

namespace kiln::cuda {

cudnnHandle_t cudnn_handle() {
  static std::mutex mutex;
  static std::array<cudnnHandle_t, 64> handles{};
  int device = current_device();
  cudnnHandle_t handle;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (handles[device] == nullptr) KILN_CUDNN_CHECK(cudnnCreate(&handles[device]));
    handle = handles[device];
  }
  KILN_CUDNN_CHECK(
      cudnnSetStream(handle, static_cast<cudaStream_t>(current_stream(Device::cuda(device)))));
  return handle;
}

std::size_t cudnn_runtime_version() {
  return cudnnGetVersion();
}

}  // namespace kiln::cuda
