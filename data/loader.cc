#include "data/loader.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "core/allocator.h"
#include "core/check.h"

namespace kiln::data {

std::int64_t LoaderState::epoch_sample() const {
  return samples_per_batch > 0 ? next_batch * samples_per_batch : -1;
}

std::string LoaderState::str() const {
  return "epoch " + std::to_string(epoch) + ", batch " + std::to_string(next_batch) + " of " +
         std::to_string(batches_per_epoch) +
         (samples_per_batch > 0 ? " (sample " + std::to_string(epoch_sample()) + " of the epoch)"
                                : "") +
         ", seed " + std::to_string(seed);
}

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, LoaderOptions options)
    : dataset_(std::move(dataset)), options_(std::move(options)) {
  if (!dataset_) throw InputError("DataLoader: no dataset");
  if (options_.batch_size <= 0) {
    throw InputError("batch_size must be positive, got " + std::to_string(options_.batch_size));
  }
  if (options_.workers < 0) {
    throw InputError("workers must be >= 0, got " + std::to_string(options_.workers));
  }
  // Each worker assembles whole batches: a window smaller than the worker count leaves workers
  // idle (16 workers with prefetch 2 loaded at the rate of 2).
  options_.prefetch = std::max({options_.prefetch, options_.workers, 1});
  if (options_.world_size <= 0 || options_.rank < 0 || options_.rank >= options_.world_size) {
    throw InputError("rank " + std::to_string(options_.rank) + " is outside world size " +
                     std::to_string(options_.world_size));
  }
  if (dataset_->size() <= 0) throw InputError(dataset_->describe() + " holds no samples");
  spec_ = dataset_->spec();
  if (options_.document_boundary_token &&
      (spec_.input_shape.size() != 1 ||
       (spec_.input_dtype != DType::I64 && spec_.input_dtype != DType::I32))) {
    throw InputError(
        "document boundaries (data.document_boundary_token) need token windows (T) "
        "as inputs; " +
        dataset_->describe() + " gives " + shape_str(spec_.input_shape) + " " +
        dtype_name(spec_.input_dtype));
  }
  shard_size_ =
      shard_size(dataset_->size(), options_.rank, options_.world_size, options_.shard_mode);
  batches_per_epoch_ = options_.drop_last
                           ? shard_size_ / options_.batch_size
                           : (shard_size_ + options_.batch_size - 1) / options_.batch_size;
  if (options_.shard_mode == ShardMode::kUneven && options_.drop_last) {
    throw InputError("shard mode 'uneven' reads every sample once; it cannot drop_last");
  }
  if (batches_per_epoch_ == 0) {
    throw InputError("rank " + std::to_string(options_.rank) + " reads " +
                     std::to_string(shard_size_) + " samples of " + dataset_->describe() +
                     " per epoch, less than one batch of " + std::to_string(options_.batch_size) +
                     " with drop_last");
  }
  if (options_.decode == LoaderOptions::ImageDecode::kDevice) {
    if (!dataset_->encodes_images()) {
      throw InputError("data.decode GPU: " + dataset_->describe() +
                       " has no encoded images to decode on the device (JPEG folders have)");
    }
    if (!options_.device.is_cuda()) {
      throw InputError("data.decode GPU needs a CUDA device; the loader delivers to " +
                       options_.device.str());
    }
  }
  if (dataset_->encodes_images()) image_decoding_ = "on the host (TurboJPEG)";
  if (options_.device.is_cuda()) {
#if KILN_WITH_CUDA
    copy_stream_ = Stream::create(options_.device);
    if (dataset_->encodes_images() && options_.decode != LoaderOptions::ImageDecode::kHost) {
      std::string why;
      decoder_ = make_device_image_decoder(options_.device, &why);
      if (!decoder_ && options_.decode == LoaderOptions::ImageDecode::kDevice) {
        throw InputError("data.decode GPU: " + why + " (data.decode CPU decodes on the host)");
      }
      image_decoding_ = decoder_ ? "on the GPU (" + decoder_->describe() + ")"
                                 : "on the host (TurboJPEG): no GPU decoder: " + why;
    }
#else
    throw InputError("DataLoader: device " + options_.device.str() +
                     " asked for, but Kiln was built without CUDA");
#endif
  }
  start_workers();
}

DataLoader::~DataLoader() {
  stop_workers();
  try {
    retire_copies(/*wait_all=*/true);
  } catch (...) {
    // A destructor reports nothing more: the stream error surfaces on the next CUDA call.
  }
}

