#pragma once
// Multi-tensor passes (Apex's multi_tensor_apply, with the descriptors in device memory): a list
// of TensorEntry {pointers, numel, per-tensor scalars} is cut into chunks of kChunkElements, and
// one CUDA block handles one chunk, so one launch covers every parameter whatever their number.
// Reductions (norms) write one partial sum per chunk, combined in a fixed order: deterministic.
//
// The CPU functions below run the same passes on host tensors with the same rules
// (optim/update_rules.h), so the CUDA results can be checked against them. A step whose
// `resident.state` is set reads its scalars from that StepState and does nothing on a skip.

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "optim/update_rules.h"

namespace kiln::optim::detail {

// The descriptors of one list of tensors, uploaded to the device when they change.
class MultiTensorTable {
 public:
  // Replaces the list; re-uploads only if pointers, sizes or scalars differ from the last one.
  void set(std::vector<TensorEntry> entries, Device device);
  const std::vector<TensorEntry>& entries() const { return entries_; }
  int num_tensors() const { return static_cast<int>(entries_.size()); }
  int num_chunks() const { return static_cast<int>(chunks_.size()); }
  const TensorEntry* device_entries() const;
  const ChunkEntry* device_chunks() const;
  // Scratch of one double per chunk (index 0 or 1) and one float per tensor, on the device.
  double* chunk_partials(int which);
  float* tensor_scalars();

 private:
  std::vector<TensorEntry> entries_;
  std::vector<ChunkEntry> chunks_;
  Device device_;
  Tensor device_buffer_;   // U8: entries then chunks
  Tensor partials_[2];     // F64 (chunks)
  Tensor tensor_scalars_;  // F32 (tensors)
};

// ---- CPU passes ----

// For every entry: out = grad * inv_scale into `value` (skipped when write is false); returns the
// sum of squares of the unscaled values; sets *found_inf when a scaled gradient is inf or NaN.
double cpu_unscale_check_sumsq(const std::vector<TensorEntry>& entries, double inv_scale,
                               bool write, bool* found_inf);
void cpu_scale_grads(const std::vector<TensorEntry>& entries, double factor);  // grad *= factor
void cpu_sgd(const std::vector<TensorEntry>& entries, const SgdStep& step);
void cpu_adamw(const std::vector<TensorEntry>& entries, const AdamWStep& step);
void cpu_lamb(const std::vector<TensorEntry>& entries, const LambStep& step);
// cpu_lamb in two phases: the moments and {param_sumsq, update_sumsq} per entry (returned), then
// the update with the trust ratios of the given sums (which a sharded optimizer combines).
std::vector<double> cpu_lamb_moments_sumsq(const std::vector<TensorEntry>& entries,
                                           const LambStep& step);
void cpu_lamb_apply(const std::vector<TensorEntry>& entries, const LambStep& step,
                    const std::vector<double>& sums);

// ---- CUDA launchers (defined in multi_tensor.cu, present when KILN_WITH_CUDA) ----

// found_inf: one float set to 1 on inf/NaN (never cleared here); partials: one double per chunk.
// With `state` (resident mode) the factor is state->inv_scale, read when the kernel runs.
void cuda_unscale_check_sumsq(MultiTensorTable& table, float inv_scale, bool write,
                              float* found_inf, void* stream, const StepState* state = nullptr);
// out[0] = sqrt(sum of the chunk partials of cuda_unscale_check_sumsq), in a fixed order.
void cuda_partials_norm(MultiTensorTable& table, float* out, void* stream);
void cuda_scale_grads(MultiTensorTable& table, float factor, void* stream);
void cuda_sgd(MultiTensorTable& table, const SgdStep& step, void* stream);
void cuda_adamw(MultiTensorTable& table, const AdamWStep& step, void* stream);
void cuda_lamb(MultiTensorTable& table, const LambStep& step, void* stream);
// cuda_lamb in two phases (sharded LAMB): the moments and per-tensor {param_sumsq, update_sumsq}
// into `sums` (device, 2 doubles per tensor), then the update with the ratios of `sums`.
void cuda_lamb_moments_sumsq(MultiTensorTable& table, const LambStep& step, double* sums,
                             void* stream);
void cuda_lamb_apply(MultiTensorTable& table, const LambStep& step, const double* sums,
                     void* stream);

}  // namespace kiln::optim::detail
