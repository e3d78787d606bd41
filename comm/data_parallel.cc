#include "comm/data_parallel.h"

#include <algorithm>
#include <optional>
#include <sstream>

#include "core/check.h"
#include "core/ops.h"
#include "core/stream.h"

namespace kiln {
namespace {

constexpr std::size_t kOffsetAlignmentBytes = 256;

std::uint64_t fnv1a(std::uint64_t h, const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

std::uint64_t fnv1a(std::uint64_t h, const std::string& s) {
  return fnv1a(h, s.data(), s.size() + 1);  // the terminator separates names
}

std::uint64_t fnv1a(std::uint64_t h, std::int64_t v) {
  return fnv1a(h, &v, sizeof(v));
}

// rank 0's values reach every rank; a non-contiguous tensor goes through a contiguous copy.
void broadcast_tensor(Communicator& comm, Tensor& t) {
  if (t.is_contiguous()) {
    comm.broadcast(t, 0);
    return;
  }
  Tensor tmp = t.contiguous();
  comm.broadcast(tmp, 0);
  t.copy_from(tmp);
}

GradientReductionOptions reduction_options(const DataParallelOptions& o) {
  using Kind = GradientReductionOptions::Kind;
  GradientReductionOptions r;
  r.half_dtype = o.half_dtype;
  r.powersgd = o.powersgd;
  r.powersgd_start_step = o.powersgd_start_step;
  if (o.zero_stage > 0) {
    r.kind = Kind::ReduceScatter;
  } else if (o.compression == GradientCompression::Half) {
    r.kind = Kind::HalfAllReduce;
  } else if (o.compression == GradientCompression::PowerSgd) {
    r.kind = Kind::PowerSgd;
  }
  return r;
}

}  // namespace

const char* gradient_compression_name(GradientCompression c) {
  switch (c) {
    case GradientCompression::None:
      return "none";
    case GradientCompression::Half:
      return "half";
    case GradientCompression::PowerSgd:
      return "powersgd";
  }
  return "?";
}

DataParallel::DataParallel(std::vector<Parameter*> parameters, std::vector<Buffer*> buffers,
                           Communicator& comm, DataParallelOptions options)
    : comm_(comm), options_(options), params_(std::move(parameters)), buffers_(std::move(buffers)) {
  KILN_CHECK(options_.bucket_bytes > 0, "DataParallel bucket_bytes must be positive");
  KILN_CHECK(
      options_.zero_stage >= 0 && options_.zero_stage <= 3,
      "DataParallel zero_stage must be 0, 1, 2 or 3, got " + std::to_string(options_.zero_stage));
  KILN_CHECK(options_.zero_stage == 0 || options_.compression == GradientCompression::None,
             "DataParallel: gradient compression is not supported with zero_stage > 0");
  KILN_CHECK(!options_.shards_in_host_memory || options_.zero_stage == 3,
             "DataParallel: shards in host memory need zero_stage 3, got " +
                 std::to_string(options_.zero_stage));
  KILN_CHECK(!options_.accumulate_in_shards || options_.zero_stage >= 2,
             "DataParallel: accumulation in the shards needs zero_stage 2 or 3, got " +
                 std::to_string(options_.zero_stage));
  KILN_CHECK(options_.compression != GradientCompression::Half || is_half(options_.half_dtype),
             std::string("DataParallel half_dtype must be f16 or bf16, got ") +
                 dtype_name(options_.half_dtype));
  reduction_ = make_gradient_reduction(reduction_options(options_), comm_);
  const Device device = comm_.device();
  for (Parameter* p : params_) {
    KILN_CHECK(p != nullptr && p->value.defined(), "DataParallel got an undefined parameter");
    // Stage 3 takes weights from the host too: they reach the device a bucket at a time.
    const bool from_host = options_.zero_stage == 3 && p->value.device().is_cpu();
    KILN_CHECK(p->value.device() == device || from_host,
               "DataParallel on " + device.str() + ": parameter " + p->name + " is " +
                   p->value.str() + " (move the model with model.to() first)");
    KILN_CHECK(is_floating(p->value.dtype()), "parameter " + p->name + " is not floating point");
  }
  for (Buffer* b : buffers_) {
    KILN_CHECK(b != nullptr && b->value.device() == device, "DataParallel on " + device.str() +
                                                                ": buffer " + (b ? b->name : "?") +
                                                                " is on another device");
  }

  // Layout: reverse registration order, one open bucket per dtype.
  std::uint64_t hash = 14695981039346656037ull;
  hash = fnv1a(hash, static_cast<std::int64_t>(options_.bucket_bytes));
  hash = fnv1a(hash, static_cast<std::int64_t>(options_.compression));
  if (options_.compression == GradientCompression::PowerSgd) {
    hash = fnv1a(hash, static_cast<std::int64_t>(options_.powersgd.rank));
    hash = fnv1a(hash, options_.powersgd_start_step);
  }
  hash = fnv1a(hash, static_cast<std::int64_t>(options_.first_bucket_bytes));
  const std::size_t first_bucket_bytes =
      options_.first_bucket_bytes > 0 ? options_.first_bucket_bytes : options_.bucket_bytes;
  hash = fnv1a(hash, static_cast<std::int64_t>(options_.zero_stage));
  // Stage 3: each parameter's unit (-1: none); a bucket holds one unit's parameters.
  std::unordered_map<const Parameter*, std::int64_t> unit_of;
  if (options_.zero_stage == 3) {
    for (std::size_t u = 0; u < options_.units.size(); ++u) {
      for (const Parameter* p : options_.units[u]) unit_of.emplace(p, static_cast<std::int64_t>(u));
    }
  }
  std::unordered_map<int, std::size_t> open;  // dtype -> bucket index
  std::vector<std::int64_t> fill;             // elements used per bucket
  std::vector<std::int64_t> bucket_unit;      // stage 3: per bucket
  for (auto it = params_.rbegin(); it != params_.rend(); ++it) {
    Parameter* p = *it;
    KILN_CHECK(slots_.count(p) == 0, "parameter " + p->name + " passed to DataParallel twice");
    const DType dtype = p->grad.defined() ? p->grad.dtype() : p->value.dtype();
    const std::int64_t align = static_cast<std::int64_t>(kOffsetAlignmentBytes / dtype_size(dtype));
    const std::int64_t n = p->value.numel();
    const std::int64_t padded = (n + align - 1) / align * align;
    const int key = static_cast<int>(dtype);
    const auto unit_it = unit_of.find(p);
    const std::int64_t unit = unit_it == unit_of.end() ? -1 : unit_it->second;
    auto found = open.find(key);
    if (found == open.end() || bucket_unit[found->second] != unit ||
        static_cast<std::size_t>(fill[found->second] + padded) * dtype_size(dtype) >
            (found->second == 0 ? first_bucket_bytes : options_.bucket_bytes)) {
      Bucket b;
      b.dtype = dtype;
      buckets_.push_back(std::move(b));
      fill.push_back(0);
      bucket_unit.push_back(unit);
      open[key] = buckets_.size() - 1;
      found = open.find(key);
    }
    const std::size_t bi = found->second;
    buckets_[bi].params.push_back(p);
    buckets_[bi].offsets.push_back(fill[bi]);
    slots_[p] = Slot{bi, ready_.size()};
    ready_.push_back(0);
    fill[bi] += padded;
    hash = fnv1a(hash, p->name);
    hash = fnv1a(hash, static_cast<std::int64_t>(dtype));
    for (std::int64_t s : p->value.shape()) hash = fnv1a(hash, s);
    hash = fnv1a(hash, static_cast<std::int64_t>(bi));
    hash = fnv1a(hash, unit);
  }
  layout_hash_ = hash;
  comm_.check_same_on_all_ranks(layout_hash_,
                                "the DataParallel gradient bucket layout (parameter names, "
                                "shapes, dtypes and bucket size)");

  // Flat buffers; each gradient becomes a view into its bucket, keeping its current values.
  const std::int64_t ranks = comm_.size();
  for (std::size_t bi = 0; bi < buckets_.size(); ++bi) {
    Bucket& b = buckets_[bi];
    // ZeRO: every rank's shard of the bucket has the same length (padding at the end).
    if (options_.zero_stage > 0) fill[bi] = (fill[bi] + ranks - 1) / ranks * ranks;
    b.numel = fill[bi];
    if (options_.zero_stage == 3) {
      // Allocated as backward reaches the bucket (zero_grad_lazily): a rank never holds every
      // gradient at once, not even at start.
      release_gradients(b);
    } else {
      b.flat = Tensor::zeros({fill[bi]}, b.dtype, device);
      for (std::size_t i = 0; i < b.params.size(); ++i) {
        Parameter* p = b.params[i];
        if (p->grad.defined()) {
          KILN_CHECK(
              p->grad.shape() == p->value.shape(),
              "parameter " + p->name + ": grad " + p->grad.str() + " for value " + p->value.str());
          const std::int64_t n = p->value.numel();
          b.flat.slice(0, b.offsets[i], b.offsets[i] + n).view(p->value.shape()).copy_from(p->grad);
        }
      }
      bind_gradients(b);
    }
    if (options_.zero_stage > 0) {
      const std::int64_t shard = fill[bi] / ranks;
      const std::int64_t begin = shard * comm_.rank(), end = begin + shard;
      auto shard_tensor = [&] {
        return options_.shards_in_host_memory
                   ? Tensor::zeros_in_host_memory({shard}, b.dtype, device)
                   : Tensor::zeros({shard}, b.dtype, device);
      };
      b.shard = shard_tensor();
      if (options_.zero_stage == 3) b.value_shard = shard_tensor();
      for (std::size_t i = 0; i < b.params.size(); ++i) {
        const std::int64_t lo = std::max(begin, b.offsets[i]);
        const std::int64_t hi = std::min(end, b.offsets[i] + b.params[i]->value.numel());
        if (lo >= hi) continue;
        ShardPiece piece;
        piece.parameter = b.params[i];
        piece.offset = lo - b.offsets[i];
        piece.numel = hi - lo;
        piece.grad = b.shard.slice(0, lo - begin, hi - begin);
        piece.bucket = bi;
        piece.shard_offset = lo - begin;
        if (options_.zero_stage == 3) piece.value = b.value_shard.slice(0, lo - begin, hi - begin);
        pieces_.push_back(std::move(piece));
      }
    }
    std::vector<Tensor> grads;
    for (const Parameter* p : b.params) grads.push_back(p->grad);
    reduction_->add_bucket(bi, b.dtype, b.numel, grads);
  }
  reset_step();

  if (options_.broadcast_at_start) {
    if (options_.zero_stage != 3) broadcast_parameters();
    broadcast_buffers();
  }
  if (options_.zero_stage == 3) {
    // From here on each rank keeps only its shard of the weights: each bucket's whole values are
    // built on the device (rank 0's), sharded and dropped before the next, so the whole model is
    // never on the device at once.
    for (Bucket& b : buckets_) {
      b.values = Tensor::zeros({b.numel}, b.dtype, device);
      for (std::size_t i = 0; i < b.params.size(); ++i) {
        Parameter* p = b.params[i];
        b.values.slice(0, b.offsets[i], b.offsets[i] + p->value.numel())
            .view(p->value.shape())
            .copy_from(p->value);
      }
      if (options_.broadcast_at_start) comm_.broadcast(b.values, 0);
      shard_values(b);
      unbind_values(b);
    }
  }
}

std::function<void(Parameter&)> DataParallel::grad_ready_hook() {
  return [this](Parameter& p) { on_grad_ready(p); };
}

void DataParallel::on_grad_ready(Parameter& p) {
  if (micro_step_ && !options_.accumulate_in_shards) return;
  auto found = slots_.find(&p);
  if (found == slots_.end()) return;  // not data-parallel (e.g. frozen): nothing to reduce
  const Slot slot = found->second;
  Bucket& bucket = buckets_[slot.bucket];
  KILN_CHECK(p.grad.storage() == bucket.flat.storage(),
             "the gradient of " + p.name +
                 " was replaced after DataParallel was built (move the model and allocate its "
                 "gradients before constructing DataParallel)");
  if (ready_[slot.index]) {
    KILN_CHECK(!bucket.launched,
               "the gradient of " + p.name +
                   " was reported ready twice in one step, after its bucket's all-reduce had "
                   "started: a parameter used by several layers must be owned by the layer "
                   "whose backward runs last");
    return;
  }
  ready_[slot.index] = 1;
  if (--bucket.pending == 0) launch_ready_buckets();
}

void DataParallel::launch_ready_buckets() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    launch(buckets_[next_launch_++]);
  }
}

