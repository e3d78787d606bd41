#include "train/loss_stage.h"

#include <algorithm>

#include "configs/experiment.h"
#include "core/ops.h"
#include "train/evaluator.h"

namespace kiln::train {

Tensor WholeLogitsLoss::forward_backward(Context& ctx, const Tensor& inputs,
                                         const Tensor& targets) {
  Tensor logits = net_.forward(ctx, inputs);
  Tensor flat_targets = targets;
  flatten_for_loss(logits, flat_targets);
  // The loss and its gradient in one pass where it can, the gradient written over the logits;
  // the loss scale over the micro-steps is read where it lives (ctx.step) when the kernel runs.
  Tensor loss = loss_.forward_with_gradient(ctx, logits, flat_targets);
  logits = Tensor();  // the loss is done with it: its gradient overwrites it
  net_.backward(ctx, loss_.backward(ctx, /*reuse_logits=*/true));
  return loss;
}

ChunkedHeadLoss::ChunkedHeadLoss(HeadedLanguageModel& net, SoftmaxCrossEntropy& loss,
                                 std::int64_t chunks)
    : net_(net), loss_(loss), chunks_(chunks) {
  KILN_CHECK(chunks >= 1, "ChunkedHeadLoss: " + std::to_string(chunks) + " chunks");
}

Tensor ChunkedHeadLoss::forward_backward(Context& ctx, const Tensor& inputs,
                                         const Tensor& targets) {
  Tensor hidden = net_.forward_body(ctx, inputs);  // (B, T, E)
  const std::int64_t e = hidden.size(-1), n = hidden.numel() / e;
  Tensor rows = hidden.reshape({n, e});
  Layer& head = net_.head();
  const std::int64_t vocab = head.output_shape({1, e})[1];
  loss_.begin_rows(targets.reshape({n}), vocab);
  Tensor dhidden = Tensor::empty({n, e}, hidden.dtype(), hidden.device());
  const std::int64_t per_chunk = (n + chunks_ - 1) / chunks_;
  for (std::int64_t first = 0; first < n; first += per_chunk) {
    const std::int64_t last = std::min(n, first + per_chunk);
    // The head's parameters are ready for the reduction only after the last chunk's backward.
    Context chunk_ctx = ctx;
    if (last < n) chunk_ctx.on_grad_ready = nullptr;
    Tensor logits = head.forward(chunk_ctx, rows.slice(0, first, last));
    logits = logits.reshape({last - first, vocab});
    loss_.forward_rows_with_gradient(chunk_ctx, logits, first);
    dhidden.slice(0, first, last)
        .copy_from(head.backward(chunk_ctx, logits).reshape({last - first, e}));
  }
  Tensor loss = loss_.finish_rows();
  net_.backward_body(ctx, dhidden.view(hidden.shape()));
  return loss;
}

std::unique_ptr<LossStage> make_loss_stage(Model& model, SoftmaxCrossEntropy& loss,
                                           std::int64_t lm_head_chunks) {
  if (lm_head_chunks <= 1) return std::make_unique<WholeLogitsLoss>(*model.net, loss);
  auto* headed = dynamic_cast<HeadedLanguageModel*>(model.net.get());
  if (headed == nullptr) {
    throw config::ConfigError(
        "train.lm_head_chunks = " + std::to_string(lm_head_chunks) +
        ": chunks of the language-model head need a causal language model with one (GPT-2, the "
        "llama family); this model has none: leave it at 1");
  }
  return std::make_unique<ChunkedHeadLoss>(*headed, loss, lm_head_chunks);
}

}  // namespace kiln::train
