#pragma once
// Embedding lookup: ids (...) of I64 (or I32) -> y (..., dim), y[i] = weight[ids[i]].
//   weight (num_embeddings, dim); y has the activation dtype (f64 when the weight is f64).
// Gradient contract: weight.grad is accumulated (+=); the ids have no gradient, so backward
// returns an undefined tensor. The padding row (if any) is initialised to zero and never gets a
// gradient. Ids out of range are an InputError on the CPU; on CUDA (where checking would cost a
// host synchronisation) their output rows are NaN, so the loss shows them.
// CUDA backward is deterministic with repeated ids: (id, position) pairs are radix-sorted (CUB,
// stable) and one block per distinct id adds its rows in position order; no atomics.

#include <cstdint>

#include "layers/layer.h"

namespace kiln {

class Embedding : public Layer {
 public:
  static constexpr std::int64_t kNoPadding = -1;
  Embedding(std::int64_t num_embeddings, std::int64_t dim, std::int64_t padding_idx = kNoPadding);
  std::string type() const override { return "Embedding"; }
  Shape output_shape(const Shape& input) const override;
  void reset_parameters(std::uint64_t seed) override;  // N(0, 1) as PyTorch; padding row 0

  std::int64_t num_embeddings() const { return num_; }
  std::int64_t dim() const { return dim_; }
  std::int64_t padding_idx() const { return padding_idx_; }
  Parameter& weight() { return *weight_; }

 protected:
  Tensor forward_impl(Context& ctx, const Tensor& ids) override;
  Tensor backward_impl(Context& ctx, const Tensor& dy) override;
  void release_saved() override { saved_ids_ = Tensor(); }

 private:
  std::int64_t num_, dim_, padding_idx_;
  Parameter* weight_;
  Tensor saved_ids_;  // (N) I64
};

}  // namespace kiln
