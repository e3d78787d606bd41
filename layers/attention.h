#pragma once
// Multi-head self-attention, and the small tensor helpers the transformer layers share.
//
//   x (B, T, E) -> y (B, T, E), E = heads * head_dim.
//   qkv = x W_qkv^T + b_qkv                      (B, T, 3E), split into q, k, v (B*H, T, d)
//   S = q k^T / sqrt(d)                          (B*H, T, T) fp32 (f64 for f64)
//   P = softmax(S + mask) ; P' = dropout(P)      fused kernel, fp32 math, masked keys get 0
//   ctx = P' v                                   (B*H, T, d) -> (B, T, E)
// On CUDA with half activations and d = 64 the three middle lines are one fused kernel (flash
// attention: no (T, T) tensor in memory; backward recomputes P from a saved log-sum-exp): cuDNN's
// fused attention when there is no mask and no dropout (layers/cuda/cudnn_attention.cc), Kiln's
// own kernels otherwise (layers/cuda/flash_attention.cu).
//   y = ctx W_o^T + b_o
// The key padding mask is ctx.attention_mask (B, T): 1 attend, 0 padding (any dtype). A query
// whose keys are all masked gets zero probabilities (and so a zero context), not NaN.
// Attention dropout uses Dropout's mask (layers/dropout.h: dropout_key(ctx.seed, layer_id()),
// stream ctx.step, element index in (B*H, T, T)): CPU and CUDA draw the same mask, and backward
// regenerates it instead of storing it.
// Gradient contract: parameter gradients are accumulated (+=); dx is written (=).
//
// Parameter layouts:
//   SeparateQKV (HuggingFace BERT, names relative to the layer, e.g. "attention."):
//     self.query.weight (E, E), self.query.bias (E), self.key.*, self.value.*,
//     output.dense.weight (E, E), output.dense.bias (E)
//   FusedQKV (torch nn.MultiheadAttention, torchvision ViT's "self_attention."):
//     in_proj_weight (3E, E) rows [q; k; v], in_proj_bias (3E), out_proj.weight (E, E),
//     out_proj.bias (E)
// Mixed precision: the GEMMs run in ctx.precision.matmul (fp32 accumulation) when activations
// are fp32, in the activation dtype when it is half; weights are cast once per weights_version.

#include <cstdint>

#include "layers/layer.h"
#include "layers/weight_cast_cache.h"

namespace kiln {

// Helpers shared by the transformer layers (layers/attention.cc, layers/cuda/attention.cu). They
// run on the device of their operands.
namespace transformer_ops {

// The GEMM input dtype for activations of dtype `activation` under ctx's precision policy.
DType matmul_dtype(const Context& ctx, DType activation);
// The activation dtype a layer whose parameters are `parameter_dtype` produces from a non-floating
// input (token ids) or casts a floating input to: F64 for f64 parameters, else the policy's.
DType activation_dtype(const Context& ctx, DType parameter_dtype);

// y (rows, C) += bias (C) broadcast over rows.
void add_bias(Tensor& y, const Tensor& bias);
// bias_grad (C) += sum over rows of dy (rows, C), in a fixed order.
void accumulate_bias_grad(const Tensor& dy, Tensor& bias_grad);

}  // namespace transformer_ops

enum class QkvLayout { SeparateQKV, FusedQKV };

class MultiHeadSelfAttention : public Layer {
 public:
  MultiHeadSelfAttention(std::int64_t hidden, std::int64_t heads, double attention_dropout = 0.0,
                         QkvLayout layout = QkvLayout::SeparateQKV);
  std::string type() const override { return "MultiHeadSelfAttention"; }
  Shape output_shape(const Shape& input) const override { return input; }
  // 4 projections (2 * B*T*E*E each) and the two attention matmuls (2 * B*H*T*T*d each).
  double forward_flops(const Shape& input) const override;
  // PyTorch's defaults: nn.Linear's for SeparateQKV; nn.MultiheadAttention's for FusedQKV
  // (xavier_uniform in_proj, zero biases, out_proj U(+-1/sqrt(E))).
  void reset_parameters(std::uint64_t seed) override;

  std::int64_t hidden() const { return hidden_; }
  std::int64_t heads() const { return heads_; }
  QkvLayout layout() const { return layout_; }

 protected:
  Tensor forward_impl(Context& ctx, const Tensor& x) override;
  Tensor backward_impl(Context& ctx, const Tensor& dy) override;
  void release_saved() override {
    x_mm_ = Tensor();
    q_ = Tensor();
    k_ = Tensor();
    v_ = Tensor();
    probs_ = Tensor();
    dropped_probs_ = Tensor();
    context_ = Tensor();
    qkv_ = Tensor();
    lse_ = Tensor();
    mask_ = Tensor();
  }

 private:
  // Scores, softmax (+ dropout) and P' v through memory: the context (B*H, T, d) from q_, k_,
  // v_, saving the probabilities for backward.
  Tensor unfused_forward(const Tensor& mask, double p);
  // dq, dk, dv from the context's gradient, through the saved probabilities.
  void unfused_backward(const Tensor& dcontext_heads, double p, Tensor& dq, Tensor& dk, Tensor& dv);

