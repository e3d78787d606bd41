#include "core/stream.h"

#include <utility>

#include "core/check.h"

#if KILN_WITH_CUDA
#include "core/cuda/cuda_check.h"
#endif

namespace kiln {
namespace {

constexpr int kMaxDevices = 64;
thread_local void* t_current_stream[kMaxDevices] = {nullptr};

void require_cuda(Device device) {
  KILN_CHECK(device.is_cuda(), "a CUDA stream or event was asked for on " + device.str());
#if !KILN_WITH_CUDA
  throw Error("CUDA streams need the CUDA backend; this Kiln was built without CUDA");
#endif
}

}  // namespace

Stream Stream::default_stream(Device device) {
  Stream s;
  s.device_ = device;
  s.handle_ = nullptr;
  s.owned_ = false;
  return s;
}

Stream Stream::create(Device device, int priority) {
  require_cuda(device);
  Stream s;
  s.device_ = device;
  s.owned_ = true;
#if KILN_WITH_CUDA
  DeviceGuard guard(device);
  cudaStream_t handle = nullptr;
  KILN_CUDA_CHECK(cudaStreamCreateWithPriority(&handle, cudaStreamNonBlocking, priority));
  s.handle_ = handle;
#else
  (void)priority;
#endif
  return s;
}

Stream::Stream(Stream&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)),
      device_(other.device_),
      owned_(std::exchange(other.owned_, false)) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    this->~Stream();
    handle_ = std::exchange(other.handle_, nullptr);
    device_ = other.device_;
    owned_ = std::exchange(other.owned_, false);
  }
  return *this;
}

Stream::~Stream() {
#if KILN_WITH_CUDA
  if (owned_ && handle_ != nullptr) {
    KILN_IGNORE_ERROR(cudaStreamDestroy(static_cast<cudaStream_t>(handle_)));
  }
#endif
}

void Stream::synchronize() const {
#if KILN_WITH_CUDA
  if (device_.is_cuda()) {
    DeviceGuard guard(device_);
    KILN_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(handle_)));
  }
#endif
}

Event::Event(Device device, bool timing) : device_(device) {
  require_cuda(device);
#if KILN_WITH_CUDA
  DeviceGuard guard(device);
  cudaEvent_t handle = nullptr;
  KILN_CUDA_CHECK(
      cudaEventCreateWithFlags(&handle, timing ? cudaEventDefault : cudaEventDisableTiming));
  handle_ = handle;
#else
  (void)timing;
#endif
}

Event::Event(Event&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)), device_(other.device_) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    this->~Event();
    handle_ = std::exchange(other.handle_, nullptr);
    device_ = other.device_;
  }
  return *this;
}

Event::~Event() {
#if KILN_WITH_CUDA
  if (handle_ != nullptr) KILN_IGNORE_ERROR(cudaEventDestroy(static_cast<cudaEvent_t>(handle_)));
#endif
}

void Event::record(void* stream) {
#if KILN_WITH_CUDA
  KILN_CUDA_CHECK(
      cudaEventRecord(static_cast<cudaEvent_t>(handle_), static_cast<cudaStream_t>(stream)));
#else
  (void)stream;
#endif
}

void Event::wait_on(void* stream) const {
#if KILN_WITH_CUDA
  KILN_CUDA_CHECK(
      cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(handle_), 0));
#else
  (void)stream;
#endif
}

void Event::synchronize() const {
#if KILN_WITH_CUDA
  KILN_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(handle_)));
#endif
}

bool Event::query() const {
#if KILN_WITH_CUDA
  cudaError_t status = cudaEventQuery(static_cast<cudaEvent_t>(handle_));
  if (status == cudaErrorNotReady) {
    KILN_IGNORE_ERROR(cudaGetLastError());
    return false;
  }
  KILN_CUDA_CHECK(status);
#endif
  return true;
}

float Event::elapsed_ms(const Event& end) const {
  float ms = 0.0f;
#if KILN_WITH_CUDA
  KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(handle_),
                                       static_cast<cudaEvent_t>(end.handle_)));
#else
  (void)end;
#endif
  return ms;
}

void* current_stream(Device device) {
  if (!device.is_cuda()) return nullptr;
  KILN_CHECK(device.index < kMaxDevices, "device index out of range");
  return t_current_stream[device.index];
}

StreamGuard::StreamGuard(Device device, void* stream)
    : device_(device), previous_(current_stream(device)) {
  if (device.is_cuda()) t_current_stream[device.index] = stream;
}

StreamGuard::~StreamGuard() {
  if (device_.is_cuda()) t_current_stream[device_.index] = previous_;
}

void device_synchronize(Device device) {
#if KILN_WITH_CUDA
  if (device.is_cuda()) {
    DeviceGuard guard(device);
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
  }
#else
  (void)device;
#endif
}

}  // namespace kiln
