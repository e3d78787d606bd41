#include "core/gemm_tally.h"

#include "core/check.h"

namespace kiln {
namespace {

thread_local GemmTally* t_tally = nullptr;
thread_local int t_depth = 0;       // GemmRecords open on this thread
thread_local int t_fp8_scopes = 0;  // Fp8GemmScopes open on this thread

}  // namespace

GemmTally::GemmTally() {
  KILN_CHECK(t_tally == nullptr, "GemmTally: one counts on a thread at a time");
  t_tally = this;
}

GemmTally::~GemmTally() {
  t_tally = nullptr;
}

void GemmTally::begin(double flops, bool fp8, Device device) {
  ++counts_.gemms;
  counts_.flops += flops;
  if (fp8) {
    ++counts_.fp8_gemms;
    counts_.fp8_flops += flops;
  }
  open_timed_ = timed_;
  if (!timed_) return;
  Timed t;
  t.fp8 = fp8;
  if (device.is_cuda()) {
    t.begin = std::make_unique<Event>(device, true);
    t.end = std::make_unique<Event>(device, true);
    t.begin->record(current_stream(device));
  } else {
    host_begin_ = std::chrono::steady_clock::now();
  }
  timed_gemms_.push_back(std::move(t));
}

void GemmTally::end(Device device) {
  if (!open_timed_) return;
  open_timed_ = false;
  Timed& t = timed_gemms_.back();
  if (device.is_cuda()) {
    t.end->record(current_stream(device));
  } else {
    t.host_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - host_begin_)
            .count();
  }
}

GemmTotals GemmTally::totals() const {
  GemmTotals out = counts_;
  for (const Timed& t : timed_gemms_) {
    double ms = t.host_ms;
    if (t.begin) {
      t.end->synchronize();
      ms = t.begin->elapsed_ms(*t.end);
    }
    out.ms += ms;
    if (t.fp8) out.fp8_ms += ms;
  }
  return out;
}

GemmRecord::GemmRecord(double flops, bool fp8, Device device) : device_(device) {
  if (t_depth++ > 0 || t_tally == nullptr) return;
  tally_ = t_tally;
  tally_->begin(flops, fp8 || t_fp8_scopes > 0, device);
}

GemmRecord::~GemmRecord() {
  --t_depth;
  if (tally_ != nullptr) tally_->end(device_);
}

Fp8GemmScope::Fp8GemmScope() {
  ++t_fp8_scopes;
}

Fp8GemmScope::~Fp8GemmScope() {
  --t_fp8_scopes;
}

}  // namespace kiln
