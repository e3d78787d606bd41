#pragma once
// JPEG folders for the decode tests (CPU and GPU): photo-like images (smooth gradients, a
// hard-edged disc, mild noise; what photographs compress like, not noise or flat colour) of
// assorted sizes in root/<class>/, deterministic in the seed.

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "core/random.h"
#include "data/file_io.h"
#include "data/image_datasets.h"
#include "tests/data/test_util.h"

namespace kiln::data::testing {

inline std::vector<std::uint8_t> photo_like_jpeg(int width, int height, std::uint64_t seed) {
  std::vector<std::uint8_t> rgb(static_cast<std::size_t>(width) * height * 3);
  const int cx = static_cast<int>(philox_word(seed, 0, 0) % width);
  const int cy = static_cast<int>(philox_word(seed, 0, 1) % height);
  const int r = 4 + static_cast<int>(philox_word(seed, 0, 2) % (std::min(width, height) / 2 + 1));
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x) {
      const bool disc = (x - cx) * (x - cx) + (y - cy) * (y - cy) < r * r;
      for (int c = 0; c < 3; ++c) {
        int v = disc ? 40 + 60 * c : (x * (c + 1) * 255 / width + y * 255 / height) / (c + 2);
        v += static_cast<int>(philox_word(seed, 1 + c, y * width + x) % 17) - 8;
        rgb[(static_cast<std::size_t>(y) * width + x) * 3 + c] =
            static_cast<std::uint8_t>(std::clamp(v, 0, 255));
      }
    }
  return encode_jpeg_rgb(rgb.data(), width, height, 90);
}

// `count` images in `classes` classes under root() (the train split), sizes from 33 x 97 to 500 x
// 375.
struct PhotoFolder {
  ScratchDir dir;
  explicit PhotoFolder(int count, int classes) {
    const int sizes[][2] = {{500, 375}, {375, 500}, {64, 48}, {33, 97}, {256, 256}, {121, 80}};
    for (int i = 0; i < count; ++i) {
      const std::string cls = dir.file("train/class_" + std::to_string(i % classes));
      std::filesystem::create_directories(cls);
      std::vector<std::uint8_t> jpeg = photo_like_jpeg(sizes[i % 6][0], sizes[i % 6][1], 100 + i);
      write_file(cls + "/img_" + std::to_string(i) + ".jpg", jpeg.data(), jpeg.size());
    }
  }
  std::string root() const { return dir.file("train"); }
};

}  // namespace kiln::data::testing
