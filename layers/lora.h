#pragma once
// LoRA (Hu et al. 2021; PEFT's LoraLayer for nn.Linear): a frozen projection y = x W^T gets a
// trained low-rank update, y += scale * dropout(x) A^T B^T with A (rank, in), B (out, rank) and
// scale = alpha / rank. Parameters as PEFT names them under the projection: lora_A.weight,
// lora_B.weight (no bias). Init as PEFT's default: A kaiming-uniform (nn.Linear's), B zero, so
// training starts from the base model.
//   x (N, in) in the GEMM dtype -> adds into the owner's output (N, out) (a column range of a
//   packed [q | k | v] or [gate | up] row, or a whole Linear output)
// The owner calls add_to_next_output(view) before forward and add_to_next_dx(dx) before
// backward: the update rides in two small GEMMs whose second accumulates (beta 1) into the
// owner's buffer, so no (N, out) temporary exists where the dtypes allow it.
// Gradient contract: lora_A/lora_B gradients accumulated (+=); dx accumulated (+=) into the
// owner's input gradient.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "layers/dropout.h"
#include "layers/layer.h"
#include "layers/weight_cast_cache.h"

namespace kiln {

// model.lora: which projections get adapters and their shape.
struct LoraOptions {
  int rank = 0;  // 0: no adapters
  double alpha = 8.0;
  double dropout = 0.0;
  std::vector<std::string> targets;  // transformers' module names: q_proj, ..., down_proj
  bool enabled() const { return rank > 0; }
  bool targets_module(const std::string& module) const;
  double scale() const { return alpha / rank; }
};

// The projection names model.lora.targets takes, in the order a decoder layer uses them.
const std::vector<std::string>& lora_projection_names();
// Whether a parameter's name (local or full) is an adapter's: lora_A.weight, lora_B.weight.
bool is_lora_parameter(const std::string& name);
// PEFT's initialisation of an adapter parameter: lora_A as nn.Linear's weight
// (U(-1/sqrt(in), 1/sqrt(in)) drawn under `seed`), lora_B zero.
void reset_lora_parameter(Parameter& p, std::uint64_t seed);

class LowRankAdapter : public Layer {
 public:
  LowRankAdapter(std::int64_t in_features, std::int64_t out_features, const LoraOptions& options);
  std::string type() const override { return "LowRankAdapter"; }
  Shape output_shape(const Shape& input) const override;
  double forward_flops(const Shape& input) const override;  // 2 N r (in + out)
  void reset_parameters(std::uint64_t seed) override;

  // The next forward adds its update into `out` (N, out_features; rows may be strided) and
  // returns it; the next backward adds its input gradient into `dx` (N, in_features).
  void add_to_next_output(const Tensor& out) { pending_output_ = out; }
  void add_to_next_dx(const Tensor& dx) { pending_dx_ = dx; }

  Parameter& a() { return *a_; }
  Parameter& b() { return *b_; }
  double scale() const { return scale_; }

 protected:
  Tensor forward_impl(Context& ctx, const Tensor& x) override;
  Tensor backward_impl(Context& ctx, const Tensor& dy) override;
  void release_saved() override {
    x_ = Tensor();
    t_ = Tensor();
  }

 private:
  std::int64_t in_, out_, rank_;
  double scale_;
  Parameter* a_;
  Parameter* b_;
  Dropout* dropout_ = nullptr;
  WeightCastCache a_cache_, b_cache_;
  Tensor pending_output_, pending_dx_;
  Tensor x_;  // (N, in): dropout(x) in the GEMM dtype
  Tensor t_;  // (N, r) = x_ A^T
};

}  // namespace kiln
