#pragma once
// Where a tensor lives, and the guard that makes a CUDA device current for a scope.

#include <string>

namespace kiln {

enum class DeviceKind : unsigned char { CPU, CUDA };

struct Device {
  DeviceKind kind = DeviceKind::CPU;
  int index = 0;

  static Device cpu() { return Device{DeviceKind::CPU, 0}; }
  static Device cuda(int index = 0) { return Device{DeviceKind::CUDA, index}; }
  bool is_cpu() const { return kind == DeviceKind::CPU; }
  bool is_cuda() const { return kind == DeviceKind::CUDA; }
  bool operator==(const Device& o) const {
    return kind == o.kind && (is_cpu() || index == o.index);
  }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const;  // "cpu", "cuda:1"
};

Device parse_device(const std::string& text);  // "cpu", "cuda", "cuda:1"; InputError otherwise

bool cuda_built();        // the CUDA backend was compiled in
int cuda_device_count();  // 0 without CUDA or without a GPU

// Makes `device` current on this thread for the scope; a CPU device changes nothing.
class DeviceGuard {
 public:
  explicit DeviceGuard(Device device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  [[maybe_unused]] int previous_ = -1;  // unused without CUDA
};

}  // namespace kiln
