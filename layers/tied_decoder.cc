#include "layers/tied_decoder.h"

#include "core/ops.h"
#include "layers/attention.h"

namespace kiln {

namespace {
constexpr std::int64_t kRowAlignment = 64;
}  // namespace

TiedDecoder::TiedDecoder(Parameter* weight, std::int64_t vocab, std::int64_t hidden, bool bias)
    : weight_(weight), vocab_(vocab), hidden_(hidden) {
  use_shared_parameter(weight_);
  if (bias) bias_ = &add_parameter("bias", {vocab}, /*no_weight_decay=*/true);
}

Shape TiedDecoder::output_shape(const Shape& input) const {
  Shape s = input;
  s.back() = vocab_;
  return s;
}

double TiedDecoder::forward_flops(const Shape& input) const {
  return 2.0 * static_cast<double>(shape_numel(input)) * static_cast<double>(vocab_);
}

void TiedDecoder::reset_parameters(std::uint64_t) {
  if (bias_) bias_->value.fill(0.0);
}

Tensor TiedDecoder::forward_impl(Context& ctx, const Tensor& x) {  // (N..., E) -> (N..., V)
  KILN_CHECK(x.size(-1) == hidden_, "TiedDecoder: input " + x.str());
  std::int64_t n = x.numel() / hidden_;
  DType act = x.dtype();
  activation_ = act;
  DType mm = transformer_ops::matmul_dtype(ctx, act);
  input_shape_ = x.shape();
  x_mm_ = x.contiguous().view({n, hidden_}).to(mm);
  // Without a bias the vocabulary is padded to a multiple of 64 inside the GEMM, as llm.c pads
  // GPT-2's 50257 to 50304: on CUDA the GEMM with 50257 output rows runs at a third of the speed
  // of a padded one. The logits are a row-strided view of the padded buffer (the padding's
  // logits are x 0 = 0), which the loss reads as it is.
  const std::int64_t ld =
      bias_ ? vocab_ : (vocab_ + kRowAlignment - 1) / kRowAlignment * kRowAlignment;
  Tensor padded = Tensor::empty({n, ld}, act, x.device());  // (N, ld)
  Tensor y = padded.slice(1, 0, vocab_);                    // (N, V)
  if (ld != vocab_ && x.device().is_cuda()) {
    const Tensor& w = padded_cache_.get_padded_rows(weight_->value, mm, ctx.weights_version, ld);
    ops::gemm(false, true, 1.0, x_mm_, w, 0.0, padded);
    if (ctx.training) padded_ = padded;  // for backward; inference keeps no second buffer
  } else {
    ops::gemm(false, true, 1.0, x_mm_, cache_.get(weight_->value, mm, ctx.weights_version), 0.0, y);
  }
  if (bias_) transformer_ops::add_bias(y, bias_->value);
  return y.reshape(output_shape(x.shape()));
}

Tensor TiedDecoder::backward_impl(Context& ctx, const Tensor& dy) {
  std::int64_t n = x_mm_.size(0);
  DType mm = x_mm_.dtype();
  Tensor dy2 = dy.reshape({n, vocab_});  // (N, V), rows padded as the forward's may be
  if (vocab_ > 1 && dy2.stride(1) != 1) dy2 = dy2.contiguous();
  Tensor dy_mm = dy2.to(mm);
  const bool frozen = weight_->frozen;  // LoRA's base: the tied embedding is not trained
  if (bias_ && !frozen) transformer_ops::accumulate_bias_grad(dy2, bias_->grad);
  const bool padded = padded_gradient(dy2, dy_mm);
  if (!frozen && padded) {
    // dW over the padded rows as well (50304 output rows run at the padded GEMM's speed, 50257 at
    // half of it): into an fp32 buffer of the padded rows, then added to the gradient (the sum of
    // the fp32 product and the gradient, as gemm_accumulate's epilogue forms it).
    const std::int64_t ld = padded_.size(1);
    Tensor dw = Tensor::empty({ld, hidden_}, is_half(mm) ? DType::F32 : mm, dy.device());
    ops::gemm(true, false, 1.0, padded_, x_mm_, 0.0, dw);
    ops::accumulate(weight_->grad, dw.slice(0, 0, vocab_));
  } else if (!frozen) {
    ops::gemm_accumulate(true, false, dy_mm, x_mm_, weight_->grad);
  }
  Tensor dx = Tensor::empty({n, hidden_}, activation_, dy.device());  // mm, or f32 from half
  if (padded) {
    // dy's padding columns hold the forward's x 0 = 0 (the loss writes only the V real ones):
    // the product over the padded length is dx, and runs at the padded GEMM's speed.
    const Tensor& w =
        padded_cache_.get_padded_rows(weight_->value, mm, ctx.weights_version, padded_.size(1));
    ops::gemm(false, false, 1.0, padded_, w, 0.0, dx);
  } else {
    ops::gemm(false, false, 1.0, dy_mm, cache_.get(weight_->value, mm, ctx.weights_version), 0.0,
              dx);
  }
  padded_ = Tensor();
  return dx.view(input_shape_);
}

bool TiedDecoder::padded_gradient(const Tensor& dy2, const Tensor& dy_mm) const {
  // The loss wrote the gradient over the forward's padded logits (reuse_logits), in their dtype.
  return padded_.defined() && dy_mm.data() == dy2.data() && dy2.data() == padded_.data() &&
         dy2.stride(0) == padded_.stride(0) && padded_.dtype() == dy_mm.dtype();
}

}  // namespace kiln
