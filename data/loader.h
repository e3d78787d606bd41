#pragma once
// DataLoader: worker threads assemble batches of a Dataset in (pinned) host memory, in an order
// fixed by (seed, epoch, rank); with a CUDA device the batch is copied on a stream of its own
// while the previous step computes.
//
// The batch stream is endless: after the last batch of epoch e comes the first of epoch e + 1
// (Batch::last_in_epoch marks the boundary). state() is the position of the batch next() will
// return; restore(state) on a loader built with the same options and dataset continues with
// the identical batch sequence, whatever the worker count.
//
// Packed documents (LoaderOptions::document_boundary_token): each batch of token ids also carries
// Batch::document_starts, computed on the host as the batch is assembled and delivered beside the
// ids (pinned, copied on the same stream): a function of the ids alone, so resume needs no state.

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/device.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "data/dataset.h"
#include "data/device_decode.h"
#include "data/sampler.h"

namespace kiln::data {

struct LoaderOptions {
  std::int64_t batch_size = 32;
  int workers = 2;  // threads loading batches; 0 loads on the thread calling next()
  // Batches loaded ahead of the consumer; at least `workers` (each worker loads whole batches).
  int prefetch = 4;
  bool shuffle = true;
  std::uint64_t seed = 0;
  bool drop_last = false;  // drop each epoch's final partial batch on every rank
  ShardMode shard_mode = ShardMode::kPad;
  int rank = 0;
  int world_size = 1;
  Device device = Device::cpu();  // where Batch tensors are delivered
  bool train = true;              // random augmentation (SampleContext::train)
  // Where datasets of encoded images (Dataset::encodes_images: JPEG folders) are decoded. kDevice:
  // each file's bytes go to the device, where nvJPEG decodes the batch and one kernel crops,
  // resizes and normalises it (data.decode GPU; data/device_decode.h); InputError without a CUDA
  // device or a decoder. kAuto: there when it can be, else on the host (image_decoding() says why).
  enum class ImageDecode { kHost, kDevice, kAuto };
  ImageDecode decode = ImageDecode::kHost;
  // Set: the id of the token that begins each document in (B, T) integer inputs; every batch then
  // has document_starts (data.document_boundary_token).
  std::optional<std::int64_t> document_boundary_token;
};

// starts (B, T) I32 = for each token of ids (B, T) I64 or I32, the index in its row of the last
// `boundary` token at or before it, 0 where there is none (a row opens inside a document): the
// first token of its document (CallInputs::document_starts). Host tensors.
void fill_document_starts(const Tensor& ids, std::int64_t boundary, Tensor& starts);

struct Batch {
  Tensor inputs;   // (B, ...) e.g. f32 (B, C, H, W) images or i64 (B, T) token ids
  Tensor targets;  // (B) i64 class ids or (B, T) i64 token labels
  // (B, T) I32 with LoaderOptions::document_boundary_token (fill_document_starts), else undefined.
  Tensor document_starts;
  std::int64_t epoch = 0;
  std::int64_t index = 0;  // batch index within the epoch on this rank
  bool last_in_epoch = false;
  std::vector<std::int64_t> sample_indices;  // the dataset index of every row
  std::int64_t skipped_samples = 0;          // unreadable samples replaced in this batch
  // Integer targets other than kIgnoreIndex, counted on the host as the batch was assembled (the
  // rows a loss averages over; train.loss_average); -1 for floating targets.
  std::int64_t counted_targets = -1;
  std::int64_t size() const { return static_cast<std::int64_t>(sample_indices.size()); }
};

// The data position for checkpoints. Every rank's batches of one step are one contiguous run of
// the epoch's global order (rank r reads its positions r, r + W, ...), so the position is also a
// count of global samples, next_batch × samples_per_batch, which means the same thing on any
// world size: a loader with another batch size × world size continues at that sample of the same
// epoch's order (restore()).
struct LoaderState {
  std::uint64_t seed = 0;
  std::int64_t epoch = 0;
  std::int64_t next_batch = 0;         // batch index within `epoch`
  std::int64_t batches_per_epoch = 0;  // checked on restore when the batch layout is the same
  std::int64_t samples_per_batch = 0;  // batch_size × world_size; 0: unknown (an old checkpoint)
  std::int64_t dataset_size = 0;       // the samples the order permutes; 0: unknown
  // Global samples of the epoch's order before next_batch (-1 when samples_per_batch is unknown).
  std::int64_t epoch_sample() const;
  std::string str() const;  // "epoch 3, batch 17 of 390 (sample 1088 of the epoch), seed 42"
};

struct LoaderStats {
  double wait_seconds = 0;  // time next() spent blocked waiting for a batch
  std::int64_t batches = 0;
  std::int64_t samples = 0;
  std::int64_t skipped_samples = 0;  // unreadable samples replaced in the batches delivered
};

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Dataset> dataset, LoaderOptions options);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // The next batch. With a CUDA device its tensors are on the device and the current stream
  // already waits for their copy. Rethrows the InputError of a sample that failed to load.
  Batch next();

  std::int64_t epoch() const;  // the epoch of the batch next() returns
  std::int64_t batches_per_epoch() const { return batches_per_epoch_; }
  std::int64_t samples_per_epoch() const { return shard_size_; }  // on this rank
  LoaderState state() const;
  // Continues at `state`; a state of another batch size × world size (samples_per_batch) at the
  // same global sample of the same epoch's order. InputError if the state does not fit: another
  // data set, or a sample inside one of this loader's batches.
  void restore(const LoaderState& state);
  void set_epoch(std::int64_t epoch);  // start of `epoch`

  // "on the GPU (nvJPEG hardware decoder ...)" or "on the host (TurboJPEG)[: why not the GPU]",
  // for datasets of encoded images; empty for the others.
  const std::string& image_decoding() const { return image_decoding_; }
  double wait_time() const;  // LoaderStats::wait_seconds
  LoaderStats stats() const;
  const Dataset& dataset() const { return *dataset_; }
  const LoaderOptions& options() const { return options_; }

 private:
  // A batch assembled in host memory (pinned when the device is CUDA), or the error that
  // stopped it.
  struct HostBatch {
    std::int64_t global = 0;
    Tensor inputs, targets, document_starts;
    std::shared_ptr<void> pinned;  // owns the pinned memory the tensors view
    std::vector<std::int64_t> sample_indices;
    std::int64_t skipped_samples = 0;
    std::int64_t counted_targets = -1;
    // Decoding on the device: each row's file and choices, and the position in the epoch's order it
    // was taken from (a row the device cannot decode is replaced from there on, as produce() does).
    std::vector<EncodedImage> encoded;
    std::vector<std::int64_t> positions;
    std::exception_ptr error;
  };
  // A batch whose copy to the device is in flight.
  struct Staged {
    Batch batch;
    std::shared_ptr<void> pinned;
    std::shared_ptr<Event> copied;
    std::vector<EncodedImage> encoded;  // kept until the decoder has read them
    std::exception_ptr error;           // the batch failed to load: rethrown when it is its turn
  };

  void start_workers();
  void stop_workers();
  void worker_loop();
  HostBatch produce(std::int64_t global_batch);
  std::shared_ptr<const std::vector<std::int64_t>> epoch_order(std::int64_t epoch);
  HostBatch take_ready(bool blocking, bool* got);
  Batch deliver_host(HostBatch host);
  void jump_to(std::int64_t global_batch);
  void retire_copies(bool wait_all);
  Staged stage_copy(HostBatch host);
  SampleContext sample_context(std::int64_t epoch, std::int64_t index) const;
  // The index of the first sample from `position` of the epoch's `order` on that `load` takes
  // (skip mode refuses unreadable ones, each counted in *skipped); *taken_at: its position.
  using LoadSample = std::function<bool(std::int64_t index, const SampleContext& context)>;
  std::int64_t load_from(const std::vector<std::int64_t>& order, std::int64_t epoch,
                         std::int64_t position, const LoadSample& load, std::int64_t* skipped,
                         std::int64_t* taken_at = nullptr) const;
  void decode_on_device(const std::vector<EncodedImage>& encoded,
                        const std::vector<std::int64_t>& positions, std::int64_t epoch,
                        const Event& out_ready, Batch& on_host, Batch& staged);

  std::shared_ptr<const Dataset> dataset_;
  LoaderOptions options_;
  SampleSpec spec_;
  std::int64_t shard_size_ = 0;
  std::int64_t batches_per_epoch_ = 0;

  mutable std::mutex mutex_;
  std::condition_variable work_cv_;   // workers: room to claim a batch, or stop
  std::condition_variable ready_cv_;  // consumer: a batch is ready
  std::vector<std::thread> workers_;
  bool stopping_ = false;
  std::uint64_t generation_ = 0;  // bumped by restore(); stale results are dropped
  std::int64_t next_global_ = 0;  // global batch index (epoch * batches_per_epoch + batch)
  std::int64_t claim_next_ = 0;   // next global batch a worker will load
  std::map<std::int64_t, HostBatch> ready_;
  std::map<std::int64_t, std::shared_ptr<const std::vector<std::int64_t>>> orders_;
  LoaderStats stats_;

  // CUDA delivery: copies issued ahead on copy_stream_, pinned memory kept until copied.
  Stream copy_stream_;
  std::unique_ptr<DeviceImageDecoder> decoder_;  // set: images are decoded on the device
  std::string image_decoding_;
  std::deque<Staged> staged_;
  std::deque<Staged> retiring_;
};

}  // namespace kiln::data