void DataLoader::start_workers() {
  stopping_ = false;
  for (int i = 0; i < options_.workers; ++i) workers_.emplace_back([this] { worker_loop(); });
}

void DataLoader::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
  workers_.clear();
}

void DataLoader::worker_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_cv_.wait(lock,
                  [this] { return stopping_ || claim_next_ < next_global_ + options_.prefetch; });
    if (stopping_) return;
    std::int64_t global = claim_next_++;
    std::uint64_t generation = generation_;
    lock.unlock();
    HostBatch batch = produce(global);
    lock.lock();
    if (generation == generation_) {
      ready_.emplace(global, std::move(batch));
      ready_cv_.notify_all();
    }
  }
}

std::shared_ptr<const std::vector<std::int64_t>> DataLoader::epoch_order(std::int64_t epoch) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = orders_.find(epoch);
  if (it != orders_.end()) return it->second;
  auto order = std::make_shared<const std::vector<std::int64_t>>(
      shard_indices(dataset_->size(), options_.shuffle, options_.seed, epoch, options_.rank,
                    options_.world_size, options_.shard_mode));
  // Keep the epochs in use: the consumer's and any a worker has run ahead into.
  std::int64_t oldest = next_global_ / batches_per_epoch_;
  for (auto old = orders_.begin(); old != orders_.end() && old->first < oldest;) {
    old = orders_.erase(old);
  }
  orders_.emplace(epoch, order);
  return order;
}

void fill_document_starts(const Tensor& ids, std::int64_t boundary, Tensor& starts) {
  KILN_CHECK(ids.dim() == 2 && ids.is_contiguous() && !ids.device().is_cuda() &&
                 (ids.dtype() == DType::I64 || ids.dtype() == DType::I32),
             "document starts: expected host token ids (B, T) I64 or I32, got " + ids.str());
  KILN_CHECK(starts.shape() == ids.shape() && starts.dtype() == DType::I32 &&
                 starts.is_contiguous() && !starts.device().is_cuda(),
             "document starts: expected a host I32 tensor shaped like " + ids.str() + ", got " +
                 starts.str());
  const std::int64_t rows = ids.size(0), t = ids.size(1);
  auto* out = starts.data<std::int32_t>();
  const auto fill = [&](const auto* id) {
    for (std::int64_t r = 0; r < rows; ++r) {
      std::int32_t start = 0;
      for (std::int64_t i = 0; i < t; ++i) {
        if (id[r * t + i] == boundary) start = static_cast<std::int32_t>(i);
        out[r * t + i] = start;
      }
    }
  };
  if (ids.dtype() == DType::I64) {
    fill(ids.data<std::int64_t>());
  } else {
    fill(ids.data<std::int32_t>());
  }
}

SampleContext DataLoader::sample_context(std::int64_t epoch, std::int64_t index) const {
  SampleContext context;
  context.seed = options_.seed;
  context.epoch = static_cast<std::uint64_t>(epoch);
  context.index = static_cast<std::uint64_t>(index);
  context.train = options_.train;
  return context;
}

std::int64_t DataLoader::load_from(const std::vector<std::int64_t>& order, std::int64_t epoch,
                                   std::int64_t position, const LoadSample& load,
                                   std::int64_t* skipped, std::int64_t* taken_at) const {
  const std::int64_t shard = static_cast<std::int64_t>(order.size());
  // An unreadable sample (skip mode) is replaced by the next ones in this rank's order:
  // deterministic, so resume and worker count do not change the batch.
  for (std::int64_t attempt = 0; attempt < shard; ++attempt) {
    const std::int64_t index = order[static_cast<std::size_t>((position + attempt) % shard)];
    if (load(index, sample_context(epoch, index))) {
      if (taken_at != nullptr) *taken_at = position + attempt;
      return index;
    }
    ++*skipped;
  }
  throw InputError(dataset_->describe() + ": every sample of rank " +
                   std::to_string(options_.rank) + "'s shard failed to load");
}

