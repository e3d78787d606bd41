#include "core/nvml.h"

#include <dlfcn.h>

#if KILN_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace kiln {
namespace {

// The few NVML entry points Kiln uses, declared here since nvml.h may be absent at build time.
using NvmlDevice = void*;
using NvmlInit = int (*)();
using NvmlByPci = int (*)(const char*, NvmlDevice*);
using NvmlUint = int (*)(NvmlDevice, unsigned*);
using NvmlTemperature = int (*)(NvmlDevice, int, unsigned*);
using NvmlClock = int (*)(NvmlDevice, int, unsigned*);  // NVML_CLOCK_SM is 1
using NvmlDriverVersion = int (*)(char*, unsigned);
struct NvmlMemory {
  unsigned long long total, free, used;
};
using NvmlMemoryInfo = int (*)(NvmlDevice, NvmlMemory*);
struct NvmlUtilization {
  unsigned gpu, memory;
};
using NvmlUtilizationRates = int (*)(NvmlDevice, NvmlUtilization*);

template <typename F>
F symbol(void* library, const char* name) {
  return reinterpret_cast<F>(dlsym(library, name));
}

}  // namespace

NvmlSampler& NvmlSampler::instance() {
  static NvmlSampler sampler;
  return sampler;
}

NvmlSampler::NvmlSampler() {
  library_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library_ == nullptr) {
    reason_ = "libnvidia-ml.so.1 not found (no NVIDIA driver)";
    return;
  }
  auto init = symbol<NvmlInit>(library_, "nvmlInit_v2");
  if (init == nullptr || init() != 0) {
    reason_ = "nvmlInit failed";
    return;
  }
  available_ = true;
}

std::string NvmlSampler::driver_version() const {
  if (!available_) return "";
  auto get = symbol<NvmlDriverVersion>(library_, "nvmlSystemGetDriverVersion");
  char buf[96] = {0};
  if (get == nullptr || get(buf, sizeof(buf)) != 0) return "";
  return buf;
}

std::optional<GpuSample> NvmlSampler::sample(int cuda_device) const {
#if KILN_WITH_CUDA
  if (!available_) return std::nullopt;
  char bus_id[64] = {0};
  if (cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), cuda_device) != cudaSuccess) {
    static_cast<void>(cudaGetLastError());
    return std::nullopt;
  }
  auto by_pci = symbol<NvmlByPci>(library_, "nvmlDeviceGetHandleByPciBusId_v2");
  NvmlDevice device = nullptr;
  if (by_pci == nullptr || by_pci(bus_id, &device) != 0) return std::nullopt;
  GpuSample s;
  unsigned value = 0;
  if (auto f = symbol<NvmlTemperature>(library_, "nvmlDeviceGetTemperature");
      f && f(device, 0, &value) == 0) {
    s.temperature_c = value;
  }
  if (auto f = symbol<NvmlUint>(library_, "nvmlDeviceGetPowerUsage"); f && f(device, &value) == 0) {
    s.power_w = value / 1000.0;
  }
  if (auto f = symbol<NvmlUint>(library_, "nvmlDeviceGetEnforcedPowerLimit");
      f && f(device, &value) == 0) {
    s.power_limit_w = value / 1000.0;
  }
  NvmlMemory memory{};
  if (auto f = symbol<NvmlMemoryInfo>(library_, "nvmlDeviceGetMemoryInfo");
      f && f(device, &memory) == 0) {
    s.memory_used_bytes = static_cast<double>(memory.used);
    s.memory_total_bytes = static_cast<double>(memory.total);
  }
  NvmlUtilization utilization{};
  if (auto f = symbol<NvmlUtilizationRates>(library_, "nvmlDeviceGetUtilizationRates");
      f && f(device, &utilization) == 0) {
    s.utilization_percent = utilization.gpu;
  }
  if (auto f = symbol<NvmlClock>(library_, "nvmlDeviceGetClockInfo");
      f && f(device, 1, &value) == 0) {
    s.sm_clock_mhz = value;
  }
  if (auto f = symbol<NvmlClock>(library_, "nvmlDeviceGetMaxClockInfo");
      f && f(device, 1, &value) == 0) {
    s.sm_clock_max_mhz = value;
  }
  return s;
#else
  (void)cuda_device;
  return std::nullopt;
#endif
}

}  // namespace kiln
