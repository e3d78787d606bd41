#pragma once
// Image classification datasets: in-memory 8-bit arrays (MNIST-format idx files, CIFAR-10
// binary batches), folders of JPEG files by class (ImageNet layout), and synthetic images.
// Every one yields float32 (C, H, W) normalised inputs and an int64 class id.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/cuda/resize_crop_cuda.h"
#include "data/dataset.h"
#include "data/device_decode.h"
#include "data/image_transform.h"

namespace kiln::data {

// N images of (C, H, W) uint8 pixels with a class id each, held in memory.
class ImageArrayDataset : public Dataset {
 public:
  ImageArrayDataset(std::string name, std::vector<std::uint8_t> pixels,
                    std::vector<std::uint8_t> labels, int channels, int height, int width,
                    int num_classes, ImageAugment augment);

  std::int64_t size() const override { return static_cast<std::int64_t>(labels_.size()); }
  SampleSpec spec() const override;
  std::string describe() const override;
  std::int64_t num_classes() const override { return num_classes_; }
  bool get(std::int64_t index, const SampleContext& context, void* input,
           void* target) const override;

  // The raw pixels of sample `index`, (C, H, W).
  const std::uint8_t* pixels(std::int64_t index) const;
  int label(std::int64_t index) const { return labels_[static_cast<std::size_t>(index)]; }

 private:
  std::string name_;
  std::vector<std::uint8_t> pixels_;  // (N, C, H, W)
  std::vector<std::uint8_t> labels_;  // (N)
  int channels_, height_, width_, num_classes_;
  ImageAugment augment_;
};

// An MNIST-format pair: idx3 ubyte images (N, H, W) and idx1 ubyte labels (N), each gzipped or
// not. Labels must lie in [0, num_classes).
std::unique_ptr<ImageArrayDataset> load_idx_dataset(const std::string& images_path,
                                                    const std::string& labels_path, int num_classes,
                                                    ImageAugment augment,
                                                    const std::string& name = "idx");

// Fashion-MNIST (or MNIST) from `dir`: split "train" reads train-*-idx?-ubyte[.gz], "test"
// reads t10k-*.
std::unique_ptr<ImageArrayDataset> load_mnist_dir(const std::string& dir, const std::string& split,
                                                  ImageAugment augment,
                                                  const std::string& name = "fashion_mnist");

// The idx files Debian's dataset-fashion-mnist package installs.
inline const char* default_fashion_mnist_dir() {
  return "/usr/share/datasets/fashion-mnist";
}

// CIFAR-10 binary batches: 3073-byte records (label byte, 3072 CHW pixels). `files` are read in
// order; load_cifar10_dir picks data_batch_1..5.bin ("train") or test_batch.bin ("test").
constexpr int kCifarRecordBytes = 3073;
std::unique_ptr<ImageArrayDataset> load_cifar10_files(const std::vector<std::string>& files,
                                                      ImageAugment augment);
std::unique_ptr<ImageArrayDataset> load_cifar10_dir(const std::string& dir,
                                                    const std::string& split, ImageAugment augment);

// What to do with an image that will not decode.
enum class CorruptImagePolicy {
  kFail,  // throw InputError naming the file
  kSkip,  // count it (Dataset::skipped_samples) and let the loader take another sample
};

// The defaults are ImageNet's usual recipe; make_dataset() replaces the augmentation with
// DatasetOptions::image_augment when that is set (the experiment's data.augmentation).
struct JpegFolderOptions {
  int image_size = 224;  // output (3, image_size, image_size)
  // Train: RandomResizedCrop(scale, ratio) when random_resized_crop, else the eval's crop; then
  // flip and a padded random crop. Eval: central crop of this share, resized.
  bool random_resized_crop = true;
  double scale_min = 0.08, scale_max = 1.0;
  double ratio_min = kResizedCropRatioMin, ratio_max = kResizedCropRatioMax;
  double eval_crop_fraction = 0.875;
  bool horizontal_flip = true;
  int crop_padding = 0;  // pixels of zero padding (before normalisation) each side; 0 = off
  // ImageNet statistics by default.
  Normalization normalization{{0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f}};
  CorruptImagePolicy on_corrupt = CorruptImagePolicy::kFail;
  // Decode at the smallest m/8 of the image's size that still covers the crop at the output size
  // (TurboJPEG's DCT-domain scaling, jpeg_decode_eighths): the same crop, fewer pixels decoded.
  bool dct_scaling = true;
  // Decode only the crop's columns and rows, and stop after its last row (decode_jpeg_region):
  // the same pixels as the whole image's decode, in less time. Off: the whole image, as the GPU
  // path and older Kiln decode it.
  bool region_decode = true;
};

// root/<class>/*.jpg (ImageNet layout): classes are the sorted subdirectory names, ids 0..K-1;
// files sorted by name within each class. Decoded with TurboJPEG on demand.
class JpegFolderDataset : public Dataset {
 public:
  JpegFolderDataset(const std::string& root, JpegFolderOptions options);

