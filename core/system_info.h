#pragma once
// What `kiln info` reports from core: Kiln's version, the CUDA runtime, driver, cuDNN and cuBLAS
// versions, and every visible GPU with NVML's temperature and power where available.

#include <string>
#include <vector>

namespace kiln {

struct GpuInfo {
  int index = 0;
  std::string name;
  int compute_major = 0;
  int compute_minor = 0;
  double memory_bytes = 0;
  int multiprocessors = 0;
  std::string pci_bus_id;  // "0000:01:00.0"
  bool nvml = false;
  double temperature_c = 0;
  double power_w = 0;
  double power_limit_w = 0;
  double sm_clock_mhz = 0;
  double sm_clock_max_mhz = 0;
};

struct SystemInfo {
  std::string kiln_version;
  bool cuda_built = false;
  std::string cuda_runtime;   // "13.0", empty without CUDA
  std::string cuda_driver;    // the CUDA version the driver supports
  std::string nvidia_driver;  // from NVML
  std::string cudnn;
  std::string cublas;
  std::string nvml_status;
  std::string gpu_status;  // why there are no GPUs, when there are none
  std::vector<GpuInfo> gpus;
};

SystemInfo collect_system_info();

// cudaDeviceCanAccessPeer between every pair of visible GPUs: [a][b] is true when a can read b's
// memory directly. Empty without CUDA or without a GPU; the diagonal is true.
std::vector<std::vector<bool>> gpu_peer_access();

// Dense fp16/bf16 tensor-core peak in FLOP/s of a GPU by its name (the datasheet figure; used
// for MFU), or 0 for a GPU not in the table.
double dense_half_peak_flops(const std::string& gpu_name);
// The same for the visible GPU `device_index`; 0 without CUDA or for an unknown GPU.
double dense_half_peak_flops(int device_index);
const char* kiln_version();

}  // namespace kiln
