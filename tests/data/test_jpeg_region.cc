// The CPU path's crop decode (data/jpeg_region_decoder.h) and the windowed resize after it: the
// pixels of a crop decoded alone equal the whole image's decode at every scale, subsampling and
// for progressive files; the resize of a window equals the resize of the whole image and a plain
// reference loop bit for bit; a JPEG folder gives the same samples with and without it; truncated
// files are still refused.

#include <gtest/gtest.h>
#include <turbojpeg.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/random.h"
#include "data/file_io.h"
#include "data/image_datasets.h"
#include "data/image_transform.h"
#include "data/jpeg_region_decoder.h"
#include "tests/data/photo_folder.h"
#include "tests/data/test_util.h"

namespace kiln::data {
namespace {

using testing::expect_input_error;
using testing::PhotoFolder;

std::vector<std::uint8_t> photo_rgb(int width, int height, std::uint64_t seed) {
  std::vector<std::uint8_t> rgb(static_cast<std::size_t>(width) * height * 3);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      for (int c = 0; c < 3; ++c) {
        int v = (x * (c + 1) * 255 / width + y * 255 / height) / (c + 2);
        v += static_cast<int>(philox_word(seed, c, static_cast<std::uint64_t>(y) * width + x) % 61);
        rgb[(static_cast<std::size_t>(y) * width + x) * 3 + c] = static_cast<std::uint8_t>(v);
      }
    }
  }
  return rgb;
}

std::vector<std::uint8_t> encode(int width, int height, int subsampling, bool progressive,
                                 std::uint64_t seed) {
  const std::vector<std::uint8_t> rgb = photo_rgb(width, height, seed);
  tjhandle encoder = tjInitCompress();
  unsigned char* out = nullptr;
  unsigned long size = 0;
  const int flags = progressive ? TJFLAG_PROGRESSIVE : 0;
  EXPECT_EQ(tjCompress2(encoder, rgb.data(), width, 0, height, TJPF_RGB, &out, &size, subsampling,
                        88, flags),
            0)
      << tjGetErrorStr2(encoder);
  std::vector<std::uint8_t> jpeg(out, out + size);
  tjFree(out);
  tjDestroy(encoder);
  return jpeg;
}

// Parts of every kind: the whole image, single pixels at the corners, strips along each edge,
// and random boxes.
std::vector<CropBox> parts(int width, int height, std::uint64_t seed) {
  std::vector<CropBox> out = {{0, 0, width, height},
                              {0, 0, 1, 1},
                              {width - 1, height - 1, 1, 1},
                              {width - 1, 0, 1, height},
                              {0, height - 1, width, 1}};
  for (std::uint64_t i = 0; i < 24; ++i) {
    const int w = 1 + static_cast<int>(philox_word(seed, 7, 4 * i) % width);
    const int h = 1 + static_cast<int>(philox_word(seed, 7, 4 * i + 1) % height);
    out.push_back(CropBox{static_cast<int>(philox_word(seed, 7, 4 * i + 2) % (width - w + 1)),
                          static_cast<int>(philox_word(seed, 7, 4 * i + 3) % (height - h + 1)), w,
                          h});
  }
  return out;
}

