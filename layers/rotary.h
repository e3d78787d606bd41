#pragma once
// Rotary position embeddings (RoPE) as transformers' Llama and Qwen2 apply them ("rotate half"):
// for each head of d columns and i < d/2, with angle a = position * inv_freq[i],
//   y[i]       = x[i] cos a - x[i + d/2] sin a
//   y[i + d/2] = x[i + d/2] cos a + x[i] sin a
// inv_freq[i] = 1 / theta^(2i/d), optionally rescaled by Llama 3.1's rope_scaling (type llama3).
// The tables are computed as transformers computes them (inv_freq and the angles in fp32, cos/sin
// rounded to fp32), so fp32 runs agree with it to rounding; f64 inputs get f64 tables.
// Backward is the inverse rotation (the transpose), applied to the gradient in place.

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace kiln {

struct RotaryOptions {
  double theta = 10000.0;
  // rope_scaling {rope_type: llama3}: factor > 0 turns it on.
  double llama3_factor = 0.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  std::int64_t original_max_positions = 8192;
};

class RotaryEmbedding {
 public:
  RotaryEmbedding(std::int64_t head_dim, std::int64_t max_positions, const RotaryOptions& options);

  // Rotates, in place, heads [0, heads) of each row of x (N, W) (row stride W >= heads * d, the
  // first columns of each row): row n holds the token at position first_position + n % tokens.
  // inverse: the backward rotation. InputError when a position reaches max_positions.
  void apply(Tensor& x, std::int64_t heads, std::int64_t tokens, std::int64_t first_position,
             bool inverse) const;
  // The same for packed documents: row n (of sequence b = n / tokens, token t = n % tokens) is at
  // position t - document_starts[b][t], document_starts (B, tokens) I32 on x's device
  // (CallInputs::document_starts). InputError when tokens reaches max_positions; on the CPU also
  // when a start lies outside [0, t].
  void apply(Tensor& x, std::int64_t heads, std::int64_t tokens, const Tensor& document_starts,
             bool inverse) const;

  const std::vector<float>& inv_freq() const { return inv_freq_; }
  std::int64_t head_dim() const { return head_dim_; }
  std::int64_t max_positions() const { return max_positions_; }

 private:
  // x: rows (N, >= heads * head_dim) with contiguous columns, N a multiple of tokens.
  void check_rows(const Tensor& x, std::int64_t heads, std::int64_t tokens) const;
  // (max_positions, d/2) cos and sin in fp32 (f64 for f64), on `device`.
  const std::pair<Tensor, Tensor>& tables(Device device, DType dtype) const;

  std::int64_t head_dim_, max_positions_;
  std::vector<float> inv_freq_;
  mutable std::map<std::pair<std::pair<int, int>, int>, std::pair<Tensor, Tensor>> tables_;
};

}  // namespace kiln