DataLoader::HostBatch DataLoader::produce(std::int64_t global) {
  HostBatch out;
  out.global = global;
  try {
    std::int64_t epoch = global / batches_per_epoch_;
    std::int64_t first = (global % batches_per_epoch_) * options_.batch_size;
    std::int64_t count = std::min(options_.batch_size, shard_size_ - first);
    std::shared_ptr<const std::vector<std::int64_t>> order = epoch_order(epoch);

    Shape input_shape = spec_.input_shape, target_shape = spec_.target_shape;
    input_shape.insert(input_shape.begin(), count);    // (B, ...)
    target_shape.insert(target_shape.begin(), count);  // (B) or (B, T)
    // Decoded on the device: the inputs never exist on the host.
    const bool encoded = decoder_ != nullptr;
    const std::size_t input_bytes = encoded ? 0 : spec_.input_bytes();
    const std::size_t target_bytes = spec_.target_bytes();
    const bool documents = options_.document_boundary_token.has_value();
    const std::size_t starts_bytes =
        documents ? static_cast<std::size_t>(shape_numel(input_shape)) * sizeof(std::int32_t) : 0;
#if KILN_WITH_CUDA
    if (options_.device.is_cuda()) {
      // One pinned block for every tensor, so the copy engine reads page-locked memory.
      std::size_t input_total = round_allocation_size(input_bytes * count);
      std::size_t target_total = round_allocation_size(target_bytes * count);
      std::size_t total = input_total + target_total + starts_bytes;
      void* block = pinned_allocator().allocate(total);
      out.pinned = std::shared_ptr<void>(block, [](void* p) { pinned_allocator().free(p); });
      if (!encoded) out.inputs = Tensor::wrap(block, input_shape, spec_.input_dtype, Device::cpu());
      out.targets = Tensor::wrap(static_cast<char*>(block) + input_total, target_shape,
                                 spec_.target_dtype, Device::cpu());
      if (documents) {
        out.document_starts = Tensor::wrap(static_cast<char*>(block) + input_total + target_total,
                                           input_shape, DType::I32, Device::cpu());
      }
    }
#endif
    if (!out.targets.defined()) {
      out.inputs = Tensor::empty(input_shape, spec_.input_dtype, Device::cpu());
      out.targets = Tensor::empty(target_shape, spec_.target_dtype, Device::cpu());
      if (documents) out.document_starts = Tensor::empty(input_shape, DType::I32, Device::cpu());
    }
    auto* targets = static_cast<char*>(out.targets.data());
    out.sample_indices.resize(static_cast<std::size_t>(count));
    if (encoded) {
      out.encoded.resize(static_cast<std::size_t>(count));
      out.positions.resize(static_cast<std::size_t>(count));
    }
    for (std::int64_t row = 0; row < count; ++row) {
      char* target = targets + row * target_bytes;
      const auto r = static_cast<std::size_t>(row);
      if (encoded) {
        out.sample_indices[r] = load_from(
            *order, epoch, first + row,
            [&](std::int64_t index, const SampleContext& context) {
              return dataset_->get_encoded(index, context, &out.encoded[r], target);
            },
            &out.skipped_samples, &out.positions[r]);
      } else {
        char* input = static_cast<char*>(out.inputs.data()) + row * spec_.input_bytes();
        out.sample_indices[r] = load_from(
            *order, epoch, first + row,
            [&](std::int64_t index, const SampleContext& context) {
              return dataset_->get(index, context, input, target);
            },
            &out.skipped_samples);
      }
    }
    if (documents)
      fill_document_starts(out.inputs, *options_.document_boundary_token, out.document_starts);
    if (spec_.target_dtype == DType::I64) {
      const auto* t = out.targets.data<std::int64_t>();
      out.counted_targets = 0;
      for (std::int64_t i = 0; i < out.targets.numel(); ++i) {
        out.counted_targets += t[i] != kIgnoreIndex ? 1 : 0;
      }
    }
  } catch (...) {
    out.error = std::current_exception();
  }
  return out;
}

DataLoader::HostBatch DataLoader::take_ready(bool blocking, bool* got) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto it = ready_.find(next_global_);
  if (it == ready_.end()) {
    if (!blocking) {
      *got = false;
      return HostBatch{};
    }
    auto start = std::chrono::steady_clock::now();
    ready_cv_.wait(lock, [this] { return ready_.count(next_global_) > 0; });
    stats_.wait_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    it = ready_.find(next_global_);
  }
  HostBatch batch = std::move(it->second);
  ready_.erase(it);
  ++next_global_;
  *got = true;
  lock.unlock();
  work_cv_.notify_all();  // room for one more batch ahead
  return batch;
}

Batch DataLoader::deliver_host(HostBatch host) {
  if (host.error) std::rethrow_exception(host.error);
  Batch batch;
  batch.epoch = host.global / batches_per_epoch_;
  batch.index = host.global % batches_per_epoch_;
  batch.last_in_epoch = batch.index == batches_per_epoch_ - 1;
  batch.inputs = std::move(host.inputs);
  batch.targets = std::move(host.targets);
  batch.document_starts = std::move(host.document_starts);
  batch.sample_indices = std::move(host.sample_indices);
  batch.skipped_samples = host.skipped_samples;
  batch.counted_targets = host.counted_targets;
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.batches += 1;
  stats_.samples += batch.size();
  stats_.skipped_samples += batch.skipped_samples;
  return batch;
}

