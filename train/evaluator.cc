#include "train/evaluator.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "core/npy.h"
#include "core/ops.h"
#include "core/safetensors.h"
#include "layers/softmax_cross_entropy.h"

namespace kiln::train {
namespace {

// Host tensors of one dtype and trailing shape, stacked along dim 0 (the dumps).
Tensor concat_rows(const std::vector<Tensor>& parts) {
  if (parts.empty()) throw InputError("--dump-logits/--dump-inputs: the eval split is empty");
  Shape shape = parts.front().shape();
  shape[0] = 0;
  for (const Tensor& p : parts) shape[0] += p.size(0);
  Tensor out = Tensor::empty(shape, parts.front().dtype());
  char* dst = static_cast<char*>(out.data());
  for (const Tensor& p : parts) {
    Tensor c = p.contiguous();
    std::memcpy(dst, c.data(), c.nbytes());
    dst += c.nbytes();
  }
  return out;
}

}  // namespace

void flatten_for_loss(Tensor& logits, Tensor& targets) {
  if (logits.dim() == 3) logits = logits.reshape({-1, logits.size(-1)});
  if (targets.dim() == 2) targets = targets.reshape({-1});
}

Tensor prepare_inputs(const Tensor& inputs, const PrecisionPolicy& policy) {
  if (is_floating(inputs.dtype()) && inputs.dtype() != policy.activation) {
    return inputs.to(policy.activation);
  }
  return inputs;
}

Evaluator::Evaluator(EvaluatorOptions options, Parts parts, std::shared_ptr<data::Dataset> eval_set,
                     Context context)
    : options_(options), p_(parts), eval_set_(std::move(eval_set)), context_(std::move(context)) {}

bool Evaluator::due(std::int64_t step) const {
  return options_.every_steps > 0 && step % options_.every_steps == 0 &&
         step < options_.total_steps && eval_set_;
}

EvalResult Evaluator::evaluate(const EvalOptions& options) {
  EvalResult r;
  const bool dump = !options.dump_logits.empty() || !options.dump_inputs.empty();
  if (dump && p_.world.size > 1) {
    throw InputError(
        "--dump-logits/--dump-inputs write the whole eval split from one process; "
        "run kiln eval without mpirun (" +
        std::to_string(p_.world.size) + " ranks)");
  }
  if (!eval_set_) {
    if (dump) throw InputError("--dump-logits/--dump-inputs: no eval split (data.eval_split)");
    return r;
  }
  std::vector<Tensor> dumped_logits, dumped_inputs;  // per batch, on the host
  p_.sync.broadcast_buffers();
  // ZeRO-3: whole weights for the evaluation (ranks may see different numbers of batches, so
  // the weights cannot be gathered layer by layer).
  WholeWeights whole(p_.sync, /*written=*/false);
  data::LoaderOptions lo = p_.train_loader.options();
  lo.shuffle = false;
  lo.train = false;
  lo.drop_last = false;
  lo.shard_mode = data::ShardMode::kUneven;  // every sample exactly once: exact accuracy
  lo.workers = std::min(lo.workers, 2);
  lo.prefetch = std::min(lo.prefetch, 2 * std::max(lo.workers, 1));  // not the training window
  data::DataLoader loader(eval_set_, lo);
  Context ctx = context_;
  p_.net.set_training(false);
  SoftmaxCrossEntropy loss_fn;
  const Device device = ctx.run.device;
  Tensor loss_total = Tensor::zeros({}, DType::F32, device);
  Tensor correct = Tensor::zeros({}, DType::F32, device);
  Tensor counted = Tensor::zeros({}, DType::F32, device);
  std::int64_t batches = loader.batches_per_epoch();
  if (options_.max_batches > 0) batches = std::min(batches, options_.max_batches);
  for (std::int64_t i = 0; i < batches; ++i) {
    data::Batch batch = loader.next();
    ctx.call.document_starts = batch.document_starts;
    Tensor logits = p_.net.forward(ctx, prepare_inputs(batch.inputs, ctx.run.precision));
    if (!options.dump_logits.empty()) dumped_logits.push_back(logits.to(Device::cpu(), DType::F32));
    if (!options.dump_inputs.empty()) dumped_inputs.push_back(batch.inputs.to(Device::cpu()));
    Tensor targets = batch.targets;
    flatten_for_loss(logits, targets);
    Tensor loss = loss_fn.forward(ctx, logits, targets);
    // Weight each batch's mean loss by its row count, so the total is a per-row mean.
    Tensor rows = loss_fn.counted_rows();
    Tensor weighted = ops::mul(loss, rows);
    ops::axpy(1.0, weighted, loss_total);
    ops::axpy(1.0, loss_fn.correct_count(), correct);
    ops::axpy(1.0, rows, counted);
  }
  loss_fn.check_targets();
  if (!options.dump_logits.empty())
    write_file_atomically(options.dump_logits, encode_npy(concat_rows(dumped_logits)));
  if (!options.dump_inputs.empty())
    write_file_atomically(options.dump_inputs, encode_npy(concat_rows(dumped_inputs)));
  std::vector<double> sums = {loss_total.item(), correct.item(), counted.item()};
  if (p_.world.size > 1) p_.comm.all_reduce_host(sums, HostReduceOp::Sum);
  r.samples = static_cast<std::int64_t>(sums[2]);
  r.loss = sums[2] > 0 ? sums[0] / sums[2] : 0;
  r.accuracy = sums[2] > 0 ? sums[1] / sums[2] : 0;
  return r;
}

void Evaluator::report(std::int64_t step, const EvalResult& result, bool with_line) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "eval at step %lld: loss %.4f accuracy %.2f%%",
                static_cast<long long>(step), result.loss, 100 * result.accuracy);
  p_.metrics.write(RecordKind::kEval, step, {{"loss", result.loss}, {"accuracy", result.accuracy}},
                   with_line ? buf : "");
}

}  // namespace kiln::train