  std::int64_t hidden_, heads_, head_dim_;
  double dropout_;
  QkvLayout layout_;
  // SeparateQKV: three weights and biases; FusedQKV: one (3E, E) weight and one (3E) bias.
  std::vector<Parameter*> qkv_weights_, qkv_biases_;
  std::vector<WeightCastCache> qkv_cache_;
  WeightCastCache out_cache_;
  WeightCastCache qkv_bias_cache_, out_bias_cache_;  // CUDA bias epilogues
  Parameter* out_weight_;
  Parameter* out_bias_;
  // Saved by forward for backward.
  Tensor x_mm_;           // (B*T, E) input in the matmul dtype
  Tensor q_, k_, v_;      // (B*H, T, d) matmul dtype
  Tensor probs_;          // (B*H, T, T) P, matmul dtype
  Tensor dropped_probs_;  // P' (== probs_ without dropout)
  Tensor context_;        // (B*T, E) matmul dtype
  // The fused path (CUDA, half, d = 64) keeps the packed projection and the row log-sum-exp
  // instead of q_, k_, v_ and the probabilities.
  Tensor qkv_;                // (B*T, 3E) with bias, fused path only
  Tensor lse_;                // (B*H, T) fp32; defined iff the forward took the fused path
  bool cudnn_fused_ = false;  // the fused path ran on cuDNN's attention, not the flash kernels
  Tensor mask_;               // (B, T) fp32 key mask of the fused forward, or undefined
  DType activation_ = DType::F32;
  std::int64_t batch_ = 0, tokens_ = 0;
  std::uint64_t dropout_key_ = 0, dropout_stream_ = 0;
  bool dropout_active_ = false;
};

namespace cuda {
// Launchers (layers/cuda/attention.cu).
void add_bias(Tensor& y, const Tensor& bias);
// src (N, parts*E) -> out (parts, B*H, T, d), N = B*T (the unfused path's layout).
void to_heads(const Tensor& src, std::int64_t parts, std::int64_t b, std::int64_t t, std::int64_t h,
              std::int64_t d, Tensor& out);
// src (parts, B*H, T, d) -> out (N, parts*E).
void from_heads(const Tensor& src, std::int64_t parts, std::int64_t b, std::int64_t t,
                std::int64_t h, std::int64_t d, Tensor& out);
// bias_grad (C) += column sums of dy (rows, C), contiguous; two passes in a fixed order.
void accumulate_bias_grad(const Tensor& dy, Tensor& bias_grad);
// scores (BH, T, T) fp32 (f64), mask (B, T) fp32 or undefined -> probs, dropped_probs (BH, T, T)
// in the matmul dtype (dropped_probs undefined when p == 0).
void attention_softmax_forward(const Tensor& scores, const Tensor& mask, std::int64_t heads,
                               double p, std::uint64_t key, std::uint64_t stream, Tensor& probs,
                               Tensor& dropped_probs);
// d_dropped (BH, T, T) fp32 (f64), probs -> dscores in the matmul dtype.
void attention_softmax_backward(const Tensor& d_dropped, const Tensor& probs, double p,
                                std::uint64_t key, std::uint64_t stream, Tensor& dscores);
// The most bytes a fused attention backward takes for its (B*H, T, T) workspace (dS^T in the
// flash kernels, dP in cuDNN's deterministic backward): KILN_ATTENTION_WORKSPACE_MB, default 256.
// The flash backward runs in chunks of (batch * head) rows that fit; cuDNN's declines beyond it.
std::int64_t attention_workspace_limit_bytes();
// Fused attention (layers/cuda/flash_attention.cu): whether it serves this dtype, number of
// (batch * head) rows, head dimension and length.
bool flash_attention_supported(DType dtype, std::int64_t batch_heads, std::int64_t head_dim,
                               std::int64_t tokens);
// It reads the input projection's packed rows qkv (B*T, 3E) = [q | k | v], head h at columns
// h*d.. of each part, contiguous and 16-byte aligned; no head-layout copies.
// out (B*T, E) = dropout(softmax(q k^T / sqrt(d) + mask)) v per head, without the (T, T) scores
// in memory; lse (B*H, T) fp32, what backward recomputes the probabilities from.
void flash_attention_forward(const Tensor& qkv, std::int64_t batch, std::int64_t heads,
                             const Tensor& mask, double p, std::uint64_t key, std::uint64_t stream,
                             Tensor& out, Tensor& lse);
// dqkv (B*T, 3E) written (=) from dout (B*T, E) and the forward's out and lse.
void flash_attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& dout,
                              const Tensor& lse, const Tensor& mask, std::int64_t batch,
                              std::int64_t heads, double p, std::uint64_t key, std::uint64_t stream,
                              Tensor& dqkv);
// cuDNN's fused attention (layers/cuda/cudnn_attention.cc) for the same packed layout, without
// mask or dropout: true when it ran (lse then holds cuDNN's natural-log statistics, which only
// cudnn_attention_backward reads), false when cuDNN declines the shape or KILN_ATTENTION_CUDNN=0.
bool cudnn_attention_forward(const Tensor& qkv, std::int64_t batch, std::int64_t heads, Tensor& out,
                             Tensor& lse);
// dqkv (B*T, 3E) written (=); only after a cudnn_attention_forward of this shape returned true.
void cudnn_attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& dout,
                              const Tensor& lse, std::int64_t batch, std::int64_t heads,
                              Tensor& dqkv);
}  // namespace cuda

}  // namespace kiln
