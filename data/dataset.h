#pragma once
// The dataset interface the loader draws from. A dataset is an indexed, read-only collection:
// get(index) writes one sample into caller-owned memory (the loader points it straight into a
// pinned batch), so no sample is ever allocated on its own. get() is called concurrently from
// several worker threads and must not change observable state (counters aside).

#include <atomic>
#include <cstdint>
#include <string>

#include "core/random.h"
#include "core/tensor.h"

namespace kiln::data {

struct EncodedImage;      // data/device_decode.h
struct ResizeCropParams;  // data/cuda/resize_crop_cuda.h

// The label value a loss ignores (PyTorch's CrossEntropyLoss ignore_index).
constexpr std::int64_t kIgnoreIndex = -100;

// What one sample looks like; a batch prepends the batch dimension to both shapes.
struct SampleSpec {
  Shape input_shape;  // e.g. (C, H, W) for images, (T) for token windows
  DType input_dtype = DType::F32;
  Shape target_shape;  // () for a class id, (T) for per-token labels
  DType target_dtype = DType::I64;

  std::size_t input_bytes() const {
    return static_cast<std::size_t>(shape_numel(input_shape)) * dtype_size(input_dtype);
  }
  std::size_t target_bytes() const {
    return static_cast<std::size_t>(shape_numel(target_shape)) * dtype_size(target_dtype);
  }
};

// The random stream of one sample in one epoch. Every random choice a dataset makes (crop,
// flip, masking) draws from here, so a sample's content depends on (seed, epoch, index) only,
// never on which worker produced it or in what order.
struct SampleContext {
  std::uint64_t seed = 0;
  std::uint64_t epoch = 0;
  std::uint64_t index = 0;  // the dataset index of the sample
  bool train = true;        // random augmentation on; eval transforms are deterministic

  // The i-th 32-bit random word of this sample (i < 2^22).
  std::uint32_t word(std::uint64_t i) const {
    return philox((index << 20) | (i >> 2), seed, epoch).v[i & 3];
  }
  // Uniform in (0, 1).
  double uniform(std::uint64_t i) const { return philox_uniform(word(i)); }
  // Uniform integer in [0, n) (multiply-shift; bias below 2^-32 * n).
  std::uint64_t below(std::uint64_t i, std::uint64_t n) const {
    return (static_cast<std::uint64_t>(word(i)) * n) >> 32;
  }
};

class Dataset {
 public:
  virtual ~Dataset() = default;

  virtual std::int64_t size() const = 0;
  virtual SampleSpec spec() const = 0;
  // "fashion_mnist train (60000 samples)", for logs and messages.
  virtual std::string describe() const = 0;
  // Class count for classification datasets, vocabulary size for token datasets.
  virtual std::int64_t num_classes() const = 0;
  // Whether targets are kIgnoreIndex by design in varying numbers per sample (loss masks), so a
  // step's loss should average over its counted targets (train.loss_average AUTO).
  virtual bool masks_targets() const { return false; }

  // Writes sample `index` (0 <= index < size()) into `input` (spec().input_bytes()) and
  // `target` (spec().target_bytes()). Returns false when the sample is unreadable and the
  // dataset is configured to skip such samples (counted in skipped_samples()); throws
  // InputError when it is configured to fail.
  virtual bool get(std::int64_t index, const SampleContext& context, void* input,
                   void* target) const = 0;

  // Datasets of encoded images (JPEG folders) can leave decoding and augmentation to the device
  // (data.decode GPU): get_encoded() reads the file and makes the sample's random choices exactly
  // as get() does, writes the target, and leaves the pixels to a DeviceImageDecoder, which finishes
  // every sample with device_finish(). Same return and errors as get().
  virtual bool encodes_images() const { return false; }
  virtual bool get_encoded(std::int64_t index, const SampleContext& context, EncodedImage* image,
                           void* target) const;
  virtual ResizeCropParams device_finish() const;

  // Samples get() refused so far (corrupt images in skip mode).
  std::int64_t skipped_samples() const { return skipped_.load(std::memory_order_relaxed); }

 protected:
  void count_skipped() const { skipped_.fetch_add(1, std::memory_order_relaxed); }

 private:
  mutable std::atomic<std::int64_t> skipped_{0};
};

}  // namespace kiln::data