void DataLoader::decode_on_device(const std::vector<EncodedImage>& encoded,
                                  const std::vector<std::int64_t>& positions, std::int64_t epoch,
                                  const Event& out_ready, Batch& on_host, Batch& staged) {
  const std::size_t target_bytes = spec_.target_bytes();
  std::int64_t skipped = 0;
  // A file no decoder takes: the CPU path's rule from its position (its own get() refuses it
  // first: an InputError naming it, or counted and the next sample taken).
  std::shared_ptr<const std::vector<std::int64_t>> order = epoch_order(epoch);
  auto replace = [&](std::size_t row, float* image) {
    char* target = static_cast<char*>(on_host.targets.data()) + row * target_bytes;
    staged.sample_indices[row] = load_from(
        *order, epoch, positions[row],
        [&](std::int64_t index, const SampleContext& context) {
          return dataset_->get(index, context, image, target);
        },
        &skipped);
  };
  decoder_->decode(encoded, dataset_->device_finish(), staged.inputs, out_ready,
                   copy_stream_.handle(), replace);
  if (skipped > 0) {
    staged.skipped_samples += skipped;
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.skipped_samples += skipped;
  }
}

DataLoader::Staged DataLoader::stage_copy(HostBatch host) {
  Staged staged;
  if (host.error) {
    staged.error = host.error;
    return staged;
  }
  std::shared_ptr<void> pinned = std::move(host.pinned);
  std::vector<EncodedImage> encoded = std::move(host.encoded);
  const std::vector<std::int64_t> positions = std::move(host.positions);
  const std::int64_t epoch = host.global / batches_per_epoch_;
  Batch on_host = deliver_host(std::move(host));
  staged.batch = on_host;
#if KILN_WITH_CUDA
  const Device device = options_.device;
  // Device memory comes from the consumer's stream pool, so a block freed by earlier compute is
  // reused only after that compute: the copy stream waits for the consumer's stream first.
  void* compute = current_stream(device);
  Shape input_shape = spec_.input_shape;
  input_shape.insert(input_shape.begin(), on_host.targets.shape()[0]);
  staged.batch.inputs = Tensor::empty(input_shape, spec_.input_dtype, device);
  staged.batch.targets = Tensor::empty(on_host.targets.shape(), on_host.targets.dtype(), device);
  if (on_host.document_starts.defined()) {
    staged.batch.document_starts =
        Tensor::empty(on_host.document_starts.shape(), DType::I32, device);
  }
  Event allocated(device);
  allocated.record(compute);
  // Decoding reads and writes the decoder's own memory: only its last kernel waits for compute.
  if (encoded.empty()) allocated.wait_on(copy_stream_.handle());
  {
    StreamGuard guard(device, copy_stream_.handle());
    if (!encoded.empty()) {
      try {  // before the targets' copy: a replaced row changes its target
        decode_on_device(encoded, positions, epoch, allocated, on_host, staged.batch);
      } catch (...) {
        staged.error = std::current_exception();
        allocated.wait_on(copy_stream_.handle());
        copy_stream_.synchronize();  // nothing in flight reads the batch's memory after this
      }
    } else {
      staged.batch.inputs.copy_from(on_host.inputs);
    }
    staged.batch.targets.copy_from(on_host.targets);
    if (on_host.document_starts.defined()) {
      staged.batch.document_starts.copy_from(on_host.document_starts);
    }
  }
  staged.copied = std::make_shared<Event>(device);
  staged.copied->record(copy_stream_.handle());
#endif
  staged.encoded = std::move(encoded);
  staged.pinned = std::move(pinned);
  return staged;
}

void DataLoader::retire_copies(bool wait_all) {
  while (!retiring_.empty()) {
    Staged& front = retiring_.front();
    if (front.copied) {
      if (wait_all) {
        front.copied->synchronize();
      } else if (!front.copied->query()) {
        break;
      }
    }
    retiring_.pop_front();  // frees the pinned memory back to its cache
  }
}

