#include "train/checkpointer.h"

#include <algorithm>

#include "configs/experiment.h"
#include "core/system_info.h"
#include "train/parameter_loader.h"

namespace kiln::train {

bool checkpoint_due(const CheckpointerOptions& options, std::int64_t step) {
  return options.every_steps > 0 && step % options.every_steps == 0 && step < options.total_steps;
}

std::string choose_resume(const CheckpointerOptions& options,
                          const std::optional<std::string>& latest,
                          const std::vector<std::string>& skipped, std::string* note) {
  if (options.resume != "latest") return options.resume;
  const std::string option =
      options.resume_from_command_line ? options.resume_flag : std::string("checkpoint.resume");
  if (latest) {
    if (!skipped.empty()) {
      *note = CheckpointStore::skipped_note(option, options.dir, skipped) + "; resuming from " +
              *latest;
    }
    return *latest;
  }
  if (!skipped.empty()) {
    throw InputError(option + " latest: no complete checkpoint in " + options.dir + ", only " +
                     CheckpointStore::skipped_list(skipped) +
                     ". Restore their MANIFEST (copy the whole directory again), resume from one "
                     "explicitly with --resume DIR after checking it, or move them away to start "
                     "fresh");
  }
  if (options.init_from_fallback) {
    if (!options.init_from.empty()) {
      *note =
          "no checkpoint in " + options.dir + ": evaluating model.init_from " + options.init_from;
      return "";
    }
    throw InputError("no weights to evaluate: no complete checkpoint in " + options.dir +
                     " (checkpoint.dir) and no model.init_from; train first, name a checkpoint "
                     "with --checkpoint DIR, or --set model.init_from=FILE.safetensors");
  }
  if (options.resume_from_command_line) {
    throw InputError(
        options.resume_flag + " latest: no complete checkpoint in " + options.dir +
        " (checkpoint.dir); " +
        (options.evaluate_only
             ? "train first, or name a checkpoint directory with " + options.resume_flag + " DIR"
             : "start without " + options.resume_flag + ", or point it at a checkpoint"));
  }
  // checkpoint.resume "latest" in a config: a job's first run starts fresh, its requeued runs
  // continue from their checkpoints.
  *note = "checkpoint.resume latest: no checkpoint in " + options.dir + " yet; starting fresh";
  return "";
}

Checkpointer::Checkpointer(CheckpointerOptions options, Parts parts)
    : options_(std::move(options)), p_(parts), store_(options_.dir, options_.keep_last) {}

void Checkpointer::resume() {
  std::optional<std::string> latest;
  std::vector<std::string> skipped;
  if (options_.resume == "latest") {
    if (p_.world.rank == 0) store_.remove_partial();
    p_.comm.barrier();  // no rank looks for the latest while rank 0 still removes partial ones
    latest = store_.latest();
    skipped = store_.unmanifested();
  }
  std::string note;
  const std::string path = choose_resume(options_, latest, skipped, &note);
  if (!note.empty()) p_.metrics.print(note);
  if (!path.empty()) restore(path);
}

std::string Checkpointer::maybe_save(bool last) {
  const std::int64_t step = p_.counters.step;
  if (last ? last_saved_step_ == step : !checkpoint_due(options_, step)) return "";
  return save();
}

// Verified before step 1; a checkpoint of another model or batch layout is refused.
void Checkpointer::restore(const std::string& path) {
  const config::Experiment& e = p_.experiment;
  Checkpoint c;
  {
    // ZeRO-3: the weights are loaded whole and kept as each rank's shards, before the
    // optimizer's state (whose update rounds its masters into those shards) is loaded.
    WholeWeights loading(p_.sync, /*written=*/true);
    c = load_model_checkpoint(path, e.model().name(), p_.net);
  }
  restored_from_ = path;
  const config::CheckpointState& st = c.state;
  if (!options_.evaluate_only) check_resumable(path, st);
  // One whole optimizer file, or the shards of a ZeRO run on any number of ranks (resharded).
  std::vector<const SafetensorsFile*> optimizer_files;
  if (c.optimizer_shards.empty()) optimizer_files.push_back(&c.optimizer);
  for (const SafetensorsFile& f : c.optimizer_shards) optimizer_files.push_back(&f);
  p_.optimizer.load_state(optimizer_files, path);
  p_.optimizer.load_scaler_state(st.loss_scaler());
  const int world_size = p_.world.size;
  const bool resized = st.world_size() != world_size;
  data::LoaderState ls;
  ls.seed = st.data().seed();
  ls.epoch = st.data().epoch();
  ls.next_batch = st.data().next_batch();
  ls.batches_per_epoch = st.data().batches_per_epoch();
  ls.samples_per_batch = st.data().samples_per_batch();
  ls.dataset_size = st.data().dataset_size();
  if (!options_.evaluate_only) {
    try {
      p_.loader.restore(ls);
    } catch (const InputError& e) {
      throw InputError(path + "/state.pbtxt: " + e.what());
    }
  }
  p_.counters.step = st.step();
  p_.counters.micro_step = st.micro_step();
  // Dropout is keyed by the micro-step: on another world size (another accumulation) it counts on
  // as a run of this size would have counted.
  if (resized) p_.counters.micro_step = st.step() * accumulation();
  p_.counters.skipped = st.loss_scaler().skipped_steps();
  if (world_size > 1 && !options_.evaluate_only) restore_reducer_state(c);
  p_.metrics.print("resumed from " + path + " at step " + std::to_string(p_.counters.step) + " (" +
                   (options_.evaluate_only ? ls : p_.loader.state()).str() + ")" +
                   (resized && !options_.evaluate_only
                        ? ", written by " + std::to_string(st.world_size()) + " rank(s), now " +
                              std::to_string(world_size) + ": the same global order and sample"
                        : ""));
}

int Checkpointer::accumulation() const {
  const std::int64_t per_step = p_.loader.options().batch_size * p_.world.size;
  return static_cast<int>(std::max<std::int64_t>(1, p_.global_batch / per_step));
}

// The data position and the optimizer's steps count in global batches: a checkpoint resumes on any
// world size with the same train.global_batch, and is refused with another.
void Checkpointer::check_resumable(const std::string& path, const config::CheckpointState& st) {
  const std::int64_t written = st.global_batch() > 0 ? st.global_batch()
                               : st.step() > 0       ? st.samples_seen() / st.step()
                                                     : 0;
  const int world_size = p_.world.size;
  if (written > 0 && written != p_.global_batch) {
    throw InputError(
        path + "/state.pbtxt: written with train.global_batch " + std::to_string(written) + " (" +
        std::to_string(st.world_size()) + " rank(s)); this run's is " +
        std::to_string(p_.global_batch) + " (" + std::to_string(p_.loader.options().batch_size) +
        " per rank x " + std::to_string(accumulation()) + " accumulation x " +
        std::to_string(world_size) +
        " rank(s)): a resumed run keeps the global batch (the data "
        "position, the schedule and the optimizer's steps count in it); resume with --set "
        "train.global_batch=" +
        std::to_string(written) + " and a train.batch_per_gpu that divides it by " +
        std::to_string(world_size));
  }
  if (st.world_size() == world_size) return;
  const std::string written_by = path + "/state.pbtxt: written by " +
                                 std::to_string(st.world_size()) + " rank(s), this run has " +
                                 std::to_string(world_size) + "; ";
  const std::int64_t per_batch = p_.loader.options().batch_size * world_size;
  const config::DataPosition& d = st.data();
  if (d.samples_per_batch() == 0) {
    throw InputError(written_by +
                     "the checkpoint is older than data positions in global samples: resume it "
                     "on " +
                     std::to_string(st.world_size()) + " rank(s)");
  }
  const std::int64_t sample = d.next_batch() * d.samples_per_batch();
  if (sample % per_batch != 0) {
    // The writer's step straddled an epoch's end, so the new epoch began inside one of its steps.
    throw InputError(written_by + "its data position, sample " + std::to_string(sample) +
                     " of epoch " + std::to_string(d.epoch()) + ", lies inside a batch of " +
                     std::to_string(p_.loader.options().batch_size) + " x " +
                     std::to_string(world_size) + " ranks = " + std::to_string(per_batch) +
                     " samples (an epoch ended inside one of the writer's steps): resume on " +
                     std::to_string(st.world_size()) +
                     " rank(s), or on a world size whose batch_per_gpu x ranks divides " +
                     std::to_string(sample));
  }
}

// The step count PowerSGD starts by, and this rank's error feedback and Q. A checkpoint without
// them (written before the run compressed, or by an uncompressed run) starts them afresh.
void Checkpointer::restore_reducer_state(const Checkpoint& c) {
  p_.sync.set_finished_steps(c.state.step());
  if (p_.sync.state().empty()) return;
  if (!c.compression) {
    if (c.state.step() > options_.powersgd_start_step) {
      p_.metrics.print("checkpoint " + c.path +
                       " holds no PowerSGD state: error feedback starts from zero");
    }
    return;
  }
  if (c.state.world_size() != p_.world.size) {
    // Error feedback and Q belong to a rank's share of the batch: they cannot move to another
    // world size. As PyTorch's PowerSGD hook without its state, they start afresh.
    p_.metrics.print("warning: " + c.path +
                     "/compression.safetensors holds the PowerSGD state "
                     "(parallel.compression POWERSGD) of " +
                     std::to_string(c.state.world_size()) + " rank(s); it cannot move to " +
                     std::to_string(p_.world.size) +
                     ": error feedback starts from zero and Q is drawn afresh");
    return;
  }
  const std::string prefix = "rank" + std::to_string(p_.world.rank) + ".";
  NamedTensors mine;
  for (const auto& [name, t] : c.compression->tensors) {
    if (name.rfind(prefix, 0) == 0) mine.emplace_back(name.substr(prefix.size()), t);
  }
  p_.sync.load_state(mine, c.path + "/compression.safetensors");
}

// Every rank's reducer state (error feedback differs between ranks), gathered to host tensors
// named "rank<r>.<name>" on rank 0 (empty elsewhere, and without PowerSGD). Collective.
NamedTensors Checkpointer::gather_reducer_state() {
  NamedTensors gathered;
  const int ranks = p_.world.size;
  for (const auto& [name, t] : p_.sync.state()) {
    Tensor all = Tensor::empty({ranks * t.numel()}, t.dtype(), t.device());
    p_.comm.all_gather(t, all);
    if (p_.world.rank != 0) continue;
    Tensor host = all.to(Device::cpu());
    for (int r = 0; r < ranks; ++r) {
      gathered.emplace_back("rank" + std::to_string(r) + "." + name,
                            host.slice(0, r * t.numel(), (r + 1) * t.numel()).clone());
    }
  }
  return gathered;
}

config::CheckpointState Checkpointer::state_record(const data::LoaderState* position) {
  const config::Experiment& e = p_.experiment;
  const StepCounters& n = p_.counters;
  config::CheckpointState st;
  st.set_step(n.step);
  st.set_micro_step(n.micro_step);
  st.set_samples_seen(n.step * p_.global_batch);
  const data::LoaderState ls = position != nullptr ? *position : p_.loader.state();
  st.mutable_data()->set_seed(ls.seed);
  st.mutable_data()->set_epoch(ls.epoch);
  st.mutable_data()->set_next_batch(ls.next_batch);
  st.mutable_data()->set_batches_per_epoch(ls.batches_per_epoch);
  st.mutable_data()->set_samples_per_batch(ls.samples_per_batch);
  st.mutable_data()->set_dataset_size(ls.dataset_size);
  st.set_global_batch(p_.global_batch);
  *st.mutable_loss_scaler() = p_.optimizer.scaler_state();
  st.mutable_loss_scaler()->set_skipped_steps(n.skipped);
  st.set_seed(e.train().seed());
  st.set_world_size(p_.world.size);
  st.set_model_name(e.model().name());
  st.set_kiln_version(kiln_version());
  st.set_experiment_hash(config::experiment_hash(e));
  *st.mutable_experiment() = e;
  return st;
}

std::string Checkpointer::save(const data::LoaderState* position) {
  // Resident steps: the scaler and step count, to the host.
  if (p_.optimizer.resident()) p_.optimizer.report(&p_.counters.skipped);
  p_.sync.broadcast_buffers();
  const config::CheckpointState st = state_record(position);
  const std::int64_t step = p_.counters.step;
  const bool rank0 = p_.world.rank == 0;
  NamedTensors model;
  const NamedTensors reducer = gather_reducer_state();
  {
    WholeWeights saving(p_.sync, /*written=*/false);
    if (rank0) {
      // The tensors keep ZeRO-3's gathered buckets alive after the release, until saved.
      for (Parameter* p : p_.net.parameters()) model.emplace_back(p->name, stored_layout(*p));
      for (Buffer* b : p_.net.buffers()) model.emplace_back(b->name, b->value);
    }
  }
  if (p_.optimizer.sharded()) {
    // Every rank writes its optimizer shard into rank 0's staging directory; rank 0 completes it.
    if (rank0) store_.prepare_staging(step);
    p_.comm.barrier();
    const std::string shard = optimizer_shard_name(p_.world.rank, p_.world.size);
    auto metadata = p_.optimizer.shard_metadata();
    metadata["format"] = "kiln";
    save_safetensors(store_.staging_dir(step) + "/" + shard, p_.optimizer.state(), metadata);
    p_.comm.barrier();
    if (rank0) {
      std::vector<std::string> shards;
      for (int r = 0; r < p_.world.size; ++r)
        shards.push_back(optimizer_shard_name(r, p_.world.size));
      p_.metrics.print("checkpoint " + store_.save_sharded(model, shards, st, reducer));
    }
  } else if (rank0) {
    p_.metrics.print("checkpoint " + store_.save(model, p_.optimizer.state(), st, reducer));
  }
  p_.comm.barrier();  // nobody moves on (or exits) before the checkpoint is complete
  last_saved_step_ = step;
  last_saved_ = store_.dir() + "/" + checkpoint_name(step);
  return last_saved_;
}

}  // namespace kiln::train
