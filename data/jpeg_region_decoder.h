#pragma once
// Decoding only the part of a JPEG that a crop reads (libjpeg-turbo's jpeg_crop_scanline and
// jpeg_skip_scanlines): the inverse DCT, upsampling and colour conversion run on the crop's
// columns and rows only, and decoding stops after the crop's last row. The entropy decoding of the
// rows above the crop cannot be skipped (baseline JPEG has no index), so that is what remains.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "data/image_transform.h"

namespace kiln::data {

// The end-of-image marker within the last 4 KB of the file (some writers pad after it).
bool jpeg_ends_with_eoi(const std::uint8_t* bytes, std::size_t size);

// A decoded part of an image, RGB, reused from sample to sample by one worker.
struct DecodedRegion {
  std::vector<std::uint8_t> rgb;  // grown to the largest part, never shrunk
  int x0 = 0, y0 = 0, columns = 0, rows = 0;
  int width = 0, height = 0;  // the whole image at the decoded scale
  PixelWindow window() const {
    return PixelWindow{rgb.data(), x0, y0, columns, rows, width, height};
  }
};

// Decodes at eighths/8 of the image's size the pixels of `part` (in pixels of that scale): they
// equal those of decode_jpeg_rgb at the same scale bit for bit. `region` may hold more around it
// (libjpeg crops at iMCU columns). A file without an end-of-image marker is decoded to its end, so
// that a truncated file fails as on the whole-image path; corrupt data after `part`'s last row is
// not read. False with `error` set (libjpeg's message) when the file does not decode.
bool decode_jpeg_region(const std::uint8_t* bytes, std::size_t size, int eighths, CropBox part,
                        DecodedRegion* region, std::string* error);

// Only the entropy decoding of the whole file, to DCT coefficients (jpeg_read_coefficients): what
// every exact decode must do at least, for loader_bench's bound. False with `error` set.
bool jpeg_entropy_decode(const std::uint8_t* bytes, std::size_t size, std::string* error);

}  // namespace kiln::data
