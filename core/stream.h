#pragma once
// CUDA streams and events as RAII handles, and the per-thread current stream that ops run on.
// In a CPU-only build they are inert handles so that code using them compiles everywhere.

#include "core/device.h"

namespace kiln {

class Stream {
 public:
  // The legacy default stream of `device` (not owned).
  static Stream default_stream(Device device);
  // A new non-blocking stream on `device`, destroyed with this object.
  static Stream create(Device device, int priority = 0);

  Stream() = default;
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream();

  void* handle() const { return handle_; }  // cudaStream_t
  Device device() const { return device_; }
  void synchronize() const;

 private:
  void* handle_ = nullptr;
  Device device_;
  bool owned_ = false;
};

class Event {
 public:
  explicit Event(Device device, bool timing = false);
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event();

  void record(void* stream);
  void wait_on(void* stream) const;  // `stream` waits for this event
  void synchronize() const;
  bool query() const;
  float elapsed_ms(const Event& end) const;  // from this event to `end`
  void* handle() const { return handle_; }

 private:
  void* handle_ = nullptr;
  Device device_;
};

// The stream ops on `device` run on, for this thread (the default stream unless set).
void* current_stream(Device device);

// Sets this thread's current stream for the scope.
class StreamGuard {
 public:
  StreamGuard(Device device, void* stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Device device_;
  void* previous_;
};

void device_synchronize(Device device);

}  // namespace kiln
