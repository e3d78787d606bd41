#pragma once
// GPU temperature, power and memory through NVML, loaded at run time (dlopen) so that Kiln runs
// where the driver's libnvidia-ml is absent and builds where nvml.h is absent.

#include <optional>
#include <string>

namespace kiln {

struct GpuSample {
  double temperature_c = 0;
  double power_w = 0;
  double power_limit_w = 0;
  double memory_used_bytes = 0;
  double memory_total_bytes = 0;
  unsigned utilization_percent = 0;
  double sm_clock_mhz = 0;      // now
  double sm_clock_max_mhz = 0;  // the GPU's highest
};

class NvmlSampler {
 public:
  static NvmlSampler& instance();
  bool available() const { return available_; }
  std::string unavailable_reason() const { return reason_; }
  std::string driver_version() const;
  // For a CUDA device index (matched through its PCI bus id).
  std::optional<GpuSample> sample(int cuda_device) const;

 private:
  NvmlSampler();
  bool available_ = false;
  std::string reason_;
  void* library_ = nullptr;
};

}  // namespace kiln
