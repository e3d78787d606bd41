#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "comm/watchdog.h"
#include "core/allocator.h"
#include "core/npy.h"
#include "core/nvtx.h"
#include "core/ops.h"
#include "core/safetensors.h"
#include "core/system_info.h"
#include "data/factory.h"
#include "train/model_options.h"
#include "train/parameter_loader.h"
#include "train/run_setup.h"
#include "train/trainer_state.h"

namespace kiln::train {
namespace {

// Logits and targets as the loss wants them: (N, C) and (N).
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

// Host tensors of one dtype and trailing shape, stacked along dim 0 (evaluate()'s dumps).
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

// Deterministic fp32 initialisation on the host (or model.init_from), before any device copy.
void initialise_model(Trainer::State& s) {
  s.model = make_model(model_options_from(s.e));
  s.model.net->reset_parameters(s.e.train().seed());
  // Nothing consumes the gradient of the model's input: its first layer may skip computing it.
  for (Layer* first = s.model.net.get(); first != nullptr;) {
    first->set_input_gradient(false);
    auto children = first->children();
    first = children.empty() ? nullptr : children.front();
  }
  const std::string& init_from = s.e.model().init_from();
  if (!init_from.empty()) {
    SafetensorsFile file = load_safetensors(init_from);
    load_named_tensors(
        {init_from, &file.tensors, " (model.init_from, for model " + s.e.model().name() + ")"},
        s.model.net->parameters(), s.model.net->buffers(), false);
  }
}

// checkpoint.resume (or --resume): "" (fresh), "latest" (the newest complete one, if any) or a
// directory. Returns the checkpoint to load, or "".
std::string resolve_resume(Trainer::State& s) {
  std::string resume = s.options.resume.empty() ? s.e.checkpoint().resume() : s.options.resume;
  if (resume != "latest") return resume;
  if (s.rank0()) s.store->remove_partial();
  s.comm->barrier();  // no rank looks for the latest while rank 0 still removes partial ones
  if (auto latest = s.store->latest()) return *latest;
  if (!s.options.resume.empty()) {
    throw InputError("--resume latest: no complete checkpoint in " + s.store->dir() +
                     " (checkpoint.dir); start without --resume, or point it at a checkpoint");
  }
  // checkpoint.resume "latest" in a config: a job's first run starts fresh, its requeued runs
  // continue from their checkpoints.
  s.metrics->print("checkpoint.resume latest: no checkpoint in " + s.store->dir() +
                   " yet; starting fresh");
  return "";
}

// The step count PowerSGD starts by, and this rank's error feedback and Q. A checkpoint without
// them (written before the run compressed, or by an uncompressed run) starts them afresh.
void restore_compression_state(Trainer::State& s, const Checkpoint& c) {
  s.dp->set_finished_steps(c.state.step());
  if (s.dp->compression_state().empty()) return;
  if (!c.compression) {
    if (c.state.step() > s.e.parallel().powersgd_start_step()) {
      s.metrics->print("checkpoint " + c.path +
                       " holds no PowerSGD state: error feedback starts from zero");
    }
    return;
  }
  const std::string prefix = "rank" + std::to_string(s.world.rank) + ".";
  NamedTensors mine;
  for (const auto& [name, t] : c.compression->tensors) {
    if (name.rfind(prefix, 0) == 0) mine.emplace_back(name.substr(prefix.size()), t);
  }
  s.dp->load_compression_state(mine, c.path + "/compression.safetensors");
}

// Verified before step 1; a checkpoint of another model or batch layout is refused.
void restore_checkpoint(Trainer::State& s, const std::string& path) {
  Checkpoint c = load_model_checkpoint(path, s.e.model().name(), *s.model.net);
  const config::CheckpointState& st = c.state;
  // One whole optimizer file, or the shards of a ZeRO run on any number of ranks (resharded).
  std::vector<const SafetensorsFile*> optimizer_files;
  if (c.optimizer_shards.empty()) optimizer_files.push_back(&c.optimizer);
  for (const SafetensorsFile& f : c.optimizer_shards) optimizer_files.push_back(&f);
  s.optimizer->load_state(optimizer_files, path);
  s.optimizer->load_scaler_state(st.loss_scaler());
  // A sharded checkpoint carries the whole optimizer state, so another world size may resume it
  // when the data position means the same (the same batches per epoch: a fixed global batch).
  const bool reshardable = !c.optimizer_shards.empty() || s.e.parallel().zero_stage() > 0;
  if (!s.options.evaluate_only &&
      ((st.world_size() != s.world.size && !reshardable) ||
       st.data().batches_per_epoch() != s.loader->batches_per_epoch())) {
    throw InputError(path + "/state.pbtxt: written by " + std::to_string(st.world_size()) +
                     " rank(s) with " + std::to_string(st.data().batches_per_epoch()) +
                     " batches per epoch; this run has " + std::to_string(s.world.size) +
                     " rank(s) and " + std::to_string(s.loader->batches_per_epoch()) +
                     ": resume with the same world size and batch size (a ZeRO checkpoint, "
                     "parallel.zero_stage > 0, resumes on any world size with the same "
                     "train.global_batch)");
  }
  data::LoaderState ls;
  ls.seed = st.data().seed();
  ls.epoch = st.data().epoch();
  ls.next_batch = st.data().next_batch();
  ls.batches_per_epoch = st.data().batches_per_epoch();
  if (!s.options.evaluate_only) s.loader->restore(ls);
  s.step = st.step();
  s.micro_step = st.micro_step();
  s.skipped = st.loss_scaler().skipped_steps();
  if (s.dp && !s.options.evaluate_only) restore_compression_state(s, c);
  s.metrics->print("resumed from " + path + " at step " + std::to_string(s.step) + " (" + ls.str() +
                   ")");
}

// Every rank's PowerSGD state (error feedback differs between ranks), gathered to host tensors
// named "rank<r>.<name>" on rank 0 (empty elsewhere, and without PowerSGD). Collective.
NamedTensors gather_compression_state(Trainer::State& s) {
  NamedTensors gathered;
  if (!s.dp) return gathered;
  for (const auto& [name, t] : s.dp->compression_state()) {
    Tensor all = Tensor::empty({s.world.size * t.numel()}, t.dtype(), t.device());
    s.comm->all_gather(t, all);
    if (!s.rank0()) continue;
    Tensor host = all.to(Device::cpu());
    for (int r = 0; r < s.world.size; ++r) {
      gathered.emplace_back("rank" + std::to_string(r) + "." + name,
                            host.slice(0, r * t.numel(), (r + 1) * t.numel()).clone());
    }
  }
  return gathered;
}

// Writes a checkpoint of the current step on rank 0; every rank waits until it is complete.
std::string save_checkpoint(Trainer::State& s) {
  if (s.optimizer->resident()) s.resident_outcome();  // the scaler and step count, to the host
  if (s.dp) s.dp->broadcast_buffers();
  config::CheckpointState st;
  st.set_step(s.step);
  st.set_micro_step(s.micro_step);
  st.set_samples_seen(s.step * s.plan.global);
  data::LoaderState ls = s.loader->state();
  st.mutable_data()->set_seed(ls.seed);
  st.mutable_data()->set_epoch(ls.epoch);
  st.mutable_data()->set_next_batch(ls.next_batch);
  st.mutable_data()->set_batches_per_epoch(ls.batches_per_epoch);
  *st.mutable_loss_scaler() = s.optimizer->scaler_state();
  st.mutable_loss_scaler()->set_skipped_steps(s.skipped);
  st.set_seed(s.e.train().seed());
  st.set_world_size(s.world.size);
  st.set_model_name(s.e.model().name());
  st.set_kiln_version(kiln_version());
  st.set_experiment_hash(config::experiment_hash(s.e));
  *st.mutable_experiment() = s.e;
  NamedTensors model;
  const NamedTensors compression = gather_compression_state(s);
  if (s.rank0()) {
    for (Parameter* p : s.model.net->parameters()) model.emplace_back(p->name, stored_layout(*p));
    for (Buffer* b : s.model.net->buffers()) model.emplace_back(b->name, b->value);
  }
  if (s.optimizer->sharded()) {
    // Every rank writes its optimizer shard into rank 0's staging directory; rank 0 completes it.
    if (s.rank0()) s.store->prepare_staging(s.step);
    s.comm->barrier();
    const std::string shard = optimizer_shard_name(s.world.rank, s.world.size);
    auto metadata = s.optimizer->shard_metadata();
    metadata["format"] = "kiln";
    save_safetensors(s.store->staging_dir(s.step) + "/" + shard, s.optimizer->state(), metadata);
    s.comm->barrier();
    if (s.rank0()) {
      std::vector<std::string> shards;
      for (int r = 0; r < s.world.size; ++r)
        shards.push_back(optimizer_shard_name(r, s.world.size));
      s.metrics->print("checkpoint " + s.store->save_sharded(model, shards, st, compression));
    }
  } else if (s.rank0()) {
    s.metrics->print("checkpoint " + s.store->save(model, s.optimizer->state(), st, compression));
  }
  s.comm->barrier();  // nobody moves on (or exits) before the checkpoint is complete
  return s.store->dir() + "/" + checkpoint_name(s.step);
}

// train.cuda_graphs (unset: on with CUDA): the optimizer's step state goes resident and, on
// CUDA, steady micro-steps are captured. What needs the host every step keeps today's path.
void set_up_graphs(Trainer::State& s) {
  const config::TrainConfig& t = s.e.train();
  const bool wanted = t.has_cuda_graphs() ? t.cuda_graphs() : s.device.is_cuda();
  if (!wanted) return;
  std::string host_path;
  if (s.dp && s.dp->zero_stage() > 0) {
    host_path = "parallel.zero_stage > 0 combines the gradient norms on the host every step";
  } else if (s.e.parallel().compression() == config::ParallelConfig::POWERSGD) {
    host_path =
        "parallel.compression POWERSGD resets its error feedback on the host after a "
        "skipped step";
  }
  if (!host_path.empty()) {
    s.metrics->print("cuda_graphs: off, " + host_path);
    return;
  }
  s.graphs = std::make_unique<StepGraphs>(s.device);
  s.graphs->micro_step =
      Tensor::from_vector(std::vector<std::int64_t>{s.micro_step}, {1}).to(s.device);
  s.optimizer->make_resident(s.step, s.skipped);
  if (s.device.is_cuda()) {
    s.graphs->capture = true;
  } else {
    s.metrics->print(
        "cuda_graphs: the CPU has nothing to capture: steps run eagerly, with the step state "
        "resident");
  }
}

}  // namespace

Trainer::Trainer(const config::Experiment& experiment, const World& world, TrainerOptions options)
    : s_(std::make_unique<State>()) {
  State& s = *s_;
  s.e = experiment;
  s.world = world;
  s.options = options;
  if (options.lock_directories && world.rank == 0) {
    // Before the checkpoint store removes partial checkpoints or metrics.jsonl is truncated:
    // those belong to the run that holds the lock.
    s.directory_locks = lock_run_directories(
        {{"logging.dir", s.e.logging().dir()}, {"checkpoint.dir", s.e.checkpoint().dir()}});
  }
  const config::TrainConfig& t = s.e.train();
  s.device = choose_device(t, world);
  configure_process(s.e, s.device, options.heuristic_algorithms);
  s.faults = FaultInjection::from_environment(world.rank);
  s.plan = config::plan_batches(s.e, world.size);
  CommunicatorOptions comm_options;
  comm_options.timeout_s = s.e.parallel().collective_timeout_s();
  comm_options.backend = comm_backend(s.e.parallel());
  s.comm = make_communicator(world, s.device, comm_options);
  s.comm->check_same_on_all_ranks(config::experiment_hash(s.e),
                                  "the experiment (config file and --set overrides)");

  initialise_model(s);
  NamedTensors fp32_init;
  for (Parameter* p : s.model.net->parameters()) {
    fp32_init.emplace_back(p->name, p->value.to(s.device));
  }
  s.parameters = s.model.net->parameters();
  s.precision = precision_for(s.e, s.device);
  s.model.net->to(s.device, s.device.is_cpu() && s.precision.parameter_dtype == DType::F32
                                ? DType::F32
                                : s.precision.parameter_dtype);
  if (world.size > 1) {
    DataParallelOptions dp;
    dp.bucket_bytes = static_cast<std::size_t>(s.e.parallel().bucket_mb() * (1 << 20));
    dp.compression = gradient_compression(s.e.parallel());
    if (s.e.parallel().has_first_bucket_mb()) {
      dp.first_bucket_bytes =
          static_cast<std::size_t>(s.e.parallel().first_bucket_mb() * (1 << 20));
    }
    dp.half_dtype =
        s.e.precision().half() == config::PrecisionConfig::BF16 ? DType::BF16 : DType::F16;
    dp.powersgd.rank = s.e.parallel().powersgd_rank();
    dp.powersgd.seed = static_cast<std::uint64_t>(s.e.train().seed());
    dp.powersgd_start_step = s.e.parallel().powersgd_start_step();
    dp.zero_stage = s.e.parallel().zero_stage();
    if (dp.zero_stage > 0 && dp.compression != GradientCompression::None) {
      throw InputError(std::string("parallel.compression ") +
                       gradient_compression_name(dp.compression) +
                       " is not supported with parallel.zero_stage > 0 (the gradients are "
                       "reduce-scattered in their own dtype): set one of them off");
    }
    s.dp = std::make_unique<DataParallel>(s.model.net->parameters(), s.model.net->buffers(),
                                          *s.comm, dp);
  }

  const std::string kind = dataset_kind(s.e, s.model);
  const data::DatasetOptions dataset = dataset_options(s.e, s.model);
  s.train_set = data::make_dataset(kind, dataset_path(s.e, "train"), "train", dataset);
  const std::string& eval_split = s.e.data().eval_split();
  if (eval_split != "none") {
    s.eval_set = data::make_dataset(kind, dataset_path(s.e, eval_split), eval_split, dataset);
  }
  s.loader =
      std::make_unique<data::DataLoader>(s.train_set, loader_options(s.e, s.plan, world, s.device));

  const std::int64_t batches_per_epoch = std::max<std::int64_t>(1, s.loader->batches_per_epoch());
  if (t.duration_case() == config::TrainConfig::kSteps) {
    s.total_steps = t.steps();
  } else {
    const double micro = t.epochs() * static_cast<double>(batches_per_epoch);
    s.total_steps = std::max<std::int64_t>(
        1, static_cast<std::int64_t>(std::ceil(micro / s.plan.accumulation)));
  }
  // The optimizer's own tensors (masters, moments) as the allocator counts them: ZeRO divides
  // them by the world size.
  const std::size_t allocated_before = allocator_for(s.device).stats().allocated_bytes;
  s.optimizer = std::make_unique<StepOptimizer>(s.model.net->parameters(), fp32_init, s.e,
                                                s.total_steps, s.dp.get());
  const std::size_t allocated_after = allocator_for(s.device).stats().allocated_bytes;
  s.optimizer_bytes = allocated_after > allocated_before ? allocated_after - allocated_before : 0;
  Shape input = s.model.sample_shape;
  input.insert(input.begin(), 1);
  s.flops_per_sample = 3.0 * s.model.net->forward_flops(input);
  s.peak_flops = s.device.is_cuda() ? dense_half_peak_flops(s.device.index) : 0;

  s.store = std::make_unique<CheckpointStore>(s.e.checkpoint().dir(), s.e.checkpoint().keep_last());
  MetricsSinkOptions sink;
  sink.active = s.rank0();
  sink.print = !options.quiet;
  sink.progress = progress_bar_wanted(s.e.logging(), world);
  sink.dir = s.e.logging().dir();
  sink.jsonl = s.e.logging().jsonl();
  sink.tensorboard = s.e.logging().tensorboard();
  sink.append = !(options.resume.empty() ? s.e.checkpoint().resume() : options.resume).empty();
  sink.total_steps = s.total_steps;
  sink.device = s.device;
  s.metrics = std::make_unique<MetricsSink>(sink);

  const std::string resume = resolve_resume(s);
  if (!resume.empty()) restore_checkpoint(s, resume);
  if (!options.evaluate_only) set_up_graphs(s);
}

Trainer::~Trainer() = default;

Context Trainer::State::make_context(bool training) const {
  Context ctx;
  ctx.device = device;
  ctx.training = training;
  ctx.precision = precision.policy;
  ctx.seed = e.train().seed();
  ctx.channels_last = channels_last(e.model(), device, precision.policy);
  if (dp && training) {
    ctx.on_grad_ready = dp->grad_ready_hook();
    ctx.on_layer = on_backward_begin(dp->gradient_allocation_hook());
  }
  if (graphs && training) {
    ctx.step_source = reinterpret_cast<const std::uint64_t*>(graphs->micro_step.data());
    ctx.loss_scale_source = optimizer->loss_scale_source();
    ctx.loss_scale_divisor = plan.accumulation;
  }
  return ctx;
}

StepOutcome Trainer::State::micro_step_work(Context& ctx, const Tensor& inputs,
                                            const Tensor& targets, MicroPosition position,
                                            Tensor& loss_sum) {
  const bool first = position == MicroPosition::Only || position == MicroPosition::First;
  const bool last = position == MicroPosition::Only || position == MicroPosition::Last;
  if (first) {
    if (dp) {
      dp->zero_grad_lazily();  // ZeRO-2: buckets are allocated as backward reaches them
    } else {
      for (Parameter* p : parameters) p->grad.zero();
    }
  }
  if (dp) dp->set_accumulation_micro_step(!last);
  const bool resident = optimizer->resident();
  const optim::GradientAccumulation accumulation(plan.accumulation);
  Tensor logits = model.net->forward(ctx, inputs);
  Tensor flat_targets = targets;
  flatten_for_loss(logits, flat_targets);
  Tensor loss = loss_fn.forward(ctx, logits, flat_targets);
  ops::axpy(1.0, loss, loss_sum);
  logits = Tensor();  // the loss is done with it: its gradient overwrites it
  // Resident: the loss scale is read where it lives (ctx.loss_scale_source) when the kernel runs.
  Tensor dlogits =
      loss_fn.backward(ctx, resident ? 1.0 : accumulation.loss_factor(optimizer->loss_scale()),
                       /*reuse_logits=*/true);
  model.net->backward(ctx, dlogits);
  if (graphs) ops::increment(graphs->micro_step);
  StepOutcome outcome;
  if (!last) return outcome;
  if (dp && dp->zero_stage() > 0) {
    // ZeRO: the optimizer reads this rank's reduced shard, so the fault goes there.
    dp->finish();
    std::vector<Parameter*> pieces = optimizer->updated_parameters();
    faults.gradients(step, pieces);
  } else {
    faults.gradients(step, parameters);
    if (dp) dp->finish();
  }
  NvtxRange range("optimizer");
  if (resident) {
    optimizer->step_resident(comm.get());
  } else {
    outcome = optimizer->step(step, comm.get());
  }
  return outcome;
}

void Trainer::State::say_eager(const std::string& reason) {
  if (graphs->said.insert(reason).second) metrics->print("cuda_graphs: " + reason);
}

void Trainer::State::graphed_micro_step(Context& ctx, const Tensor& inputs, const Tensor& targets,
                                        MicroPosition position, Tensor& loss_sum) {
  StepGraphs& g = *graphs;
  if (!g.inputs.defined()) {  // the first batch sets the shape the graphs are captured for
    g.inputs = Tensor::empty(inputs.shape(), inputs.dtype(), inputs.device());
    g.targets = Tensor::empty(targets.shape(), targets.dtype(), targets.device());
  }
  if (!g.steady(inputs, targets)) {
    say_eager("a batch of shape " + shape_str(inputs.shape()) +
              " runs eagerly (the graphs are captured for " + shape_str(g.inputs.shape()) + ")");
    micro_step_work(ctx, inputs, targets, position, loss_sum);
    return;
  }
  auto it = g.graphs.find(position);
  // The first run of a position builds plans, workspaces and tables eagerly; the second is
  // captured.
  if (it == g.graphs.end() && g.eager_runs[position]++ == 0) {
    micro_step_work(ctx, inputs, targets, position, loss_sum);
    return;
  }
  g.inputs.copy_from(inputs);
  g.targets.copy_from(targets);
  if (it == g.graphs.end()) {
    // The eager run's activations sit free in the cache: give them back, so that the graph's
    // pool takes their place rather than adding to them (and nothing needs freeing in capture).
    cuda_allocator(device.index).empty_cache();
    auto graph = std::make_unique<CudaGraph>();
    std::string why;
    Context frozen = ctx;  // the graph keeps these values; what changes is read from memory
    const bool captured = graph->capture(
        device, g.stream.handle(), &g.pool,
        [&] { micro_step_work(frozen, g.inputs, g.targets, position, loss_sum); }, &why);
    if (!captured) {
      g.capture = false;
      say_eager("the step could not be captured (" + why + "); training goes on eagerly");
      if (dp) dp->reset_step();
      micro_step_work(ctx, inputs, targets, position, loss_sum);
      return;
    }
    metrics->print("cuda_graphs: captured the micro-step (" + std::to_string(graph->nodes()) +
                   " nodes) for batches of shape " + shape_str(inputs.shape()));
    it = g.graphs.emplace(position, std::move(graph)).first;
  }
  it->second->replay(g.stream.handle());
  ++g.replays;
  const bool collectives = position == MicroPosition::Only || position == MicroPosition::Last;
  if (world.size > 1 && collectives) {
    // The collectives inside a graph are not watched one by one: the replay is, as one.
    auto done = std::make_shared<Event>(device);
    done->record(g.stream.handle());
    Watchdog::instance().begin(
        "collectives in the CUDA graph of training step", static_cast<std::uint64_t>(step + 1),
        e.parallel().collective_timeout_s(), [done, d = device]() {
          try {  // the watchdog's thread: an error surfaces on the training thread instead
            DeviceGuard guard(d);
            return done->query();
          } catch (const std::exception&) {
            return true;
          }
        });
  }
}

StepOutcome Trainer::State::resident_outcome() {
  return optimizer->report(&skipped);
}

// No host synchronisation except inside the optimizer's inf check (none with resident steps).
StepOutcome Trainer::State::run_step(Context& ctx, Tensor& loss_sum, std::int64_t* micro_count,
                                     std::int64_t* sample_count) {
  NvtxRange step_range("step");
  const bool fault = faults.acts_on(step);
  StepOutcome outcome;
  for (int micro = 0; micro < plan.accumulation; ++micro) {
    data::Batch batch = loader->next();
    ctx.step = static_cast<std::uint64_t>(micro_step);
    Tensor inputs = faults.inputs(step, prepare_inputs(batch.inputs, ctx.precision));
    const MicroPosition position = micro_position(micro, plan.accumulation);
    if (graphs && graphs->capture && !fault) {
      graphed_micro_step(ctx, inputs, batch.targets, position, loss_sum);
    } else {
      if (graphs && graphs->capture) say_eager("a step with an injected fault runs eagerly");
      outcome = micro_step_work(ctx, inputs, batch.targets, position, loss_sum);
    }
    if (graphs) ++graphs->micro_steps;
    ++micro_step;
    ++*micro_count;
    *sample_count += batch.size();
  }
  ctx.weights_version = optimizer->weights_version();
  if (optimizer->resident()) {
    ++step;
    return outcome;  // read with resident_outcome() when it is wanted
  }
  if (outcome.skipped) {
    ++skipped;
    if (dp) dp->reset_compression_state();
  }
  if (outcome.found_inf && !outcome.skipped) {
    throw Error("non-finite gradients (inf/NaN) at step " + std::to_string(step + 1) + " on rank " +
                std::to_string(world.rank) + " of " + std::to_string(world.size) +
                " with no loss scaler to skip the step (the loss diverged or the batch holds "
                "NaN/inf): lower optimizer.lr, check the data, or use precision.half: FP16 with "
                "dynamic loss scaling");
  }
  ++step;
  return outcome;
}

namespace {

// The training record of one log interval and its line: "step 6/6 epoch 0 loss ...".
struct IntervalReport {
  Record record;
  std::string line;
  std::string bar_text;
};

IntervalReport interval_report(const Trainer::State& s, const StepOutcome& outcome,
                               double mean_loss, double samples_per_s, double wait_fraction) {
  IntervalReport report;
  const double tflops = samples_per_s * s.flops_per_sample / 1e12;
  report.record = {{"epoch", static_cast<double>(s.loader->epoch())},
                   {"loss", mean_loss},
                   {"lr", outcome.lr},
                   {"loss_scale", outcome.loss_scale},
                   {"samples_per_s", samples_per_s},
                   {"tflops", tflops},
                   {"data_wait_fraction", wait_fraction}};
  char buf[256];
  std::snprintf(
      buf, sizeof(buf),
      "step %lld/%lld epoch %lld loss %.4f lr %.3g scale %.0f %.0f samples/s %.2f TFLOP/s",
      static_cast<long long>(s.step), static_cast<long long>(s.total_steps),
      static_cast<long long>(s.loader->epoch()), mean_loss, outcome.lr, outcome.loss_scale,
      samples_per_s, tflops);
  report.line = buf;
  if (s.peak_flops > 0) {
    const double mfu = tflops * 1e12 / s.world.size / s.peak_flops;
    report.record.emplace_back("mfu", mfu);
    std::snprintf(buf, sizeof(buf), " MFU %.1f%%", 100.0 * mfu);
    report.line += buf;
  }
  if (outcome.grad_norm >= 0) report.record.emplace_back("grad_norm", outcome.grad_norm);
  if (outcome.skipped) report.line += " (step skipped: inf/NaN gradients)";
  std::snprintf(buf, sizeof(buf), "loss %.4f %.0f samples/s", mean_loss, samples_per_s);
  report.bar_text = buf;
  return report;
}

void report_eval(Trainer::State& s, const EvalResult& ev, bool with_line) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "eval at step %lld: loss %.4f accuracy %.2f%%",
                static_cast<long long>(s.step), ev.loss, 100 * ev.accuracy);
  s.metrics->write(RecordKind::kEval, s.step, {{"loss", ev.loss}, {"accuracy", ev.accuracy}},
                   with_line ? buf : "");
}

}  // namespace