void DataParallel::mark(TimePoint& point, void* stream) {
  if (comm_.device().is_cuda()) {
    if (!point.event) point.event = std::make_unique<Event>(comm_.device(), true);
    point.event->record(stream);
  } else {
    point.host = std::chrono::steady_clock::now();
  }
}

void DataParallel::set_timing(bool on) {
  timing_ = on;
}

CommStepTiming DataParallel::step_timing(
    const Event* reference, std::chrono::steady_clock::time_point host_reference) const {
  KILN_CHECK(timing_, "DataParallel::step_timing needs set_timing(true) before the step");
  const bool cuda = comm_.device().is_cuda();
  KILN_CHECK(!cuda || reference != nullptr, "DataParallel::step_timing on CUDA needs an event");
  KILN_CHECK(cuda ? reduced_.event != nullptr : reduced_.host != decltype(reduced_.host){},
             "DataParallel::step_timing before any step finished");
  if (cuda) reduced_.event->synchronize();
  auto ms = [&](const TimePoint& p) {
    if (cuda) return static_cast<double>(reference->elapsed_ms(*p.event));
    return std::chrono::duration<double, std::milli>(p.host - host_reference).count();
  };
  CommStepTiming t;
  t.backward_end_ms = ms(backward_end_);
  t.reduced_ms = ms(reduced_);
  t.exposed_ms = t.reduced_ms - t.backward_end_ms;
  for (const Bucket& b : buckets_) {
    BucketTiming bt{ms(b.ready), ms(b.start), ms(b.end)};
    if (!cuda && bt.end_ms <= t.backward_end_ms) t.exposed_ms += bt.end_ms - bt.start_ms;
    t.buckets.push_back(bt);
  }
  return t;
}

