// The training loop and its step. The loop only calls the parts, which decide their own "when":
// the checkpointer (every_steps, the end, a stop request), the evaluator (eval_every, the end),
// the graphed step (capture, replay or run eagerly), the gradient sync (nothing on one rank).
// Building the parts from the experiment: trainer_setup.cc.

#include <algorithm>
#include <cmath>

#include "core/nvtx.h"
#include "core/ops.h"
#include "layers/fp8_projection.h"
#include "optim/amp/amp.h"
#include "train/trainer_state.h"

namespace kiln::train {
namespace {

// A batch of a step's first micro-step could not be read (a data file truncated or rewritten
// while training): nothing of the step has run yet, so the steps before it can still be saved.
class StepDataError : public InputError {
 public:
  explicit StepDataError(const std::string& message) : InputError(message) {}
};

}  // namespace

Context Trainer::State::make_context(bool training) const {
  Context ctx;
  ctx.run.device = device;
  ctx.training = training;
  ctx.run.precision = precision.policy;
  ctx.run.seed = e.train().seed();
  ctx.run.channels_last = channels_last_layout;
  if (!training) return ctx;
  sync->install_hooks(ctx);
  // The step scalars are read from memory when the kernels run, so a graph can replay them; an
  // eager step reads them the same way.
  ctx.step.step = graphs->step_counter();
  ctx.step.loss_scale = optimizer->loss_scale_source();
  ctx.step.loss_scale_divisor = plan.accumulation;
  if (token_average) ctx.step.loss_rows = token_average->rows();
  return ctx;
}

StepOutcome Trainer::State::micro_step_work(Context& ctx, const Tensor& inputs,
                                            const Tensor& targets, MicroPosition position,
                                            Tensor& loss_sum) {
  const bool last = ends_step(position);
  if (begins_step(position)) sync->zero_gradients();
  sync->set_accumulating(!last);
  const bool resident = optimizer->resident();
  ops::axpy(1.0, loss_stage->forward_backward(ctx, inputs, targets), loss_sum);
  graphs->advance_counter();
  if (!last) {
    sync->end_micro_step();
    return {};
  }
  if (sync->sharded()) {
    // ZeRO: the optimizer reads this rank's reduced shard, so the fault goes there.
    sync->finish();
    std::vector<Parameter*> pieces = optimizer->updated_parameters();
    faults.gradients(counters.step, pieces);
  } else {
    faults.gradients(counters.step, parameters);
    sync->finish();
  }
  if (fp8_amax) fp8_amax->reduce();
  NvtxRange range("optimizer");
  if (!resident) return optimizer->step(counters.step, comm.get());
  optimizer->step_resident(comm.get());
  return {};
}

// No host synchronisation except inside the optimizer's inf check (none with resident steps).
StepOutcome Trainer::State::run_step(Context& ctx, Tensor& loss_sum, std::int64_t* micro_count,
                                     std::int64_t* sample_count) {
  NvtxRange step_range("step");
  const bool fault = faults.acts_on(counters.step);
  StepOutcome outcome;
  // The step's batches first when the loss averages over their counted targets, which every
  // micro-batch's loss needs before it runs; one at a time otherwise.
  std::vector<data::Batch> batches;
  const auto next_batch = [&](int micro) {
    try {
      return loader->next();
    } catch (const InputError& e) {
      if (micro == 0) throw StepDataError(e.what());
      throw;
    }
  };
  if (token_average) {
    for (int micro = 0; micro < plan.accumulation; ++micro) batches.push_back(next_batch(micro));
    token_average->begin_step(batches, comm.get());
  }
  for (int micro = 0; micro < plan.accumulation; ++micro) {
    data::Batch batch =
        token_average ? std::move(batches[static_cast<std::size_t>(micro)]) : next_batch(micro);
    Tensor inputs = faults.inputs(counters.step, prepare_inputs(batch.inputs, ctx.run.precision));
    ctx.call.document_starts = batch.document_starts;  // undefined unless documents are packed
    const MicroPosition position = micro_position(micro, plan.accumulation);
    graphs->run(position, ctx, inputs, batch.targets, fault, counters.step,
                [&](Context& c, const Tensor& in, const Tensor& tg) {
                  outcome = micro_step_work(c, in, tg, position, loss_sum);
                });
    ++counters.micro_step;
    ++*micro_count;
    *sample_count += batch.size();
  }
  ctx.weights_version = optimizer->weights_version();
  if (optimizer->resident()) {
    ++counters.step;
    return outcome;  // read with resident_outcome() when it is wanted
  }
  if (outcome.skipped) {
    ++counters.skipped;
    sync->skipped_step();
  }
  if (outcome.found_inf && !outcome.skipped) {
    throw Error("non-finite gradients (inf/NaN) at step " + std::to_string(counters.step + 1) +
                " on rank " + std::to_string(world.rank) + " of " + std::to_string(world.size) +
                " with no loss scaler to skip the step (the loss diverged or the batch holds "
                "NaN/inf): lower optimizer.lr, check the data, or use precision.half: FP16 with "
                "dynamic loss scaling");
  }
  ++counters.step;
  return outcome;
}

TrainResult Trainer::train() {
  State& s = *s_;
  TrainResult result;
  Context ctx = s.make_context(true);
  s.model.net->set_training(true);
  const config::TrainConfig& t = s.e.train();
  const std::int64_t log_every = std::max(1, t.log_every());
  PreemptionDeadline deadline(t.preemption_grace_s());
  StepCounters& n = s.counters;

  std::int64_t trained = 0;
  for (const Parameter* p : s.parameters) trained += p->value.numel();
  const std::int64_t all = s.model.net->parameter_count();
  // LoRA: how many of them train, as PEFT's print_trainable_parameters says it.
  const std::string frozen =
      trained == all ? "" : ", " + std::to_string(trained) + " trained (LoRA adapters)";
  s.metrics->print("training " + s.e.model().name() + " (" + std::to_string(all) + " parameters" +
                   frozen + ") on " + s.device.str() + " x" + std::to_string(s.world.size) +
                   ", batch " + std::to_string(s.plan.per_gpu) + " x " +
                   std::to_string(s.plan.accumulation) + " x " + std::to_string(s.world.size) +
                   " = " + std::to_string(s.plan.global) + ", " + std::to_string(s.total_steps) +
                   " steps");
  if (s.world.size > 1) {
    s.metrics->print("optimizer state: " + std::to_string(s.optimizer_bytes) +
                     " bytes on this rank (parallel.zero_stage " +
                     std::to_string(s.sync->zero_stage()) + ")");
  }

  ComputeStreamScope on_stream(*s.graphs);
  Tensor loss_sum = Tensor::zeros({}, DType::F32, s.device);
  std::int64_t interval_micro = 0, interval_samples = 0, interval_steps = 0;
  const std::int64_t first_step = n.step;
  auto interval_start = Clock::now();
  const auto run_start = Clock::now();
  double wait_at_interval_start = s.loader->wait_time();
  std::uint64_t interval_gathers = 0;  // ZeRO-3's weight gathers in the interval's steps
  std::int64_t run_samples = 0;

  s.metrics->begin(n.step);
  while (n.step < s.total_steps) {
    s.faults.before_step(n.step);
    const data::LoaderState position = s.loader->state();  // where this step's batches start
    StepOutcome outcome;
    const std::uint64_t gathers_before = s.sync->weight_gathers();
    try {
      outcome = s.run_step(ctx, loss_sum, &interval_micro, &interval_samples);
    } catch (const StepDataError& e) {
      throw InputError(s.keep_work_before_data_error(e.what(), position));
    }
    interval_gathers += s.sync->weight_gathers() - gathers_before;
    run_samples += s.plan.global;
    ++interval_steps;

    if (n.step % log_every == 0 || n.step == s.total_steps) {
      // Resident steps: the one wait for the device of a log interval.
      if (s.optimizer->resident()) outcome = s.resident_outcome();
      s.loss_fn.check_targets();
      double mean_loss = loss_sum.item() / std::max<std::int64_t>(interval_micro, 1);
      if (s.world.size > 1) mean_loss = s.comm->all_reduce_host(mean_loss, HostReduceOp::Average);
      if (!std::isfinite(mean_loss) && !(s.precision.policy.matmul == DType::F16)) {
        throw Error("the training loss is " + std::to_string(mean_loss) + " at step " +
                    std::to_string(n.step) + " on rank " + std::to_string(s.world.rank) +
                    ": lower optimizer.lr, or check the data");
      }
      const double elapsed = std::max(seconds_since(interval_start), 1e-9);
      const double wait = s.loader->wait_time() - wait_at_interval_start;
      result.final_loss = mean_loss;
      const double run_elapsed = seconds_since(run_start);
      const std::int64_t steps_run = n.step - first_step;
      IntervalFigures figures{
          n.step,
          s.total_steps,
          s.loader->epoch(),
          mean_loss,
          outcome.lr,
          outcome.loss_scale,
          outcome.grad_norm,
          outcome.skipped,
          interval_samples * s.world.size / elapsed,
          wait / elapsed,
          s.flops_per_sample,
          s.peak_flops,
          s.world.size,
          s.tokens_per_sample,
          1e3 * elapsed / std::max<std::int64_t>(interval_steps, 1),
          run_elapsed,
          steps_run > 0 ? run_elapsed / steps_run * (s.total_steps - n.step) : -1.0};
      if (s.e.precision().fp8().enabled()) {
        figures.fp8_overflows = fp8_overflows(s.model.net->buffers());
        // Merged across ranks (Fp8AmaxReduction), every rank holds the same count.
        if (s.world.size > 1 && !s.fp8_amax)
          figures.fp8_overflows = s.comm->all_reduce_host(figures.fp8_overflows, HostReduceOp::Sum);
      }
      if (s.sync->zero_stage() == 3) {
        figures.weight_gathers =
            static_cast<double>(interval_gathers) / std::max<std::int64_t>(interval_steps, 1);
      }
      IntervalReport report = interval_report(figures);
      s.metrics->write(RecordKind::kTrain, n.step, std::move(report.record), report.line,
                       report.bar_text);
      loss_sum.zero();
      interval_micro = interval_samples = interval_steps = 0;
      interval_gathers = 0;
      interval_start = Clock::now();
      wait_at_interval_start = s.loader->wait_time();
    } else {
      s.metrics->tick(n.step);
    }

    const StopRequest stop = agreed_stop_request(*s.comm, s.world.size);
    // A scheduler's stop after the last step changes nothing: the run ends as it would have.
    if ((stop.signal != 0 || stop.interrupted) && (stop.interrupted || n.step < s.total_steps)) {
      result.stop_signal = stop.signal;
      s.metrics->print("stop requested (" + signal_name(result.stop_signal) +
                       "): checkpointing at step " + std::to_string(n.step));
      s.checkpointer->save();
      result.preempted = true;
      result.interrupted = stop.interrupted;
      break;
    }
    s.checkpointer->maybe_save(false);
    if (s.evaluator->due(n.step)) {
      const EvalResult ev = s.evaluator->evaluate();
      s.model.net->set_training(true);
      s.evaluator->report(n.step, ev, true);
    }
  }
  s.metrics->finish();
  if (s.optimizer->resident()) s.resident_outcome();
  result.steps = n.step;
  result.skipped_steps = n.skipped;
  result.samples_per_s = run_samples / std::max(seconds_since(run_start), 1e-9);
  if (!result.preempted) {
    s.checkpointer->maybe_save(true);
    if (s.evaluator->has_eval_set()) {
      result.eval = s.evaluator->evaluate();
      s.evaluator->report(n.step, result.eval, false);
    }
  }
  result.last_checkpoint = s.checkpointer->last_saved();
  result.log_write_failure = s.metrics->close();
  deadline.finish();
  return result;
}

// One rank: the steps since the last checkpoint are saved (at the data position of the batch
// that failed, so a resume reads it again once the file is restored), as preemption would. With
// several ranks the others are already inside the step's collectives: the error ends the job.
std::string Trainer::State::keep_work_before_data_error(const std::string& error,
                                                        const data::LoaderState& position) {
  const std::string failed =
      error + " (reading the batches of step " + std::to_string(counters.step + 1) + ")";
  if (world.size > 1 || checkpointer->last_saved_step() == counters.step) {
    return failed +
           (counters.step > 0 && world.size == 1
                ? "; the last checkpoint (" + checkpointer->last_saved() + ") holds every step done"
                : std::string());
  }
  if (counters.step == 0) return failed;
  metrics->print("data error at step " + std::to_string(counters.step + 1) +
                 ": checkpointing the " + std::to_string(counters.step) + " steps done");
  const std::string saved = checkpointer->save(&position);
  return failed + "; the steps done are kept in " + saved +
         ": restore the file, then continue with --resume latest";
}

EvalResult Trainer::evaluate(const EvalOptions& options) {
  return s_->evaluator->evaluate(options);
}

}  // namespace kiln::train
