#pragma once
// The GPU twin of resize_crop_hwc followed by shift_image_chw (data/image_transform.h) for a whole
// batch of decoded images: one kernel writes every sample's normalised (3, S, S) float image, with
// the same taps and the same float operations as the CPU code, so equal pixels give equal output.

#include <cstdint>

#include "data/image_transform.h"

namespace kiln::data {

// One sample of a batch: where its interleaved (H, W, 3) uint8 pixels start in the batch's
// device buffer, their size, the crop to take, the mirror, and the padded crop's shift.
struct ResizeCropSample {
  std::int64_t offset = 0;  // bytes into the batch's pixel buffer; rows are width * 3 bytes
  std::int32_t width = 0, height = 0;
  CropBox box;
  std::int32_t flip = 0;                  // 1: mirrored (the x taps reversed, as on the CPU)
  std::int32_t shift_x = 0, shift_y = 0;  // shift_image_chw's shift; 0, 0: none
};

struct ResizeCropParams {
  int out_width = 0, out_height = 0;
  float mean[3] = {0, 0, 0};
  float inv_std[3] = {1, 1, 1};
  float fill[3] = {0, 0, 0};  // the value shifted-in pixels take (shift_image_chw's fill)
};

// pixels: device bytes; samples: `count` entries in device memory; dst: device float
// (count, 3, out_height, out_width). Enqueued on `stream` (a cudaStream_t).
void resize_crop_batch_cuda(const std::uint8_t* pixels, const ResizeCropSample* samples, int count,
                            const ResizeCropParams& params, float* dst, void* stream);

}  // namespace kiln::data