TEST(JpegRegion, PixelsOfThePartEqualTheWholeDecode) {
  struct Encoding {
    int subsampling;
    bool progressive;
  };
  const Encoding encodings[] = {{TJSAMP_420, false}, {TJSAMP_422, false},  {TJSAMP_444, false},
                                {TJSAMP_440, false}, {TJSAMP_GRAY, false}, {TJSAMP_420, true}};
  const int sizes[][2] = {{500, 375}, {121, 80}, {33, 97}, {17, 9}};
  DecodedRegion region;
  int checked = 0;
  std::uint64_t seed = 1;
  for (const Encoding& e : encodings) {
    for (const auto& size : sizes) {
      const std::vector<std::uint8_t> jpeg =
          encode(size[0], size[1], e.subsampling, e.progressive, ++seed);
      for (int eighths : {8, 4, 2, 1}) {
        std::vector<std::uint8_t> whole;
        int width = 0, height = 0;
        std::string error;
        ASSERT_TRUE(
            decode_jpeg_rgb(jpeg.data(), jpeg.size(), &whole, &width, &height, &error, eighths))
            << error;
        ASSERT_EQ(width, jpeg_scaled_size(size[0], eighths));
        ASSERT_EQ(height, jpeg_scaled_size(size[1], eighths));
        for (const CropBox& part : parts(width, height, seed)) {
          SCOPED_TRACE("subsampling " + std::to_string(e.subsampling) + " progressive " +
                       std::to_string(e.progressive) + ", " + std::to_string(size[0]) + "x" +
                       std::to_string(size[1]) + " at " + std::to_string(eighths) + "/8, part " +
                       std::to_string(part.x) + "," + std::to_string(part.y) + " " +
                       std::to_string(part.width) + "x" + std::to_string(part.height));
          ASSERT_TRUE(decode_jpeg_region(jpeg.data(), jpeg.size(), eighths, part, &region, &error))
              << error;
          ASSERT_EQ(region.width, width);
          ASSERT_EQ(region.height, height);
          ASSERT_LE(region.x0, part.x);
          ASSERT_LE(region.y0, part.y);
          ASSERT_GE(region.x0 + region.columns, part.x + part.width);
          ASSERT_GE(region.y0 + region.rows, part.y + part.height);
          for (int y = part.y; y < part.y + part.height; ++y) {
            const std::uint8_t* want =
                whole.data() + (static_cast<std::size_t>(y) * width + part.x) * 3;
            const std::uint8_t* got =
                region.rgb.data() +
                (static_cast<std::size_t>(y - region.y0) * region.columns + part.x - region.x0) * 3;
            ASSERT_TRUE(std::equal(want, want + 3 * part.width, got)) << "row " << y;
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 6 * 4 * 4 * 29);
}

TEST(JpegRegion, ACropOfALargeImageDecodesFewerRowsAndColumns) {
  const std::vector<std::uint8_t> jpeg = encode(500, 375, TJSAMP_420, false, 3);
  DecodedRegion region;
  std::string error;
  ASSERT_TRUE(
      decode_jpeg_region(jpeg.data(), jpeg.size(), 8, CropBox{200, 100, 50, 40}, &region, &error))
      << error;
  EXPECT_EQ(region.y0, 99);
  EXPECT_EQ(region.rows, 42);
  EXPECT_LE(region.columns, 52 + 2 * 16);  // widened to whole iMCU columns (16 pixels at 4:2:0)
}

TEST(JpegRegion, TruncatedAndForeignFilesAreRefused) {
  const std::vector<std::uint8_t> jpeg = encode(121, 80, TJSAMP_420, false, 4);
  DecodedRegion region;
  std::string error;
  // Cut in the middle of the scan: no end-of-image marker, so it is read to its end and fails
  // even for a part above the cut.
  const std::vector<std::uint8_t> cut(jpeg.begin(), jpeg.begin() + jpeg.size() * 2 / 3);
  EXPECT_FALSE(jpeg_ends_with_eoi(cut.data(), cut.size()));
  EXPECT_FALSE(decode_jpeg_region(cut.data(), cut.size(), 8, CropBox{0, 0, 8, 8}, &region, &error));
  EXPECT_NE(error.find("Premature end"), std::string::npos) << error;
  const std::string text = "not a JPEG at all, just some text long enough to be read";
  EXPECT_FALSE(decode_jpeg_region(reinterpret_cast<const std::uint8_t*>(text.data()), text.size(),
                                  8, CropBox{0, 0, 1, 1}, &region, &error));
  EXPECT_FALSE(error.empty());
  // The decoder is usable again after a failure.
  EXPECT_TRUE(
      decode_jpeg_region(jpeg.data(), jpeg.size(), 8, CropBox{5, 5, 20, 20}, &region, &error))
      << error;
}

// The resize as first written: one output pixel at a time, the taps in double, the blend in
// float. The windowed resize reorders the loops but must keep these operations exactly (the GPU
// kernel, data/cuda/resize_crop.cu, repeats them too).
void reference_resize(const std::uint8_t* src, int width, int height, CropBox box, int out_width,
                      int out_height, bool flip, const float* mean, const float* inv_std,
                      float* dst) {
  auto tap = [](int i, int out, int start, int extent, int limit, int* i0, int* i1, float* w1) {
    double s = start + (i + 0.5) * (static_cast<double>(extent) / out) - 0.5;
    s = std::clamp(s, 0.0, static_cast<double>(limit - 1));
    *i0 = static_cast<int>(s);
    *i1 = std::min(*i0 + 1, limit - 1);
    *w1 = static_cast<float>(s - *i0);
  };
  for (int y = 0; y < out_height; ++y) {
    int y0 = 0, y1 = 0;
    float wy = 0;
    tap(y, out_height, box.y, box.height, height, &y0, &y1, &wy);
    for (int x = 0; x < out_width; ++x) {
      int x0 = 0, x1 = 0;
      float wx = 0;
      tap(flip ? out_width - 1 - x : x, out_width, box.x, box.width, width, &x0, &x1, &wx);
      for (int c = 0; c < 3; ++c) {
        auto at = [&](int row, int col) {
          return src[(static_cast<std::size_t>(row) * width + col) * 3 + c];
        };
        float top = at(y0, x0) + (at(y0, x1) - at(y0, x0)) * wx;
        float bottom = at(y1, x0) + (at(y1, x1) - at(y1, x0)) * wx;
        float value = (top + (bottom - top) * wy) * (1.0f / 255.0f);
        dst[(static_cast<std::size_t>(c) * out_height + y) * out_width + x] =
            (value - mean[c]) * inv_std[c];
      }
    }
  }
}

TEST(JpegRegion, ResizeOfAWindowEqualsTheWholeImageAndTheReference) {
  const int width = 97, height = 61;
  const std::vector<std::uint8_t> image = photo_rgb(width, height, 9);
  const float mean[3] = {0.485f, 0.456f, 0.406f};
  const float inv_std[3] = {1 / 0.229f, 1 / 0.224f, 1 / 0.225f};
  for (const CropBox& box : parts(width, height, 11)) {
    for (int out : {1, 7, 32, 150}) {
      for (bool flip : {false, true}) {
        SCOPED_TRACE("box " + std::to_string(box.x) + "," + std::to_string(box.y) + " " +
                     std::to_string(box.width) + "x" + std::to_string(box.height) + " to " +
                     std::to_string(out) + (flip ? " flipped" : ""));
        const std::size_t n = 3 * static_cast<std::size_t>(out) * (out + 3);
        std::vector<float> reference(n), whole(n), windowed(n);
        reference_resize(image.data(), width, height, box, out, out + 3, flip, mean, inv_std,
                         reference.data());
        resize_crop_hwc(image.data(), width, height, 3, box, out, out + 3, flip, mean, inv_std,
                        whole.data());
        const CropBox held = resize_footprint(box, width, height);
        std::vector<std::uint8_t> part(static_cast<std::size_t>(held.width) * held.height * 3);
        for (int y = 0; y < held.height; ++y) {
          const std::uint8_t* row =
              image.data() + (static_cast<std::size_t>(held.y + y) * width + held.x) * 3;
          std::copy(row, row + 3 * held.width,
                    part.data() + static_cast<std::size_t>(y) * held.width * 3);
        }
        resize_crop_window(
            PixelWindow{part.data(), held.x, held.y, held.width, held.height, width, height}, 3,
            box, out, out + 3, flip, mean, inv_std, windowed.data());
        ASSERT_EQ(whole, reference);
        ASSERT_EQ(windowed, reference);
      }
    }
  }
}

TEST(JpegRegion, AWindowWithoutTheFootprintIsAnError) {
  const std::vector<std::uint8_t> image(10 * 10 * 3, 128);
  const float mean[3] = {0, 0, 0}, inv_std[3] = {1, 1, 1};
  std::vector<float> out(3 * 4 * 4);
  EXPECT_THROW(resize_crop_window(PixelWindow{image.data(), 2, 2, 4, 4, 20, 20}, 3,
                                  CropBox{2, 2, 4, 4}, 4, 4, false, mean, inv_std, out.data()),
               Error);
}

TEST(JpegRegion, AFolderGivesTheSameSamplesWithAndWithoutIt) {
  PhotoFolder folder(24, 3);
  JpegFolderOptions options;
  options.image_size = 56;
  options.crop_padding = 3;
  JpegFolderOptions whole = options;
  whole.region_decode = false;
  JpegFolderDataset cropped_set(folder.root(), options), whole_set(folder.root(), whole);
  std::vector<float> a(3 * 56 * 56), b(3 * 56 * 56);
  std::int64_t label_a = -1, label_b = -2;
  for (bool train : {true, false}) {
    for (std::uint64_t epoch = 0; epoch < (train ? 4u : 1u); ++epoch) {
      for (std::int64_t i = 0; i < cropped_set.size(); ++i) {
        const SampleContext context{5, epoch, static_cast<std::uint64_t>(i), train};
        ASSERT_TRUE(cropped_set.get(i, context, a.data(), &label_a));
        ASSERT_TRUE(whole_set.get(i, context, b.data(), &label_b));
        ASSERT_EQ(a, b) << "sample " << i << " epoch " << epoch << " train " << train;
        ASSERT_EQ(label_a, label_b);
      }
    }
  }
}

TEST(JpegRegion, ATruncatedFileInAFolderIsStillRefused) {
  PhotoFolder folder(3, 1);
  const std::string path = folder.root() + "/class_0/img_1.jpg";
  std::vector<std::uint8_t> jpeg = read_file(path);
  jpeg.resize(jpeg.size() * 3 / 4);
  write_file(path, jpeg.data(), jpeg.size());
  JpegFolderOptions options;
  options.image_size = 32;
  options.scale_min = options.scale_max = 0.1;  // small crops, often above the cut
  JpegFolderDataset dataset(folder.root(), options);
  ASSERT_EQ(dataset.file(1), path);
  std::vector<float> image(3 * 32 * 32);
  std::int64_t label = 0;
  for (std::uint64_t epoch = 0; epoch < 6; ++epoch) {
    expect_input_error(
        [&] {
          dataset.get(1, SampleContext{1, epoch, 1, true}, image.data(), &label);
        },
        {path, "corrupt JPEG", "Premature end"});
  }
}

}  // namespace
}  // namespace kiln::data
