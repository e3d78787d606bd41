#pragma once
// What share of a step's matrix products runs in FP8 (kiln bench's `fp8_gemm_*_share`): every
// GEMM Kiln issues (ops::gemm on either backend, cuBLASLt's matmuls) is counted, while a
// GemmTally lives on the thread, by its FLOPs and, when timed, by its time (an event pair around
// it on CUDA, the host clock on the CPU). FP8 GEMMs are cuBLASLt's with FP8 operands, and the CPU
// twin's emulated ones, which its FP8 projections mark with Fp8GemmScope. Attention's fused kernels
// are not GEMMs in this sense and are not counted.

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/device.h"
#include "core/stream.h"

namespace kiln {

struct GemmTotals {
  std::int64_t gemms = 0, fp8_gemms = 0;
  double flops = 0, fp8_flops = 0;
  double ms = 0, fp8_ms = 0;  // timed GEMMs only
  double fp8_flop_share() const { return flops > 0 ? fp8_flops / flops : 0; }
  double fp8_time_share() const { return ms > 0 ? fp8_ms / ms : 0; }
};

class GemmTally {
 public:
  GemmTally();  // counts on this thread until destroyed (one at a time)
  ~GemmTally();
  GemmTally(const GemmTally&) = delete;
  GemmTally& operator=(const GemmTally&) = delete;

  // Whether the GEMMs from now on are timed too (not inside a CUDA graph capture: its events
  // would be graph nodes).
  void set_timed(bool timed) { timed_ = timed; }
  // Waits for the timed GEMMs' events on CUDA.
  GemmTotals totals() const;

  // Called by GEMM implementations through GemmRecord.
  void begin(double flops, bool fp8, Device device);
  void end(Device device);

 private:
  struct Timed {
    bool fp8 = false;
    std::unique_ptr<Event> begin, end;  // CUDA
    double host_ms = 0;                 // CPU
  };
  bool timed_ = false;
  GemmTotals counts_;
  std::vector<Timed> timed_gemms_;
  std::chrono::steady_clock::time_point host_begin_;
  bool open_timed_ = false;
};

// Around one GEMM of `flops` (2 m n k per product): counted into this thread's GemmTally, if one
// lives, once however deeply the implementations nest (ops::gemm calling cuBLASLt).
class GemmRecord {
 public:
  GemmRecord(double flops, bool fp8, Device device);
  ~GemmRecord();
  GemmRecord(const GemmRecord&) = delete;
  GemmRecord& operator=(const GemmRecord&) = delete;

 private:
  GemmTally* tally_ = nullptr;
  Device device_;
};

// The GEMMs issued in its lifetime on this thread compute an FP8 product (the CPU twin's
// emulated casts feed them).
class Fp8GemmScope {
 public:
  Fp8GemmScope();
  ~Fp8GemmScope();
  Fp8GemmScope(const Fp8GemmScope&) = delete;
  Fp8GemmScope& operator=(const Fp8GemmScope&) = delete;
};

}  // namespace kiln