void DataParallel::launch(Bucket& bucket) {
  if (timing_) mark(bucket.ready, current_stream(comm_.device()));
  if (options_.zero_stage > 0) allocate_gradients(bucket);  // stage 2: no backward wrote it
  // Shards in host memory, or a micro-step's sum to add: the collective writes a device copy,
  // copied out or added after it.
  Tensor reduced = bucket.shard;
  const bool adds = shards_hold_partial_sums_;
  if (options_.shards_in_host_memory || adds) {
    bucket.staged_shard = Tensor::empty(bucket.shard.shape(), bucket.dtype, comm_.device());
    reduced = bucket.staged_shard;
  }
  // The bucket's gradients were written on the compute stream: the comm stream waits for them.
  comm_.comm_stream_wait_for_current();
  if (timing_) mark(bucket.start, comm_.comm_stream());
  reduction_->reduce(static_cast<std::size_t>(&bucket - buckets_.data()), bucket.flat, reduced,
                     finished_steps_);
  if (options_.shards_in_host_memory || adds) {
    std::optional<StreamGuard> on_comm;
    if (comm_.comm_stream() != nullptr) on_comm.emplace(comm_.device(), comm_.comm_stream());
    if (adds) {
      ops::accumulate(bucket.shard, reduced);
    } else {
      bucket.shard.copy_from(reduced);
    }
  }
  if (timing_) mark(bucket.end, comm_.comm_stream());
  if (options_.zero_stage >= 2) release_after_reduction(bucket);
  bucket.launched = true;
  ++bucket_all_reduces_;
}

