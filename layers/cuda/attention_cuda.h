#pragma once
// MultiHeadSelfAttention and GroupedQueryAttention: the CUDA entry points
// (layers/cuda/attention.cu, flash_attention.cu and cudnn_attention.cc). Layer sources call them on
// CUDA tensors without #if; a build without CUDA gets, beside each declaration, a body that throws
// (core/cuda_op.h).

#include "core/cuda_op.h"
#include "layers/attention.h"

namespace kiln {

namespace cuda {
// Launchers (layers/cuda/attention.cu).
KILN_CUDA_OP("add_bias", void add_bias(Tensor& y, const Tensor& bias));
// src (N, parts*E) -> out (parts, B*H, T, d), N = B*T (the unfused path's layout).
KILN_CUDA_OP("attention",
             void to_heads(const Tensor& src, std::int64_t parts, std::int64_t b, std::int64_t t,
                           std::int64_t h, std::int64_t d, Tensor& out));
// src (parts, B*H, T, d) -> out (N, parts*E).
KILN_CUDA_OP("attention",
             void from_heads(const Tensor& src, std::int64_t parts, std::int64_t b, std::int64_t t,
                             std::int64_t h, std::int64_t d, Tensor& out));
// bias_grad (C) += column sums of dy (rows, C), contiguous; two passes in a fixed order.
KILN_CUDA_OP("accumulate_bias_grad",
             void accumulate_bias_grad(const Tensor& dy, Tensor& bias_grad));
// scores (BH, Tq, Tk) fp32 (f64), mask (B, Tk) fp32 or undefined -> probs, dropped_probs
// (BH, Tq, Tk) in the matmul dtype (dropped_probs undefined when p == 0). Causal: query i sees
// keys j <= Tk - Tq + i (bottom-right aligned: the KV cache's new queries after past = Tk - Tq).
// document_starts (B, Tq) I32 or undefined: query i also sees no key before its document's start.
// Every dropout entry point here takes the mask's Philox stream (the step) by value and, through
// stream_source (device memory), optionally by address: when not null the kernels read the stream
// there as they run, so a captured CUDA graph draws the replayed step's mask.
KILN_CUDA_OP("attention", void attention_softmax_forward(const Tensor& scores, const Tensor& mask,
                                                         std::int64_t heads, bool causal,
                                                         const Tensor& document_starts, double p,
                                                         std::uint64_t key, std::uint64_t stream,
                                                         const std::uint64_t* stream_source,
                                                         Tensor& probs, Tensor& dropped_probs));
// d_dropped (BH, T, T) fp32 (f64), probs -> dscores in the matmul dtype.
KILN_CUDA_OP("attention",
             void attention_softmax_backward(const Tensor& d_dropped, const Tensor& probs, double p,
                                             std::uint64_t key, std::uint64_t stream,
                                             const std::uint64_t* stream_source, Tensor& dscores));
// The most bytes a fused attention backward takes for its (B*H, T, T) workspace (dS^T in the
// flash kernels, dP in cuDNN's deterministic backward): KILN_ATTENTION_WORKSPACE_MB, default 1024.
// The flash backward runs in chunks of (batch * key/value head) rows, each with its group of query
// heads, that fit (one group at least), cuDNN's in chunks of whole sequences (halvings of the
// batch) that fit; cuDNN declines when one sequence does not.
KILN_CUDA_OP("attention", std::int64_t attention_workspace_limit_bytes());
// Fused attention (layers/cuda/flash_attention.cu): whether it serves this dtype, batch, number
// of query and key/value heads, head dimension and length.
KILN_CUDA_OP("attention",
             bool flash_attention_supported(DType dtype, std::int64_t batch, std::int64_t heads,
                                            std::int64_t kv_heads, std::int64_t head_dim,
                                            std::int64_t tokens));
// It reads the input projection's packed rows qkv (B*T, (H + 2 H_kv) d) = [q | k | v], head h at
// columns h*d.. of each part, contiguous and 16-byte aligned; no head-layout copies. Multi-head
// attention passes kv_heads = heads; grouped-query attention (kv_heads dividing heads) has query
// head h read key/value head h / (heads / kv_heads), K and V never replicated.
// out (B*T, H d) = dropout(softmax(q k^T / sqrt(d) + mask)) v per query head, without the (T, T)
// scores in memory; lse (B*H, T) fp32 per query head, what backward recomputes the probabilities
// from. Causal: query i attends keys j <= i, and key tiles wholly above the diagonal are never
// computed. document_starts (B, T) I32 or undefined (CallInputs::document_starts): query i attends
// no key before its document's start either.
KILN_CUDA_OP("attention",
             void flash_attention_forward(const Tensor& qkv, std::int64_t batch, std::int64_t heads,
                                          std::int64_t kv_heads, const Tensor& mask,
                                          const Tensor& document_starts, bool causal, double p,
                                          std::uint64_t key, std::uint64_t stream,
                                          const std::uint64_t* stream_source, Tensor& out,
                                          Tensor& lse));
// dqkv (B*T, (H + 2 H_kv) d) written (=) from dout (B*T, H d) and the forward's out and lse (same
// heads, kv_heads, causal and document starts); dK and dV sum over each group's query heads in a
// fixed order.
KILN_CUDA_OP("attention",
             void flash_attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& dout,
                                           const Tensor& lse, const Tensor& mask,
                                           const Tensor& document_starts, std::int64_t batch,
                                           std::int64_t heads, std::int64_t kv_heads, bool causal,
                                           double p, std::uint64_t key, std::uint64_t stream,
                                           const std::uint64_t* stream_source, Tensor& dqkv));
// cuDNN's fused attention (layers/cuda/cudnn_attention.cc) for the packed layout, generalised to
// grouped-query attention: rows [q (H d) | k (H_kv d) | v (H_kv d)], d = 8..128 a multiple of 8
// (multi-head attention: kv_heads == heads), without mask or dropout, causal or not: true when it
// ran (lse then holds cuDNN's natural-log
// statistics, which only cudnn_attention_backward reads), false when cuDNN declines the shape or
// KILN_ATTENTION_CUDNN=0.
KILN_CUDA_OP("attention", bool cudnn_attention_forward(const Tensor& qkv, std::int64_t batch,
                                                       std::int64_t heads, std::int64_t kv_heads,
                                                       bool causal, Tensor& out, Tensor& lse));
// out (B*T, H d); lse (B*H, T). dqkv (B*T, (H + 2 H_kv) d) written (=); only after a
// cudnn_attention_forward of this shape and causal returned true.
KILN_CUDA_OP("attention",
             void cudnn_attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& dout,
                                           const Tensor& lse, std::int64_t batch,
                                           std::int64_t heads, std::int64_t kv_heads, bool causal,
                                           Tensor& dqkv));
}  // namespace cuda

}  // namespace kiln
