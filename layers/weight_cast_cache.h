#pragma once
// The O1 weight cast: a layer whose fp32 weights feed half GEMMs or convolutions keeps one cast
// copy and makes it again only when the weights may have changed (Apex O1 casts once per
// optimizer step, not once per use).

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace kiln {

class WeightCastCache {
 public:
  // `value` in `dtype` (in KRSC filter order when channels_last, for an NHWC convolution):
  // `value` itself when nothing is to be done, else the cached copy, made again when the weights
  // version, the storage, the device, the dtype or the order differs from the last call's.
  const Tensor& get(const Tensor& value, DType dtype, std::uint64_t weights_version,
                    bool channels_last = false);
  // `value` (rows, cols) in `dtype` with `rows` rounded up to `padded_rows` by zero rows, always a
  // copy, made again under the same conditions as get()'s (GPT-2's LM head: aligned GEMMs).
  const Tensor& get_padded_rows(const Tensor& value, DType dtype, std::uint64_t weights_version,
                                std::int64_t padded_rows);
  // Forgets the copy (weights rewritten in place without a new version: reset_parameters).
  void clear() { *this = WeightCastCache(); }

 private:
  Tensor cast_;
  const void* source_ = nullptr;
  std::uint64_t version_ = 0;
  DType dtype_ = DType::F32;
  bool channels_last_ = false;
};

// Weights (rows_i, cols) stacked by rows into one fresh (sum of rows_i, cols) tensor in `dtype`:
// one GEMM for what a model stores as separate parameters (q/k/v, gate/up). Made at each call, so
// it is never stale (in-place updates, CUDA graphs record the copies) and lives only as long as
// the caller holds it: no persistent second copy of the weights.
Tensor stack_rows(const std::vector<const Tensor*>& parts, DType dtype);

}  // namespace kiln