void DataParallel::release_after_reduction(Bucket& bucket) {
  // Collectives that block the caller have read the bucket: it goes at once.
  if (comm_.comm_stream() == nullptr) return release_gradients(bucket);
  // On a communication stream the previous bucket goes now: the compute stream waits for its
  // reduce-scatter (queued a bucket ago, most likely done), so the allocator hands its memory
  // out again only after the read. A rank holds about two full buckets at a time.
  if (releasing_ != nullptr) {
    releasing_->reduced->wait_on(current_stream(comm_.device()));
    release_gradients(*releasing_);
  }
  if (!bucket.reduced) bucket.reduced = std::make_unique<Event>(comm_.device());
  bucket.reduced->record(comm_.comm_stream());
  releasing_ = &bucket;
}

void DataParallel::reduce_remaining() {
  // Buckets whose hook never fired (unused parameters, or no hook installed) are reduced now,
  // in bucket order, so every rank issues the same collectives.
  for (Bucket& b : buckets_) b.pending = 0;
  launch_ready_buckets();
  comm_.current_stream_wait_for_comm();
}

void DataParallel::end_micro_step() {
  if (!micro_step_ || !options_.accumulate_in_shards) return;
  reduce_remaining();
  reset_step();
  for (Bucket& b : buckets_) release_gradients(b);
  shards_hold_partial_sums_ = true;
}

