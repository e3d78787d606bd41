#include "core/system_info.h"

#include "core/nvml.h"

#if KILN_WITH_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#endif

#ifndef KILN_VERSION
#define KILN_VERSION "0.0.0"
#endif

namespace kiln {
namespace {

#if KILN_WITH_CUDA
std::string cuda_version_string(int v) {
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}
#endif

}  // namespace

const char* kiln_version() {
  return KILN_VERSION;
}

SystemInfo collect_system_info() {
  SystemInfo info;
  info.kiln_version = KILN_VERSION;
#if KILN_WITH_CUDA
  info.cuda_built = true;
  int v = 0;
  if (cudaRuntimeGetVersion(&v) == cudaSuccess) info.cuda_runtime = cuda_version_string(v);
  if (cudaDriverGetVersion(&v) == cudaSuccess && v > 0) info.cuda_driver = cuda_version_string(v);
  std::size_t cudnn = cudnnGetVersion();
  info.cudnn = std::to_string(cudnn / 10000) + "." + std::to_string((cudnn % 10000) / 100) + "." +
               std::to_string(cudnn % 100);
  int cublas_major = 0, cublas_minor = 0, cublas_patch = 0;
  cublasGetProperty(MAJOR_VERSION, &cublas_major);
  cublasGetProperty(MINOR_VERSION, &cublas_minor);
  cublasGetProperty(PATCH_LEVEL, &cublas_patch);
  info.cublas = std::to_string(cublas_major) + "." + std::to_string(cublas_minor) + "." +
                std::to_string(cublas_patch);
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    info.gpu_status = std::string("no GPU: ") + cudaGetErrorString(status);
    static_cast<void>(cudaGetLastError());
    count = 0;
  } else if (count == 0) {
    info.gpu_status = "no GPU visible";
  }
  NvmlSampler& nvml = NvmlSampler::instance();
  info.nvml_status = nvml.available() ? "available" : nvml.unavailable_reason();
  info.nvidia_driver = nvml.driver_version();
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, d) != cudaSuccess) continue;
    GpuInfo g;
    g.index = d;
    g.name = prop.name;
    g.compute_major = prop.major;
    g.compute_minor = prop.minor;
    g.memory_bytes = static_cast<double>(prop.totalGlobalMem);
    g.multiprocessors = prop.multiProcessorCount;
    char bus_id[64] = {0};
    if (cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), d) == cudaSuccess) {
      g.pci_bus_id = bus_id;
    } else {
      static_cast<void>(cudaGetLastError());
    }
    if (auto s = nvml.sample(d)) {
      g.nvml = true;
      g.temperature_c = s->temperature_c;
      g.power_w = s->power_w;
      g.power_limit_w = s->power_limit_w;
      g.sm_clock_mhz = s->sm_clock_mhz;
      g.sm_clock_max_mhz = s->sm_clock_max_mhz;
    }
    info.gpus.push_back(g);
  }
#else
  info.gpu_status = "this Kiln was built without CUDA";
  info.nvml_status = "not used without CUDA";
#endif
  return info;
}

std::vector<std::vector<bool>> gpu_peer_access() {
  std::vector<std::vector<bool>> access;
#if KILN_WITH_CUDA
  // A diagnostic, not a failure: an error reads as "no access" and is cleared.
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    static_cast<void>(cudaGetLastError());
    return access;
  }
  access.assign(count, std::vector<bool>(count, false));
  for (int a = 0; a < count; ++a) {
    for (int b = 0; b < count; ++b) {
      int can = a == b ? 1 : 0;
      if (a != b && cudaDeviceCanAccessPeer(&can, a, b) != cudaSuccess) {
        static_cast<void>(cudaGetLastError());
        can = 0;
      }
      access[a][b] = can != 0;
    }
  }
#endif
  return access;
}

double dense_half_peak_flops(const std::string& gpu_name) {
  struct Peak {
    const char* name;
    double flops;
  };
  static const Peak table[] = {
      {"H200", 989e12}, {"H100", 989e12}, {"4090", 165e12}, {"A100", 312e12}};
  for (const Peak& peak : table) {
    if (gpu_name.find(peak.name) != std::string::npos) return peak.flops;
  }
  return 0;
}

double dense_half_peak_flops(int device_index) {
  for (const GpuInfo& gpu : collect_system_info().gpus) {
    if (gpu.index == device_index) return dense_half_peak_flops(gpu.name);
  }
  return 0;
}

}  // namespace kiln
