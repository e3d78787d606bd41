#pragma once
// Linear: y = act(x W^T + b), PyTorch's nn.Linear followed by an optional fused activation.
//   x (N..., in) -> y (N..., out); weight (out, in), bias (out) (PyTorch layout and names
//   "weight", "bias"; bias has no weight decay).
// Dtypes: the GEMM inputs are ctx.run.precision.matmul (fp32 accumulation for halves), y is
// ctx.run.precision.activation. In O1 (fp32 weights, half matmul) the half copy of the weight is
// made once per ctx.weights_version and cached. On the CPU halves compute in f32, f64 in f64.
// Gradients: weight.grad and bias.grad are ACCUMULATED (+=, in the grads' dtype), none when
// frozen; dx is written (=), in dy's dtype.
// CUDA: cuBLASLt with the BIAS / RELU_BIAS / GELU_AUX_BIAS epilogues forward; backward takes the
// bias gradient from a deterministic column-sum kernel (faster than the BGRADB epilogue, which
// KILN_BIAS_GRAD_EPILOGUE=1 selects); where cuBLASLt reports an epilogue unsupported for the
// dtypes, a plain GEMM plus Kiln's own bias/activation kernels. ReLU's backward uses y > 0 as the
// mask (no aux buffer); GELU keeps the pre-activation.

#include <cstdint>
#include <memory>
#include <string>

#include "layers/activations.h"
#include "layers/fp8_projection.h"
#include "layers/layer.h"
#include "layers/lora.h"
#include "layers/weight_cast_cache.h"

namespace kiln {

class Linear : public Layer {
 public:
  Linear(std::int64_t in_features, std::int64_t out_features, bool bias = true,
         Activation activation = Activation::None);
  std::string type() const override { return "Linear"; }
  Shape output_shape(const Shape& input) const override;
  double forward_flops(const Shape& input) const override;  // 2 * N * in * out
  // U(-1/sqrt(in), 1/sqrt(in)) for weight and bias (PyTorch's kaiming_uniform(a=sqrt(5))).
  void reset_parameters(std::uint64_t seed) override;

  std::int64_t in_features() const { return in_features_; }
  std::int64_t out_features() const { return out_features_; }
  Activation activation() const { return activation_; }
  bool has_bias() const { return bias_ != nullptr; }
  Parameter& weight() { return *weight_; }
  Parameter* bias() { return bias_; }  // null without bias

  // Activation recomputation (GPT-2's MLP, as llm.c does it): a GELU layer can recompute the
  // output its last forward returned from the pre-activation it keeps for backward, and the next
  // layer can drop the copy of that output it kept as its input and be handed the recomputation
  // before its backward: (tokens x intermediate) less memory per block until backward.
  // Whether recompute_output() can serve: CUDA, GELU kept as a dense pre-activation in the GEMM
  // dtype, and the output in that dtype too (O2, O3).
  bool can_recompute_output() const;
  Tensor recompute_output() const;  // (M, out) in the GEMM dtype
  void drop_saved_input() { saved_input_ = Tensor(); }
  void restore_saved_input(const Tensor& x) { saved_input_ = x; }  // (M, in) in the GEMM dtype

  // The GELU layer whose output is this layer's input (GPT-2's mlp.c_fc for mlp.c_proj): on CUDA
  // with half GEMMs this layer's backward applies that layer's activation derivative in the
  // epilogue of its input-gradient GEMM (cuBLASLt's DGELU, from the pre-activation `producer`
  // kept) and hands `producer` a pre-activation gradient, so neither runs an activation pass.
  // Anything else between the two (a dropout) forbids it. KILN_DGELU_UNFUSED=1 turns it off.
  void take_input_from(Linear* producer) { producer_ = producer; }
  // The next forward returns act(x W^T + b) + residual, the addition in the GEMM's epilogue on
  // CUDA (a residual connection with nothing between this layer and the addition: GPT-2's
  // mlp.c_proj). Backward is unchanged: the residual's gradient is the caller's.
  void add_to_next_output(const Tensor& residual) { pending_residual_ = residual; }
  // A LoRA adapter on this projection (no activation): lora_A.weight and lora_B.weight beside
  // weight, its update added to every output.
  void add_adapter(const LoraOptions& options);
  // precision.fp8: training forwards and their backwards run the three GEMMs in FP8 (bias,
  // activation and residual epilogues as before); the scaling state is the buffer "fp8_scaling".
  void use_fp8(const Fp8Settings& settings);

 protected:
  Tensor forward_impl(Context& ctx, const Tensor& x) override;
  Tensor backward_impl(Context& ctx, const Tensor& dy) override;
  void release_saved() override {
    saved_input_ = Tensor();
    saved_activation_ = Tensor();
    if (fp8_) fp8_->release_saved();
  }

 private:
  // The weight (and bias) in `dtype`: the parameter itself, or a copy cached per weights_version.
  const Tensor& weight_as(const Context& ctx, DType dtype) {
    return weight_cache_.get(weight_->value, dtype, ctx.weights_version);
  }
  const Tensor& bias_as(const Context& ctx, DType dtype) {
    return bias_cache_.get(bias_->value, dtype, ctx.weights_version);
  }

  std::int64_t in_features_, out_features_;
  Activation activation_;
  Parameter* weight_ = nullptr;
  Parameter* bias_ = nullptr;

  WeightCastCache weight_cache_, bias_cache_;

  // Saved by forward for backward.
  Shape input_shape_;
  Tensor saved_input_;         // (M, in) in the GEMM dtype
  Tensor saved_activation_;    // ReLU: y (M, out); GELU: z = x W^T + b (M, ld >= out); else empty
  std::int64_t saved_ld_ = 0;  // leading dimension of saved_activation_
  DType output_dtype_ = DType::F32;

  Tensor pending_residual_;             // see add_to_next_output
  Linear* producer_ = nullptr;          // see take_input_from
  LowRankAdapter* adapter_ = nullptr;   // see add_adapter
  std::unique_ptr<Fp8Projection> fp8_;  // see use_fp8
  bool dy_is_preactivation_ = false;    // the consumer's backward applied this layer's derivative
  bool can_take_preactivation_grad() const;
};

}  // namespace kiln