void DataParallel::finish() {
  if (micro_step_) return;
  if (timing_) mark(backward_end_, current_stream(comm_.device()));
  reduce_remaining();
  if (timing_) mark(reduced_, current_stream(comm_.device()));
  reset_step();
  shards_hold_partial_sums_ = false;
  ++finished_steps_;
  // Stage 2: the full buffers are released once the compute stream has waited for their
  // reduce-scatters, so a stream-ordered allocator reuses them only after the reads.
  if (options_.zero_stage >= 2) {
    for (Bucket& b : buckets_) release_gradients(b);
  }
  // Stage 3: prefetched weights nobody used go before the update makes them stale; the compute
  // stream waits for their gather first, so their memory is reused only after it.
  for (Bucket& b : buckets_) {
    if (!b.prefetched) continue;
    if (b.gathered) b.gathered->wait_on(current_stream(comm_.device()));
    b.prefetched = false;
    b.values = Tensor();
    b.staged_values = Tensor();
  }
}

void DataParallel::allocate_gradients(Bucket& b) {
  if (b.flat.defined()) return;
  b.flat = Tensor::zeros({b.numel}, b.dtype, comm_.device());
  bind_gradients(b);
}

void DataParallel::release_gradients(Bucket& b) {
  b.flat = Tensor();
  b.staged_shard = Tensor();
  for (Parameter* p : b.params) p->grad = Tensor();
}

void DataParallel::zero_grad_lazily() {
  if (options_.zero_stage < 2) return zero_grad();
  for (Bucket& b : buckets_) {
    if (b.flat.defined()) b.flat.zero();
  }
}

std::function<void(const std::vector<Parameter*>&)> DataParallel::gradient_allocation_hook() {
  if (options_.zero_stage < 2) return {};
  return [this](const std::vector<Parameter*>& written) {
    for (Parameter* p : written) {
      auto it = slots_.find(p);
      if (it != slots_.end()) allocate_gradients(buckets_[it->second.bucket]);
    }
  };
}

void DataParallel::bind_gradients(Bucket& b) {
  for (std::size_t i = 0; i < b.params.size(); ++i) {
    Parameter* p = b.params[i];
    const std::int64_t n = p->value.numel();
    p->grad = b.flat.slice(0, b.offsets[i], b.offsets[i] + n).view(p->value.shape());
  }
}

std::vector<std::size_t> DataParallel::buckets_of(const std::vector<Parameter*>& parameters) const {
  std::vector<std::size_t> out;
  for (Parameter* p : parameters) {
    auto it = slots_.find(p);
    if (it == slots_.end()) continue;  // not data-parallel (frozen): whole on every rank
    if (std::find(out.begin(), out.end(), it->second.bucket) == out.end())
      out.push_back(it->second.bucket);
  }
  return out;
}