TrainResult Trainer::train() {
  State& s = *s_;
  TrainResult result;
  Context ctx = s.make_context(true);
  s.model.net->set_training(true);
  const config::TrainConfig& t = s.e.train();
  const std::int64_t log_every = std::max(1, t.log_every());
  PreemptionDeadline deadline(t.preemption_grace_s());

  s.metrics->print("training " + s.e.model().name() + " (" +
                   std::to_string(s.model.net->parameter_count()) + " parameters) on " +
                   s.device.str() + " x" + std::to_string(s.world.size) + ", batch " +
                   std::to_string(s.plan.per_gpu) + " x " + std::to_string(s.plan.accumulation) +
                   " x " + std::to_string(s.world.size) + " = " + std::to_string(s.plan.global) +
                   ", " + std::to_string(s.total_steps) + " steps");
  if (s.dp) {
    s.metrics->print("optimizer state: " + std::to_string(s.optimizer_bytes) +
                     " bytes on this rank (parallel.zero_stage " +
                     std::to_string(s.dp->zero_stage()) + ")");
  }

  ComputeStreamScope on_stream(s.graphs.get());
  Tensor loss_sum = Tensor::zeros({}, DType::F32, s.device);
  std::int64_t interval_micro = 0, interval_samples = 0;
  auto interval_start = Clock::now();
  const auto run_start = Clock::now();
  double wait_at_interval_start = s.loader->wait_time();
  std::int64_t run_samples = 0;
  std::int64_t last_checkpoint_step = -1;
  const auto checkpoint = [&] {
    result.last_checkpoint = save_checkpoint(s);
    last_checkpoint_step = s.step;
  };

  s.metrics->begin(s.step);
  while (s.step < s.total_steps) {
    s.faults.before_step(s.step);
    StepOutcome outcome = s.run_step(ctx, loss_sum, &interval_micro, &interval_samples);
    run_samples += s.plan.global;

    if (s.step % log_every == 0 || s.step == s.total_steps) {
      // Resident steps: the one wait for the device of a log interval.
      if (s.optimizer->resident()) outcome = s.resident_outcome();
      s.loss_fn.check_targets();
      double mean_loss = loss_sum.item() / std::max<std::int64_t>(interval_micro, 1);
      if (s.world.size > 1) mean_loss = s.comm->all_reduce_host(mean_loss, HostReduceOp::Average);
      if (!std::isfinite(mean_loss) && !(s.precision.policy.matmul == DType::F16)) {
        throw Error("the training loss is " + std::to_string(mean_loss) + " at step " +
                    std::to_string(s.step) + " on rank " + std::to_string(s.world.rank) +
                    ": lower optimizer.lr, or check the data");
      }
      const double elapsed = std::max(seconds_since(interval_start), 1e-9);
      const double wait = s.loader->wait_time() - wait_at_interval_start;
      result.final_loss = mean_loss;
      IntervalReport report = interval_report(
          s, outcome, mean_loss, interval_samples * s.world.size / elapsed, wait / elapsed);
      s.metrics->write(RecordKind::kTrain, s.step, std::move(report.record), report.line,
                       report.bar_text);
      loss_sum.zero();
      interval_micro = interval_samples = 0;
      interval_start = Clock::now();
      wait_at_interval_start = s.loader->wait_time();
    } else {
      s.metrics->tick(s.step);
    }

    // 0: go on, else the signal number, + kInterruptFlag where a SIGINT came: the maximum
    // over ranks stops every rank at the same step, interrupted if any rank was, and tells
    // rank 0 the signal even where only another rank received it.
    constexpr std::int64_t kInterruptFlag = 256;
    std::int64_t stop =
        stop_requested().load() ? stop_signal() + (interrupt_requested() ? kInterruptFlag : 0) : 0;
    if (s.world.size > 1) stop = s.comm->all_reduce_host(stop, HostReduceOp::Max);
    const bool interrupted = stop >= kInterruptFlag;
    // A scheduler's stop after the last step changes nothing: the run ends as it would have.
    if (stop != 0 && (interrupted || s.step < s.total_steps)) {
      result.stop_signal = static_cast<int>(stop % kInterruptFlag);
      s.metrics->print("stop requested (" + signal_name(result.stop_signal) +
                       "): checkpointing at step " + std::to_string(s.step));
      checkpoint();
      result.preempted = true;
      result.interrupted = interrupted;
      break;
    }
    const std::int64_t every = s.e.checkpoint().every_steps();
    if (every > 0 && s.step % every == 0 && s.step < s.total_steps) checkpoint();
    if (t.eval_every() > 0 && s.step % t.eval_every() == 0 && s.step < s.total_steps &&
        s.eval_set) {
      const EvalResult ev = evaluate();
      s.model.net->set_training(true);
      report_eval(s, ev, true);
    }
  }
  s.metrics->finish();
  if (s.optimizer->resident()) s.resident_outcome();
  result.steps = s.step;
  result.skipped_steps = s.skipped;
  result.samples_per_s = run_samples / std::max(seconds_since(run_start), 1e-9);
  if (!result.preempted) {
    if (last_checkpoint_step != s.step) checkpoint();
    if (s.eval_set) {
      result.eval = evaluate();
      report_eval(s, result.eval, false);
    }
  }
  deadline.finish();
  return result;
}

