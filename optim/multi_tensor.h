#pragma once
// Multi-tensor passes (Apex's multi_tensor_apply, with the descriptors in device memory): a list
// of TensorEntry {pointers, numel, per-tensor scalars} is cut into chunks of kChunkElements, and
// one CUDA block handles one chunk, so one launch covers every parameter whatever their number.
// Reductions (norms) write one partial sum per chunk, combined in a fixed order: deterministic.
//
// The CPU functions below run the same passes on host tensors with the same rules
// (optim/rules/*.h), so the CUDA results can be checked against them. A step whose
// `resident.state` is set reads its scalars from that StepState and does nothing on a skip.

#include <cstdint>
#include <vector>

#include "core/cuda_op.h"
#include "core/tensor.h"
#include "optim/rules/all.h"
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

// Which loops the CPU passes run. The element-wise rules, the unscale pass and the scaling have
// loops the compiler vectorises (f32 weights; f32 or bf16 gradients, copies and state; other
// dtypes and LAMB take the scalar loops), built for three instruction sets and picked once by what
// the host supports (kBest). Every one gives the scalar loops' bits: the same operations in the
// same order, no contraction into FMA (-ffp-contract=off), the norm's additions in element order.
// Tests name the others to compare each against kScalar.
enum class CpuLoops { kBest, kScalar, kBaseline, kAvx2, kAvx512 };
bool cpu_loops_supported(CpuLoops loops);    // by this host's processor
const char* cpu_loops_name(CpuLoops loops);  // kBest: the one it resolves to ("avx512")

// For every entry: out = grad * inv_scale into `value` (skipped when write is false); returns the
// sum of squares of the unscaled values; sets *found_inf when a scaled gradient is inf or NaN.
double cpu_unscale_check_sumsq(const std::vector<TensorEntry>& entries, double inv_scale,
                               bool write, bool* found_inf, CpuLoops loops = CpuLoops::kBest);
// grad *= factor
void cpu_scale_grads(const std::vector<TensorEntry>& entries, double factor,
                     CpuLoops loops = CpuLoops::kBest);
// cpu_step(entries, rule) / cuda_step(table, rule, stream): one whole update by `rule`, for every
// rule of KILN_OPTIMIZERS. An element-wise rule (Rule::element) is one pass; LAMB is its stages.
#define KILN_OPTIMIZER_STEP_(kind, Rule)                                   \
  void cpu_step(const std::vector<TensorEntry>& entries, const Rule& rule, \
                CpuLoops loops = CpuLoops::kBest);                         \
  KILN_CUDA_OP("An optimizer",                                             \
               void cuda_step(MultiTensorTable& table, const Rule& rule, void* stream));
KILN_OPTIMIZERS(KILN_OPTIMIZER_STEP_)
#undef KILN_OPTIMIZER_STEP_

// LAMB in two phases (a sharded optimizer combines the sums across ranks in between): the moments
// and {param_sumsq, update_sumsq} per entry, then the update with the trust ratios of the sums.
std::vector<double> cpu_lamb_moments_sumsq(const std::vector<TensorEntry>& entries,
                                           const LambRule& rule);
void cpu_lamb_apply(const std::vector<TensorEntry>& entries, const LambRule& rule,
                    const std::vector<double>& sums);

// ---- CUDA launchers (multi_tensor.cu; without CUDA they throw, core/cuda_op.h) ----

// found_inf: one float set to 1 on inf/NaN (never cleared here); partials: one double per chunk.
// With `state` (resident mode) the factor is state->inv_scale, read when the kernel runs.
KILN_CUDA_OP("The unscale pass",
             void cuda_unscale_check_sumsq(MultiTensorTable& table, float inv_scale, bool write,
                                           float* found_inf, void* stream,
                                           const StepState* state = nullptr));
// out[0] = sqrt(sum of the chunk partials of cuda_unscale_check_sumsq), in a fixed order.
KILN_CUDA_OP("The unscale pass",
             void cuda_partials_norm(MultiTensorTable& table, float* out, void* stream));
KILN_CUDA_OP("Gradient clipping",
             void cuda_scale_grads(MultiTensorTable& table, float factor, void* stream));
// The sharded LAMB phases on the device: the per-tensor {param_sumsq, update_sumsq} go to `sums`
// (device, 2 doubles per tensor); the update reads the ratios' sums from there.
KILN_CUDA_OP("LAMB", void cuda_lamb_moments_sumsq(MultiTensorTable& table, const LambRule& rule,
                                                  double* sums, void* stream));
KILN_CUDA_OP("LAMB", void cuda_lamb_apply(MultiTensorTable& table, const LambRule& rule,
                                          const double* sums, void* stream));

}  // namespace kiln::optim::detail