void DataParallel::acquire_values(const std::vector<Parameter*>& parameters) {
  if (options_.zero_stage != 3) return;
  for (std::size_t bi : buckets_of(parameters)) {
    Bucket& b = buckets_[bi];
    if (b.holders++ > 0) continue;
    if (!b.prefetched) {
      gather_values(b);
      continue;
    }
    if (b.gathered) b.gathered->wait_on(current_stream(comm_.device()));
    b.prefetched = false;
    b.staged_values = Tensor();
    bind_values(b);
  }
}

void DataParallel::prefetch_values(const std::vector<Parameter*>& parameters) {
  if (options_.zero_stage != 3) return;
  for (std::size_t bi : buckets_of(parameters)) {
    Bucket& b = buckets_[bi];
    if (b.holders > 0 || b.prefetched) continue;
    // Allocated on the compute stream, which the communication stream waits for: the memory
    // (and the shard the optimizer wrote) is ready before the gather writes it.
    b.values = Tensor::empty({b.numel}, b.dtype, comm_.device());
    all_gather_values(b, true);
    if (comm_.comm_stream() != nullptr) {
      if (!b.gathered) b.gathered = std::make_unique<Event>(comm_.device());
      b.gathered->record(comm_.comm_stream());
    }
    b.prefetched = true;
  }
}

void DataParallel::release_values(const std::vector<Parameter*>& parameters, bool written) {
  if (options_.zero_stage != 3) return;
  for (std::size_t bi : buckets_of(parameters)) {
    Bucket& b = buckets_[bi];
    KILN_CHECK(b.holders > 0, "ZeRO-3: the values of " + b.params.front()->name +
                                  " were released more often than acquired");
    if (written) shard_values(b);
    if (--b.holders == 0) unbind_values(b);
  }
}

void DataParallel::gather_values(Bucket& b) {
  // Allocated on the compute stream, which the gather is ordered with: a released buffer is
  // reused only after the kernels that read it.
  b.values = Tensor::empty({b.numel}, b.dtype, comm_.device());
  all_gather_values(b, false);
  bind_values(b);
}

void DataParallel::all_gather_values(Bucket& b, bool on_comm_stream) {
  ++value_gathers_;
  // Shards in host memory: one rank's gather is the copy in; more ranks copy into device memory
  // first (allocated here, on the compute stream), since NCCL does not promise to read host memory.
  const bool staged = options_.shards_in_host_memory && comm_.size() > 1;
  if (staged) b.staged_values = Tensor::empty(b.value_shard.shape(), b.dtype, comm_.device());
  if (on_comm_stream) comm_.comm_stream_wait_for_current();
  std::optional<StreamGuard> on_comm;
  if (on_comm_stream && comm_.comm_stream() != nullptr) {
    on_comm.emplace(comm_.device(), comm_.comm_stream());
  }
  if (options_.shards_in_host_memory && !staged) return b.values.copy_from(b.value_shard);
  if (staged) b.staged_values.copy_from(b.value_shard);
  const Tensor& shard = staged ? b.staged_values : b.value_shard;
  if (on_comm_stream) return comm_.all_gather_on_comm_stream(shard, b.values);
  comm_.all_gather(shard, b.values);
  b.staged_values = Tensor();  // the current stream waits for the gather: the copy may go
}

void DataParallel::bind_values(Bucket& b) {
  for (std::size_t i = 0; i < b.params.size(); ++i) {
    Parameter* p = b.params[i];
    p->value =
        b.values.slice(0, b.offsets[i], b.offsets[i] + p->value.numel()).view(p->value.shape());
  }
}

void DataParallel::shard_values(Bucket& b) {
  const std::int64_t shard = b.value_shard.numel();
  b.value_shard.copy_from(b.values.slice(0, shard * comm_.rank(), shard * (comm_.rank() + 1)));
}

void DataParallel::unbind_values(Bucket& b) {
  b.values = Tensor();
  // Shape, dtype and device stay readable; the data pointer is null until the next gather.
  for (Parameter* p : b.params) {
    p->value = Tensor::wrap(nullptr, p->value.shape(), p->value.dtype(), comm_.device());
  }
}