EvalResult Trainer::evaluate(const EvalOptions& options) {
  State& s = *s_;
  EvalResult r;
  const bool dump = !options.dump_logits.empty() || !options.dump_inputs.empty();
  if (dump && s.world.size > 1) {
    throw InputError(
        "--dump-logits/--dump-inputs write the whole eval split from one process; "
        "run kiln eval without mpirun (" +
        std::to_string(s.world.size) + " ranks)");
  }
  if (!s.eval_set) {
    if (dump) throw InputError("--dump-logits/--dump-inputs: no eval split (data.eval_split)");
    return r;
  }
  std::vector<Tensor> dumped_logits, dumped_inputs;  // per batch, on the host
  if (s.dp) s.dp->broadcast_buffers();
  data::LoaderOptions lo = s.loader->options();
  lo.shuffle = false;
  lo.train = false;
  lo.drop_last = false;
  lo.shard_mode = data::ShardMode::kUneven;  // every sample exactly once: exact accuracy
  lo.workers = std::min(lo.workers, 2);
  data::DataLoader loader(s.eval_set, lo);
  Context ctx = s.make_context(false);
  s.model.net->set_training(false);
  SoftmaxCrossEntropy loss_fn;
  Tensor loss_total = Tensor::zeros({}, DType::F32, s.device);
  Tensor correct = Tensor::zeros({}, DType::F32, s.device);
  Tensor counted = Tensor::zeros({}, DType::F32, s.device);
  std::int64_t batches = loader.batches_per_epoch();
  if (s.e.train().eval_batches() > 0) batches = std::min(batches, s.e.train().eval_batches());
  for (std::int64_t i = 0; i < batches; ++i) {
    data::Batch batch = loader.next();
    Tensor logits = s.model.net->forward(ctx, prepare_inputs(batch.inputs, ctx.precision));
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
  if (s.world.size > 1) s.comm->all_reduce_host(sums, HostReduceOp::Sum);
  r.samples = static_cast<std::int64_t>(sums[2]);
  r.loss = sums[2] > 0 ? sums[0] / sums[2] : 0;
  r.accuracy = sums[2] > 0 ? sums[1] / sums[2] : 0;
  return r;
}

}  // namespace kiln::train
