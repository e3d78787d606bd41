#pragma once
// The gated MLP of Llama and Qwen2 (transformers' LlamaMLP): y = down_proj(silu(gate_proj(x)) *
// up_proj(x)), without biases; parameters gate_proj.weight, up_proj.weight (I, E) and the Linear
// down_proj (down_proj.weight (E, I)).
//   x (N..., E) -> [g | u] = x [Wg; Wu]^T (N, 2I) in one GEMM, kept for backward
//   a = silu(g) * u (N, I): one elementwise pass (CPU and CUDA, fp32 math, f64 in f64); backward
//   gives dg = da * u * s (1 + g (1 - s)), du = da * silu(g), s = sigmoid(g), into one (N, 2I)
//   gradient whose weight gradient and dx are one GEMM each.
// Gradient contract: parameter gradients accumulated (+=), frozen ones skipped; dx is written (=).

#include <cstdint>

#include "layers/layer.h"
#include "layers/linear.h"
#include "layers/lora.h"

namespace kiln {

class SwiGluMlp : public Layer {
 public:
  // `lora`: adapters on gate_proj, up_proj, down_proj as its targets name them.
  SwiGluMlp(std::int64_t hidden, std::int64_t intermediate, const LoraOptions& lora = {});
  // precision.fp8: the packed gate/up and the down projections in FP8 in training (scaling
  // states: the buffers fp8_gate_up_scaling and down_proj.fp8_scaling).
  void use_fp8(const Fp8Settings& settings);
  std::string type() const override { return "SwiGluMlp"; }
  Shape output_shape(const Shape& input) const override { return input; }
  double forward_flops(const Shape& input) const override;
  // U(-1/sqrt(E), 1/sqrt(E)) for gate and up, as nn.Linear; down_proj its own.
  void reset_parameters(std::uint64_t seed) override;
  Linear& down_proj() { return *down_; }

 protected:
  Tensor forward_impl(Context& ctx, const Tensor& x) override;
  Tensor backward_impl(Context& ctx, const Tensor& dy) override;
  void release_saved() override {
    if (fp8_gate_up_) fp8_gate_up_->release_saved();
    x_mm_ = Tensor();
    gate_up_ = Tensor();
  }

 private:
  std::int64_t hidden_, intermediate_;
  Parameter* gate_;
  Parameter* up_;
  Linear* down_;
  LowRankAdapter* adapters_[2] = {};  // gate, up (null: none)
  std::unique_ptr<Fp8Projection> fp8_gate_up_;
  DType activation_ = DType::F32;
  Tensor x_mm_;     // (N, E) in the matmul dtype
  Tensor gate_up_;  // (N, 2I) [g | u] in the activation dtype
};

namespace swiglu_ops {
// a (N, I) = silu(g) * u from gate_up (N, 2I) = [g | u]; contiguous, one dtype and device.
void forward(const Tensor& gate_up, Tensor& a);
// dgate_up (N, 2I) = [da * d/dg | da * silu(g)] (written).
void backward(const Tensor& da, const Tensor& gate_up, Tensor& dgate_up);
}  // namespace swiglu_ops

}  // namespace kiln