std::size_t DataParallel::value_buffer_bytes() const {
  std::size_t bytes = 0;
  for (const Bucket& b : buckets_) {
    if (b.values.defined()) bytes += b.values.nbytes();
    if (b.value_shard.defined()) bytes += b.value_shard.nbytes();
  }
  return bytes;
}

void DataParallel::gather_parameters() {
  if (options_.zero_stage == 3) {
    // The shards were updated in place; buckets not held are gathered when next acquired.
    for (Bucket& b : buckets_) {
      if (b.holders == 0) continue;
      all_gather_values(b, false);
    }
    return;
  }
  const std::int64_t ranks = comm_.size();
  for (std::size_t bi = 0; bi < buckets_.size(); ++bi) {
    Bucket& b = buckets_[bi];
    const std::int64_t shard = b.shard.numel();
    const DType dtype = b.params.front()->value.dtype();
    Tensor mine = Tensor::zeros({shard}, dtype, comm_.device());
    for (const ShardPiece& piece : pieces_) {
      if (piece.bucket != bi) continue;
      mine.slice(0, piece.shard_offset, piece.shard_offset + piece.numel)
          .copy_from(piece.parameter->value.view({piece.parameter->value.numel()})
                         .slice(0, piece.offset, piece.offset + piece.numel));
    }
    Tensor all = Tensor::empty({shard * ranks}, dtype, comm_.device());
    comm_.all_gather(mine, all);
    for (std::size_t i = 0; i < b.params.size(); ++i) {
      Parameter* p = b.params[i];
      const std::int64_t n = p->value.numel();
      p->value.copy_from(all.slice(0, b.offsets[i], b.offsets[i] + n).view(p->value.shape()));
    }
  }
}

std::size_t DataParallel::gradient_buffer_bytes() const {
  std::size_t bytes = 0;
  for (const Bucket& b : buckets_) {
    if (b.flat.defined()) bytes += b.flat.nbytes();
    if (b.shard.defined()) bytes += b.shard.nbytes();
  }
  return bytes;
}

void DataParallel::reset_compression_state() {
  reduction_->reset();
}

NamedTensors DataParallel::compression_state() const {
  return reduction_->state();
}

void DataParallel::load_compression_state(const NamedTensors& state, const std::string& where) {
  reduction_->load_state(state, where);
}

void DataParallel::reset_step() {
  for (Bucket& b : buckets_) {
    b.pending = static_cast<int>(b.params.size());
    b.launched = false;
  }
  std::fill(ready_.begin(), ready_.end(), 0);
  next_launch_ = 0;
  releasing_ = nullptr;  // finish() released it with the rest
}

void DataParallel::set_accumulation_micro_step(bool micro_step) {
  micro_step_ = micro_step;
}

void DataParallel::zero_grad() {
  for (Bucket& b : buckets_) {
    if (b.flat.defined()) {
      b.flat.zero();
    } else {  // stage 2 released it after the last step
      allocate_gradients(b);
    }
  }
}

void DataParallel::broadcast_parameters() {
  for (Parameter* p : params_) broadcast_tensor(comm_, p->value);
}

void DataParallel::broadcast_buffers() {
  for (Buffer* b : buffers_) broadcast_tensor(comm_, b->value);
}

std::vector<GradientBucketInfo> DataParallel::bucket_layout() const {
  std::vector<GradientBucketInfo> out;
  for (const Bucket& b : buckets_) {
    GradientBucketInfo info;
    info.dtype = b.dtype;
    info.numel = b.numel;
    for (const Parameter* p : b.params) info.parameter_names.push_back(p->name);
    out.push_back(std::move(info));
  }
  return out;
}

std::string DataParallel::layout_summary() const {
  std::ostringstream os;
  for (std::size_t i = 0; i < buckets_.size(); ++i) {
    const Bucket& b = buckets_[i];
    os << "bucket " << i << ": " << dtype_name(b.dtype) << ", "
       << format_bytes(static_cast<std::size_t>(b.numel) * dtype_size(b.dtype)) << ", "
       << b.params.size() << " parameters (" << b.params.front()->name << " .. "
       << b.params.back()->name << ")\n";
  }
  return os.str();
}

}  // namespace kiln