  std::int64_t size() const override { return static_cast<std::int64_t>(files_.size()); }
  SampleSpec spec() const override;
  std::string describe() const override;
  std::int64_t num_classes() const override {
    return static_cast<std::int64_t>(class_names_.size());
  }
  bool get(std::int64_t index, const SampleContext& context, void* input,
           void* target) const override;
  bool encodes_images() const override { return true; }
  bool get_encoded(std::int64_t index, const SampleContext& context, EncodedImage* image,
                   void* target) const override;
  ResizeCropParams device_finish() const override;

  const std::vector<std::string>& class_names() const { return class_names_; }
  const std::string& file(std::int64_t index) const { return files_[index]; }
  int label(std::int64_t index) const { return labels_[index]; }

 private:
  // A sample's random choices, from the full image size: the same on both decode paths.
  struct Choices {
    CropBox box;
    bool flip = false;
    int shift_x = 0, shift_y = 0;
  };
  Choices choose(int width, int height, const SampleContext& context) const;
  // The corrupt-image policy: throws naming the file (FAIL), or counts it and returns false.
  bool refuse(std::int64_t index, const std::string& error) const;

  std::string root_;
  JpegFolderOptions options_;
  std::vector<std::string> class_names_;
  std::vector<std::string> files_;
  std::vector<int> labels_;
  std::vector<float> mean_, inv_std_;
};

// A JPEG's width and height from its header; false with `error` set when it has none.
bool read_jpeg_header(const std::uint8_t* bytes, std::size_t size, int* width, int* height,
                      std::string* error);
// Decodes a JPEG in memory to interleaved RGB (H, W, 3). Returns false with `error` set when it
// will not decode. With eighths m < 8, libjpeg-turbo's DCT-domain scaling decodes it at m/8 of
// its size (W' = ceil(W m / 8)), in a fraction of the time; *width, *height are the decoded size.
bool decode_jpeg_rgb(const std::uint8_t* bytes, std::size_t size, std::vector<std::uint8_t>* rgb,
                     int* width, int* height, std::string* error, int eighths = 8);
// The smallest scale m/8 of 1/8, 1/4, 1/2 and 1 at which `box` still spans out_width x
// out_height pixels: the resize after it stays a reduction, from fewer decoded pixels. (The
// other eighths decode slower than the full size: libjpeg-turbo has no fast IDCT for them.)
int jpeg_decode_eighths(CropBox box, int out_width, int out_height);
// A side of `size` pixels decoded at eighths/8: ceil(size * eighths / 8), as libjpeg computes it.
int jpeg_scaled_size(int size, int eighths);
// `box` of an image mapped into the same image decoded at m/8 (width x height pixels).
CropBox scale_crop_box(CropBox box, int eighths, int width, int height);
// Encodes interleaved RGB (H, W, 3) as a JPEG (for tests and benchmarks).
std::vector<std::uint8_t> encode_jpeg_rgb(const std::uint8_t* rgb, int width, int height,
                                          int quality = 90);

// Random images for benchmarks, a pure function of (seed, index): pixels uniform with mean 0
// and variance 1 in float32 (C, H, W), and a uniform class id. No epoch dependence, no files.
class SyntheticImageDataset : public Dataset {
 public:
  SyntheticImageDataset(std::int64_t size, int channels, int height, int width, int num_classes,
                        std::uint64_t seed);
  std::int64_t size() const override { return size_; }
  SampleSpec spec() const override;
  std::string describe() const override;
  std::int64_t num_classes() const override { return num_classes_; }
  bool get(std::int64_t index, const SampleContext& context, void* input,
           void* target) const override;

 private:
  std::int64_t size_;
  int channels_, height_, width_, num_classes_;
  std::uint64_t seed_;
};

}  // namespace kiln::data