Batch DataLoader::next() {
  if (options_.workers == 0) {
    // Synchronous: load the batch here; the whole load counts as waiting.
    std::unique_lock<std::mutex> lock(mutex_);
    std::int64_t global = next_global_;
    if (ready_.count(global) == 0) {
      lock.unlock();
      auto start = std::chrono::steady_clock::now();
      HostBatch batch = produce(global);
      double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      lock.lock();
      stats_.wait_seconds += seconds;
      ready_.emplace(global, std::move(batch));
    }
  }
  bool got = false;
  if (!options_.device.is_cuda()) return deliver_host(take_ready(/*blocking=*/true, &got));

  retire_copies(/*wait_all=*/false);
  if (staged_.empty()) staged_.push_back(stage_copy(take_ready(/*blocking=*/true, &got)));
  Staged current = std::move(staged_.front());
  staged_.pop_front();
  if (current.error) std::rethrow_exception(current.error);
  // Issue the following batch's copy now, if it is loaded, so it overlaps this step's compute.
  if (options_.workers > 0) {
    HostBatch ahead = take_ready(/*blocking=*/false, &got);
    if (got) staged_.push_back(stage_copy(std::move(ahead)));
  }
  if (current.copied) current.copied->wait_on(current_stream(options_.device));
  Batch batch = current.batch;
  retiring_.push_back(std::move(current));
  return batch;
}

std::int64_t DataLoader::epoch() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::int64_t global = next_global_ - static_cast<std::int64_t>(staged_.size());
  return global / batches_per_epoch_;
}

LoaderState DataLoader::state() const {
  std::lock_guard<std::mutex> lock(mutex_);
  // Batches staged on the device are not yet returned: the position is the consumer's.
  std::int64_t global = next_global_ - static_cast<std::int64_t>(staged_.size());
  LoaderState state;
  state.seed = options_.seed;
  state.epoch = global / batches_per_epoch_;
  state.next_batch = global % batches_per_epoch_;
  state.batches_per_epoch = batches_per_epoch_;
  state.samples_per_batch = options_.batch_size * options_.world_size;
  state.dataset_size = dataset_->size();
  return state;
}

void DataLoader::jump_to(std::int64_t global) {
  retire_copies(/*wait_all=*/true);
  if (copy_stream_.handle() != nullptr) copy_stream_.synchronize();
  staged_.clear();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++generation_;
    ready_.clear();
    orders_.clear();
    next_global_ = global;
    claim_next_ = global;
  }
  work_cv_.notify_all();
}

void DataLoader::restore(const LoaderState& saved) {
  LoaderState state = saved;
  const std::int64_t per_batch = options_.batch_size * options_.world_size;
  if (state.dataset_size != 0 && state.dataset_size != dataset_->size()) {
    throw InputError("data position (" + state.str() + ") was saved for a data set of " +
                     std::to_string(state.dataset_size) + " samples, this loader reads " +
                     std::to_string(dataset_->size()) + " (" + dataset_->describe() +
                     "): the data set changed");
  }
  if (state.samples_per_batch > 0 && state.samples_per_batch != per_batch) {
    // Another batch size × world size: the same global sample of the same epoch's order.
    const std::int64_t sample = state.epoch_sample();
    if (sample % per_batch != 0) {
      throw InputError(
          "data position (" + state.str() + ") lies inside a batch of this loader (" +
          std::to_string(options_.batch_size) + " × " + std::to_string(options_.world_size) +
          " ranks = " + std::to_string(per_batch) + " samples per batch): sample " +
          std::to_string(sample) + " is not a multiple of " + std::to_string(per_batch));
    }
    state.next_batch = sample / per_batch;
    if (state.next_batch >= batches_per_epoch_) {  // the rest of the epoch is a dropped tail
      ++state.epoch;
      state.next_batch = 0;
    }
  } else if (state.batches_per_epoch != 0 && state.batches_per_epoch != batches_per_epoch_) {
    throw InputError("data position (" + state.str() + ") was saved with " +
                     std::to_string(state.batches_per_epoch) +
                     " batches per epoch, this loader has " + std::to_string(batches_per_epoch_) +
                     " (did batch_size, world_size, shard mode or the dataset change?)");
  }
  if (state.epoch < 0 || state.next_batch < 0 || state.next_batch >= batches_per_epoch_) {
    throw InputError("data position out of range: " + state.str());
  }
  // The seed travels with the position: a resumed run continues the saved order.
  stop_workers();
  options_.seed = state.seed;
  jump_to(state.epoch * batches_per_epoch_ + state.next_batch);
  start_workers();
}

void DataLoader::set_epoch(std::int64_t epoch) {
  LoaderState position = state();
  position.epoch = epoch;
  position.next_batch = 0;
  restore(position);
}

double DataLoader::wait_time() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_.wait_seconds;
}

LoaderStats DataLoader::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

}  // namespace kiln::data
