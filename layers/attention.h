#pragma once
// Multi-head self-attention, and the small tensor helpers the transformer layers share.
//
//   x (B, T, E) -> y (B, T, E), E = heads * head_dim.
//   qkv = x W_qkv^T + b_qkv                      (B, T, 3E), split into q, k, v (B*H, T, d)
//   S = q k^T / sqrt(d)                          (B*H, T, T) fp32 (f64 for f64)
//   P = softmax(S + mask) ; P' = dropout(P)      fused kernel, fp32 math, masked keys get 0;
//                                                causal: keys j > i get 0 too
//   ctx = P' v                                   (B*H, T, d) -> (B, T, E)
// On CUDA with half activations and d = 64 the three middle lines are one fused kernel (flash
// attention: no (T, T) tensor in memory; backward recomputes P from a saved log-sum-exp): cuDNN's
// fused attention when there is no mask and no dropout (layers/cuda/cudnn_attention.cc), Kiln's
// own kernels otherwise (layers/cuda/flash_attention.cu).
//   y = ctx W_o^T + b_o
// The key padding mask is ctx.call.attention_mask (B, T): 1 attend, 0 padding (any dtype). A query
// whose keys are all masked gets zero probabilities (and so a zero context), not NaN.
// Attention dropout uses Dropout's mask (layers/dropout.h: dropout_key(ctx.run.seed, layer_id()),
// stream the micro-step at ctx.step.step, element index in (B*H, T, T)): CPU and CUDA draw the
// same mask, and backward regenerates it instead of storing it. The stream is read from that
// address when the kernels run (so a CUDA graph replays the current step), in forward and backward.
// Gradient contract: parameter gradients are accumulated (+=); dx is written (=).
//
// Parameter layouts:
//   SeparateQKV (HuggingFace BERT, names relative to the layer, e.g. "attention."):
//     self.query.weight (E, E), self.query.bias (E), self.key.*, self.value.*,
//     output.dense.weight (E, E), output.dense.bias (E)
//   FusedQKV (torch nn.MultiheadAttention, torchvision ViT's "self_attention."):
//     in_proj_weight (3E, E) rows [q; k; v], in_proj_bias (3E), out_proj.weight (E, E),
//     out_proj.bias (E)
//   FusedConv1D (transformers' GPT-2, "attn."): c_attn.weight (3E, E) rows [q; k; v],
//     c_attn.bias (3E), c_proj.weight (E, E), c_proj.bias (E); both weights stored_transposed.
// Causal attention (GPT-2): query i attends keys j <= i only, combined with the key padding mask
// and dropout as above. The unfused softmax zeroes the upper triangle; the flash kernels skip key
// tiles wholly above the diagonal (and, in backward, query tiles wholly before a key tile) and
// mask the diagonal tile; cuDNN gets its top-left diagonal band with right bound 0.
// KV cache (generation, inference only; see KvCache below): with ctx.call.kv_cache the input is the
// T new tokens at positions [past, past + T). Their k, v go to this layer's cache entry at those
// positions; S = q k_cache^T over keys [0, past + T) (B*H, T, past + T), new query i sees keys
// 0..past + i; then softmax, P v_cache and the output projection as above, unfused on every
// device. Nothing is saved for backward. past + T > capacity is an InputError.
// Mixed precision: the GEMMs run in ctx.run.precision.matmul (fp32 accumulation) when activations
// are fp32, in the activation dtype when it is half; weights are cast once per weights_version.

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <utility>

#include "layers/fp8_projection.h"
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

// The unfused attention's softmax: probs (and dropped, when defined) (BH, Tq, Tk) in the matmul
// dtype from scores (BH, Tq, Tk) fp32 (f64). Rows of batch r / (heads * Tq) read mask (B, Tk)
// fp32 when defined; causal rows are bottom-right aligned (query i sees keys j <= Tk - Tq + i);
// document_starts (B, Tq) I32, when defined (Tq == Tk), hides keys before the query's document
// start (CallInputs::document_starts); masked, future, other documents' and dropped entries get 0.
// stream_source, when set, holds the dropout stream.
void attention_softmax(const Tensor& scores, const Tensor& mask, std::int64_t heads, bool causal,
                       const Tensor& document_starts, double p, std::uint64_t key,
                       std::uint64_t stream, const std::uint64_t* stream_source, Tensor& probs,
                       Tensor& dropped);
// Its backward: dscores (BH, T, T) in the matmul dtype from the gradient of the dropped
// probabilities d_dropped fp32 (f64) and probs; with p > 0 the stream is read at stream_source.
void attention_softmax_backward(const Tensor& d_dropped, const Tensor& probs, double p,
                                std::uint64_t key, const std::uint64_t* stream_source,
                                Tensor& dscores);

}  // namespace transformer_ops

enum class QkvLayout { SeparateQKV, FusedQKV, FusedConv1D };

// Keys and values of the tokens generated so far, for decoding one token at a time (kiln sample).
// A forward with Context::kv_cache set takes only the new tokens, at positions [past, past + T):
// each causal attention layer writes their keys and values into its entry at those positions and
// attends over positions [0, past + T), causally. The caller advances `past` after the forward.
struct KvCache {
  std::int64_t past = 0;      // tokens already in the cache
  std::int64_t capacity = 0;  // positions each entry holds (the model's max positions)
  // By attention layer id: keys and values, (B*H, capacity, d) each, in the matmul dtype.
  std::unordered_map<std::uint64_t, std::pair<Tensor, Tensor>> entries;
};

class MultiHeadSelfAttention : public Layer {
 public:
  MultiHeadSelfAttention(std::int64_t hidden, std::int64_t heads, double attention_dropout = 0.0,
                         QkvLayout layout = QkvLayout::SeparateQKV, bool causal = false);
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
  bool causal() const { return causal_; }
  // precision.fp8: the QKV (fused layouts) and output projections in FP8 in training
  // (layers/fp8_projection.h), their scaling states the buffers fp8_qkv_scaling and
  // fp8_out_scaling.
  void use_fp8(const Fp8Settings& settings);

 protected:
  Tensor forward_impl(Context& ctx, const Tensor& x) override;
  Tensor backward_impl(Context& ctx, const Tensor& dy) override;
  void release_saved() override {
    if (fp8_qkv_) fp8_qkv_->release_saved();
    if (fp8_out_) fp8_out_->release_saved();
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
  // The KV cache path: the context (N, E) of the new tokens from their projection qkv (N, 3E),
  // after writing their keys and values into ctx.call.kv_cache.
  Tensor cached_attention(const Context& ctx, const Tensor& qkv);

  std::int64_t hidden_, heads_, head_dim_;
  double dropout_;
  QkvLayout layout_;
  bool causal_ = false;
  // SeparateQKV: three weights and biases; FusedQKV: one (3E, E) weight and one (3E) bias.
  std::vector<Parameter*> qkv_weights_, qkv_biases_;
  std::vector<WeightCastCache> qkv_cache_;
  WeightCastCache out_cache_;
  WeightCastCache qkv_bias_cache_, out_bias_cache_;  // CUDA bias epilogues
  Parameter* out_weight_;
  Parameter* out_bias_;
  std::unique_ptr<Fp8Projection> fp8_qkv_, fp8_out_;
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
  std::uint64_t dropout_key_ = 0;
  const std::uint64_t dropout_stream_ = 0;  // the kernels read the stream at the address below
  const std::uint64_t* dropout_stream_source_ = nullptr;  // ctx.step.step at forward
  bool dropout_active_ = false;
};

}  // namespace kiln
