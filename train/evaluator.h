#pragma once
// Evaluation as a part of the loop: it decides when (train.eval_every, and the end), runs the
// eval split once over every rank's shard (each sample exactly once) and, for `kiln eval`, dumps
// the model's inputs and outputs so another runtime can be compared on the same data.

#include <cstdint>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/world.h"
#include "data/loader.h"
#include "layers/layer.h"
#include "train/gradient_sync.h"
#include "train/metrics_sink.h"

namespace kiln::train {

struct EvalResult {
  double loss = 0;
  double accuracy = 0;  // share of non-ignored targets predicted right
  std::int64_t samples = 0;
};

// What evaluate() writes besides its result (`kiln eval --dump-logits/--dump-inputs`), so that
// another runtime (ONNX Runtime, tests/infer/) can be compared with Kiln on the same inputs.
// One rank only: with several, each holds a shard of the eval split, and evaluate() refuses.
struct EvalOptions {
  std::string dump_logits;  // .npy of the model's f32 outputs: (N, classes) or (N, T, vocab)
  std::string dump_inputs;  // .npy of the inputs the model saw: (N, C, H, W) f32 or (N, T) i64
};

// Logits and targets as the loss wants them: (N, C) and (N).
void flatten_for_loss(Tensor& logits, Tensor& targets);
// A batch's inputs in the activation dtype the layers expect (token ids stay integers).
Tensor prepare_inputs(const Tensor& inputs, const PrecisionPolicy& policy);

struct EvaluatorOptions {
  std::int64_t every_steps = 0;  // train.eval_every; 0: only at the end
  std::int64_t max_batches = 0;  // train.eval_batches; 0: the whole split
  std::int64_t total_steps = 0;
};

class Evaluator {
 public:
  struct Parts {
    const World& world;
    Communicator& comm;
    Layer& net;
    GradientSync& sync;
    const data::DataLoader& train_loader;  // its options, for the eval loader's
    MetricsSink& metrics;
  };
  // `eval_set` may be null (data.eval_split none); `context` is the inference context.
  Evaluator(EvaluatorOptions options, Parts parts, std::shared_ptr<data::Dataset> eval_set,
            Context context);

  bool has_eval_set() const { return eval_set_ != nullptr; }
  // Whether the step just completed is evaluated by train.eval_every (the end is the loop's).
  bool due(std::int64_t step) const;
  // On the eval split, all ranks, without changing anything (leaves the model in eval mode).
  EvalResult evaluate(const EvalOptions& options = {});
  // The eval record of `step` in the metrics, with its line unless the end's summary says it.
  void report(std::int64_t step, const EvalResult& result, bool with_line);

 private:
  EvaluatorOptions options_;
  Parts p_;
  std::shared_ptr<data::Dataset> eval_set_;
  Context context_;
};

}  // namespace kiln::train
