#pragma once
// The gated MLP of Llama and Qwen2 (transformers' LlamaMLP): y = down_proj(silu(gate_proj(x)) *
// up_proj(x)), three Linear layers without bias named gate_proj, up_proj, down_proj.
//   x (N..., E) -> y (N..., E); the gate and up projections (N, I) are kept for backward.
// SwiGLU a = silu(g) * u is one elementwise pass (CPU and CUDA, fp32 math, f64 in f64); its
// backward gives dg = da * u * s (1 + g (1 - s)), du = da * silu(g), s = sigmoid(g).
// Gradient contract: parameter gradients accumulated (+=); dx is written (=).

#include <cstdint>

#include "layers/layer.h"
#include "layers/linear.h"

namespace kiln {

class SwiGluMlp : public Layer {
 public:
  SwiGluMlp(std::int64_t hidden, std::int64_t intermediate);
  std::string type() const override { return "SwiGluMlp"; }
  Shape output_shape(const Shape& input) const override { return input; }
  double forward_flops(const Shape& input) const override;
  Linear& gate_proj() { return *gate_; }
  Linear& up_proj() { return *up_; }
  Linear& down_proj() { return *down_; }

 protected:
  Tensor forward_impl(Context& ctx, const Tensor& x) override;
  Tensor backward_impl(Context& ctx, const Tensor& dy) override;
  void release_saved() override {
    gate_out_ = Tensor();
    up_out_ = Tensor();
  }

 private:
  std::int64_t hidden_, intermediate_;
  Linear* gate_;
  Linear* up_;
  Linear* down_;
  Tensor gate_out_, up_out_;  // (N, I)
};

namespace swiglu_ops {
// a = silu(g) * u; g, u, a contiguous of one shape and dtype, on one device.
void forward(const Tensor& g, const Tensor& u, Tensor& a);
// dg = da * d/dg, du = da * silu(g) (written).
void backward(const Tensor& da, const Tensor& g, const Tensor& u, Tensor& dg, Tensor& du);
}  // namespace swiglu_ops

}  // namespace kiln
