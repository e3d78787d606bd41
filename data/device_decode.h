#pragma once
// Decoding images on the device (data.decode GPU). The loader's workers only read each file,
// parse its header and draw the sample's crop and flip (Dataset::get_encoded); the batch's JPEGs
// are then decoded by nvJPEG's batched decoder on the loader's copy stream and one kernel crops,
// resizes, mirrors and normalises them all (data/cuda/resize_crop_cuda.h), while the previous step
// computes. Images nvJPEG's batched decoder does not take (progressive, grayscale, CMYK) are
// decoded by the worker with TurboJPEG and only finished on the device.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "data/cuda/resize_crop_cuda.h"
#include "data/image_transform.h"

namespace kiln::data {

// One sample as a worker leaves it for the device.
struct EncodedImage {
  std::string file;                 // named in errors
  std::vector<std::uint8_t> bytes;  // the JPEG file, when rgb is empty
  std::vector<std::uint8_t> rgb;    // (H, W, 3) pixels the worker decoded itself, or empty
  int width = 0, height = 0;        // the full image's size (the header's)
  CropBox box;                      // in full-size pixels
  bool flip = false;
  int shift_x = 0, shift_y = 0;  // the padded random crop (shift_image_chw); 0, 0: none
};

// Whether nvJPEG's batched decoders take this JPEG as it is: baseline (SOF0) Huffman coding, three
// YCbCr components in 4:4:4, 4:2:2, 4:2:0 or 4:4:0, and an end-of-image marker at the end (a file
// without one is truncated: TurboJPEG reports it corrupt, so the GPU path must too: `*truncated`).
bool jpeg_decodable_on_device(const std::uint8_t* bytes, std::size_t size, bool* truncated);

// Turns a batch of encoded images into the model's float (B, 3, S, S) inputs on the device.
class DeviceImageDecoder {
 public:
  virtual ~DeviceImageDecoder() = default;
  // Decodes `images` and writes every sample into `out` (device, (B, 3, S, S) float), all enqueued
  // on `stream`; the decoding starts at once, the writes into `out` after `out_ready` (the
  // consumer's stream, which `out` was allocated for). An image the batched decoder fails on is
  // decoded again with TurboJPEG; one that fails there too is handed to `replace(row)`, which
  // writes the row's normalised image (3, S, S) into the host buffer it is given, or throws the
  // dataset's InputError.
  using Replace = std::function<void(std::size_t row, float* image)>;
  virtual void decode(const std::vector<EncodedImage>& images, const ResizeCropParams& finish,
                      Tensor& out, const Event& out_ready, void* stream,
                      const Replace& replace) = 0;
  // "nvJPEG (hardware decoder)", for the log.
  virtual std::string describe() const = 0;
};

// nvJPEG's decoder for `device`, or nullptr with *why set: no CUDA in this build, no nvJPEG header
// when it was built, or no libnvjpeg.so.13 to load (KILN_NVJPEG_LIBRARY names one explicitly).
std::unique_ptr<DeviceImageDecoder> make_device_image_decoder(Device device, std::string* why);

}  // namespace kiln::data
