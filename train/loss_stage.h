#pragma once
// How a training micro-step goes from the model's input to the gradients: the forward, the loss
// with its gradient, and the backward. A part of the step chosen once from the experiment
// (train.lm_head_chunks): the whole logits, or a language model's head over chunks of rows.

#include <cstdint>
#include <memory>

#include "layers/models/model.h"
#include "layers/softmax_cross_entropy.h"

namespace kiln::train {

class LossStage {
 public:
  virtual ~LossStage() = default;
  // Forward, loss and backward of one micro-batch; returns the loss (F32 scalar, on the device),
  // whose gradient, scaled by the step's loss scale over its divisor, the parameters received.
  virtual Tensor forward_backward(Context& ctx, const Tensor& inputs, const Tensor& targets) = 0;
};

// The model's whole (N, V) logits: the loss and its gradient in one pass over them, written over
// them, and backward from there.
class WholeLogitsLoss final : public LossStage {
 public:
  WholeLogitsLoss(Layer& net, SoftmaxCrossEntropy& loss) : net_(net), loss_(loss) {}
  Tensor forward_backward(Context& ctx, const Tensor& inputs, const Tensor& targets) override;

 private:
  Layer& net_;
  SoftmaxCrossEntropy& loss_;
};

// A language model's head over `chunks` chunks of rows, as llm.c and llm.q run it: for each chunk
// the head's logits, the loss and its gradient written over them, and the head's backward (its
// weight gradient accumulated, its input gradient kept); then backward below the head. Only one
// chunk's logits exist at a time: (N / chunks, V) instead of (N, V). The loss is the whole
// logits' to the bit (the same rows, summed in the same order); the head's weight gradient is
// the sum of the chunks' products.
class ChunkedHeadLoss final : public LossStage {
 public:
  ChunkedHeadLoss(HeadedLanguageModel& net, SoftmaxCrossEntropy& loss, std::int64_t chunks);
  Tensor forward_backward(Context& ctx, const Tensor& inputs, const Tensor& targets) override;

 private:
  HeadedLanguageModel& net_;
  SoftmaxCrossEntropy& loss_;
  std::int64_t chunks_;
};

// train.lm_head_chunks: 1 (or 0) the whole logits; more: the chunked head, which needs a model
// with a head (ConfigError naming the field otherwise).
std::unique_ptr<LossStage> make_loss_stage(Model& model, SoftmaxCrossEntropy& loss,
                                           std::int64_t lm_head_chunks);

}  // namespace kiln::train
