#pragma once
// Image augmentation and normalisation, fused into one pass from 8-bit pixels to the float
// (C, H, W) sample the model reads. Random choices come from the sample's SampleContext, so a
// sample's augmentation depends on (seed, epoch, index) only.

#include <cstdint>
#include <vector>

#include "data/dataset.h"

namespace kiln::data {

// Per-channel normalisation of pixels scaled to [0, 1]: (x / 255 - mean[c]) / stddev[c]. Empty
// vectors mean mean 0 and stddev 1; one value applies to every channel.
struct Normalization {
  std::vector<float> mean;
  std::vector<float> stddev;

  // Expands to `channels` values each; throws InputError for a mismatched count or stddev <= 0.
  void expand(int channels, std::vector<float>* mean_out, std::vector<float>* inv_std_out) const;
};

// Augmentation of an image dataset (data.augmentation of the experiment): the random parts apply
// when SampleContext::train is set, the normalisation always. Order: random resized crop, flip,
// normalise, padded crop.
struct ImageAugment {
  // Random crop of the output size from the image zero-padded by this many pixels on each
  // side (torchvision RandomCrop(size, padding)); 0 disables.
  int crop_padding = 0;
  bool horizontal_flip = false;  // mirror with probability 1/2
  Normalization normalization;
  // torchvision RandomResizedCrop(scale=(min, max), ratio=(3/4, 4/3)), resized back to the
  // output size; max 0 disables (fixed-size images keep their frame, JPEG folders take the
  // eval's central crop).
  double resized_crop_scale_min = 0.0, resized_crop_scale_max = 0.0;
  bool random_resized_crop() const { return resized_crop_scale_max > 0.0; }
};

// RandomResizedCrop's aspect-ratio range (torchvision's default).
constexpr double kResizedCropRatioMin = 3.0 / 4.0, kResizedCropRatioMax = 4.0 / 3.0;

// src: (C, H, W) uint8; dst: (C, H, W) float. Draws words 0..2 of the context, and 4..43 for the
// random resized crop.
void augment_image_chw(const std::uint8_t* src, int channels, int height, int width,
                       const ImageAugment& augment, const SampleContext& context, float* dst);

// Shifts the normalised (C, H, W) image `image` in place by (shift_x, shift_y) pixels, filling
// what comes in from outside with fill[c]: a padded random crop applied after resizing.
void shift_image_chw(float* image, int channels, int height, int width, int shift_x, int shift_y,
                     const float* fill);

// A crop rectangle in source pixels.
struct CropBox {
  int x = 0, y = 0, width = 0, height = 0;
};

// torchvision RandomResizedCrop's box: area share in [scale_min, scale_max], aspect ratio
// log-uniform in [ratio_min, ratio_max], ten tries, then the central crop of clamped ratio.
// Draws words first_word .. first_word + 39 of the context.
CropBox random_resized_crop_box(int width, int height, double scale_min, double scale_max,
                                double ratio_min, double ratio_max, const SampleContext& context,
                                std::uint64_t first_word);

// The central square holding `fraction` of the shorter side (0.875: resize to 256, crop 224).
CropBox center_crop_box(int width, int height, double fraction);

// Bilinear resize of `box` of the interleaved (H, W, C) uint8 image `src` to a (C, out_h, out_w)
// float image, mirrored when `flip`, normalised with per-channel mean and 1/stddev.
void resize_crop_hwc(const std::uint8_t* src, int width, int height, int channels, CropBox box,
                     int out_width, int out_height, bool flip, const float* mean,
                     const float* inv_std, float* dst);

// The decoded part of an interleaved (height, width, channels) uint8 image: columns x0 ..
// x0 + columns - 1 of rows y0 .. y0 + rows - 1, `columns * channels` bytes a row.
struct PixelWindow {
  const std::uint8_t* pixels = nullptr;  // pixel (x0, y0)
  int x0 = 0, y0 = 0, columns = 0, rows = 0;
  int width = 0, height = 0;  // the whole image
};

// The pixels a bilinear resize of `box` reads: the box and one pixel around it, within the image.
CropBox resize_footprint(CropBox box, int width, int height);

// resize_crop_hwc of a window that holds resize_footprint(box): the same values bit for bit as on
// the whole image (the taps are placed and clamped in the whole image's coordinates).
void resize_crop_window(const PixelWindow& src, int channels, CropBox box, int out_width,
                        int out_height, bool flip, const float* mean, const float* inv_std,
                        float* dst);

}  // namespace kiln::data
