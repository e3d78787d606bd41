#include "core/device.h"

#include "core/check.h"

#if KILN_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda/cuda_check.h"
#endif

namespace kiln {

std::string Device::str() const {
  return is_cpu() ? "cpu" : "cuda:" + std::to_string(index);
}

Device parse_device(const std::string& text) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  if (text.rfind("cuda:", 0) == 0) {
    try {
      std::size_t used = 0;
      int index = std::stoi(text.substr(5), &used);
      if (used == text.size() - 5 && index >= 0) return Device::cuda(index);
    } catch (const std::exception&) {
    }
  }
  throw InputError("unknown device '" + text + "' (expected cpu, cuda or cuda:N)");
}

bool cuda_built() {
  return KILN_WITH_CUDA != 0;
}

int cuda_device_count() {
#if KILN_WITH_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    KILN_IGNORE_ERROR(cudaGetLastError());  // no driver or no device: report zero devices
    return 0;
  }
  return count;
#else
  return 0;
#endif
}

DeviceGuard::DeviceGuard(Device device) {
#if KILN_WITH_CUDA
  if (device.is_cuda()) {
    KILN_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device.index) {
      KILN_CUDA_CHECK(cudaSetDevice(device.index));
    } else {
      previous_ = -1;
    }
  }
#else
  if (device.is_cuda()) {
    throw Error(
        "a CUDA device was asked for but this Kiln was built without CUDA "
        "(configure with -DKILN_CUDA=ON on a machine with the CUDA toolkit)");
  }
#endif
}

DeviceGuard::~DeviceGuard() {
#if KILN_WITH_CUDA
  if (previous_ >= 0) KILN_IGNORE_ERROR(cudaSetDevice(previous_));
#endif
}

}  // namespace kiln
