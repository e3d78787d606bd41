// Augmentation properties: flip is a mirror, the padded crop is a shift that keeps the shape,
// normalisation gives the stated statistics, random-resized-crop boxes stay in range.

#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <utility>

#include "data/image_transform.h"
#include "tests/data/test_util.h"

namespace kiln::data {
namespace {

constexpr int kC = 3, kH = 6, kW = 7;

std::vector<std::uint8_t> test_image() {
  std::vector<std::uint8_t> image(kC * kH * kW);
  for (std::size_t i = 0; i < image.size(); ++i) image[i] = static_cast<std::uint8_t>(1 + i * 5);
  return image;
}

std::vector<float> augmented(const std::vector<std::uint8_t>& image, const ImageAugment& augment,
                             const SampleContext& context) {
  std::vector<float> out(image.size(), -999.0f);
  augment_image_chw(image.data(), kC, kH, kW, augment, context, out.data());
  return out;
}

float at(const std::vector<float>& image, int c, int y, int x) {
  return image[(c * kH + y) * kW + x];
}

TEST(Augment, EvalIsScalingAndNormalisationOnly) {
  std::vector<std::uint8_t> image = test_image();
  ImageAugment augment;
  augment.crop_padding = 3;
  augment.horizontal_flip = true;
  augment.normalization = Normalization{{0.1f, 0.2f, 0.3f}, {0.5f, 0.25f, 2.0f}};
  SampleContext context{1, 2, 3, /*train=*/false};
  std::vector<float> out = augmented(image, augment, context);
  const float mean[3] = {0.1f, 0.2f, 0.3f}, stddev[3] = {0.5f, 0.25f, 2.0f};
  for (int c = 0; c < kC; ++c)
    for (int y = 0; y < kH; ++y)
      for (int x = 0; x < kW; ++x) {
        float expected = (image[(c * kH + y) * kW + x] / 255.0f - mean[c]) / stddev[c];
        ASSERT_NEAR(at(out, c, y, x), expected, 1e-6);
      }
}

TEST(Augment, RandomResizedCropOfAFixedSizeImageKeepsItsSizeAndActsOnlyInTraining) {
  std::vector<std::uint8_t> image = test_image();
  ImageAugment plain;
  plain.normalization = Normalization{{0.5f}, {0.25f}};
  ImageAugment crop = plain;
  crop.resized_crop_scale_min = 0.1;
  crop.resized_crop_scale_max = 0.4;
  int changed = 0;
  for (std::uint64_t index = 0; index < 16; ++index) {
    SampleContext eval{4, 0, index, /*train=*/false};
    EXPECT_EQ(augmented(image, crop, eval), augmented(image, plain, eval));
    SampleContext train{4, 0, index, /*train=*/true};
    std::vector<float> out = augmented(image, crop, train);
    changed += out != augmented(image, plain, train);
    // A bilinear resize of a part stays within the image's normalised range.
    for (float v : out) ASSERT_TRUE(v >= -2.0f - 1e-5f && v <= 2.0f + 1e-5f) << v;
  }
  EXPECT_GE(changed, 14);  // at most 40 % of the area: almost never the whole image
}

TEST(Augment, FlipIsAMirrorChosenHalfTheTime) {
  std::vector<std::uint8_t> image = test_image();
  ImageAugment plain;
  ImageAugment flipping;
  flipping.horizontal_flip = true;
  int flipped = 0;
  const int trials = 2000;
  for (int i = 0; i < trials; ++i) {
    SampleContext context{7, 0, static_cast<std::uint64_t>(i), true};
    std::vector<float> reference = augmented(image, plain, context);
    std::vector<float> out = augmented(image, flipping, context);
    bool mirror = true, same = true;
    for (int c = 0; c < kC; ++c)
      for (int y = 0; y < kH; ++y)
        for (int x = 0; x < kW; ++x) {
          mirror = mirror && at(out, c, y, x) == at(reference, c, y, kW - 1 - x);
          same = same && at(out, c, y, x) == at(reference, c, y, x);
        }
    ASSERT_TRUE(mirror != same) << "neither the image nor its mirror, trial " << i;
    flipped += mirror;
  }
  EXPECT_NEAR(static_cast<double>(flipped) / trials, 0.5, 0.05);
}

TEST(Augment, PaddedCropIsAShiftKeepingTheShape) {
  std::vector<std::uint8_t> image = test_image();
  ImageAugment augment;
  augment.crop_padding = 2;
  std::set<std::pair<int, int>> shifts_seen;
  for (int i = 0; i < 400; ++i) {
    SampleContext context{5, 1, static_cast<std::uint64_t>(i), true};
    std::vector<float> out = augmented(image, augment, context);
    ASSERT_EQ(out.size(), image.size());
    // Find the shift (dx, dy) in [-2, 2]^2 that explains every pixel, padding black (0).
    int matches = 0;
    for (int dy = -2; dy <= 2; ++dy)
      for (int dx = -2; dx <= 2; ++dx) {
        bool ok = true;
        for (int c = 0; c < kC && ok; ++c)
          for (int y = 0; y < kH && ok; ++y)
            for (int x = 0; x < kW && ok; ++x) {
              int sy = y + dy, sx = x + dx;
              float expected = (sy < 0 || sy >= kH || sx < 0 || sx >= kW)
                                   ? 0.0f
                                   : image[(c * kH + sy) * kW + sx] / 255.0f;
              ok = std::fabs(at(out, c, y, x) - expected) < 1e-6f;
            }
        if (ok) {
          ++matches;
          shifts_seen.insert({dx, dy});
        }
      }
    ASSERT_EQ(matches, 1) << "trial " << i;
  }
  EXPECT_EQ(shifts_seen.size(), 25u);  // every shift of the 5 x 5 occurs
}

TEST(Augment, NormalisationWithDatasetStatisticsGivesZeroMeanUnitStd) {
  // 200 random images; normalising with their own per-channel statistics gives mean 0, std 1.
  const int count = 200;
  std::vector<std::uint8_t> images(count * kC * kH * kW);
  for (std::size_t i = 0; i < images.size(); ++i) {
    int channel = static_cast<int>((i / (kH * kW)) % kC);
    images[i] = static_cast<std::uint8_t>(40 * channel + philox_word(1, 0, i) % 120);
  }
  double sum[kC] = {0}, sum_sq[kC] = {0};
  const double per_channel = static_cast<double>(count) * kH * kW;
  for (std::size_t i = 0; i < images.size(); ++i) {
    int channel = static_cast<int>((i / (kH * kW)) % kC);
    double v = images[i] / 255.0;
    sum[channel] += v;
    sum_sq[channel] += v * v;
  }
  ImageAugment augment;
  for (int c = 0; c < kC; ++c) {
    double mean = sum[c] / per_channel;
    augment.normalization.mean.push_back(static_cast<float>(mean));
    augment.normalization.stddev.push_back(
        static_cast<float>(std::sqrt(sum_sq[c] / per_channel - mean * mean)));
  }
  augment.horizontal_flip = true;  // flips do not change the statistics
  double out_sum[kC] = {0}, out_sq[kC] = {0};
  std::vector<float> out(kC * kH * kW);
  for (int n = 0; n < count; ++n) {
    SampleContext context{2, 0, static_cast<std::uint64_t>(n), true};
    augment_image_chw(images.data() + n * kC * kH * kW, kC, kH, kW, augment, context, out.data());
    for (std::size_t i = 0; i < out.size(); ++i) {
      int channel = static_cast<int>(i / (kH * kW));
      out_sum[channel] += out[i];
      out_sq[channel] += out[i] * out[i];
    }
  }
  for (int c = 0; c < kC; ++c) {
    double mean = out_sum[c] / per_channel;
    EXPECT_NEAR(mean, 0.0, 1e-4) << "channel " << c;
    EXPECT_NEAR(std::sqrt(out_sq[c] / per_channel - mean * mean), 1.0, 1e-4) << "channel " << c;
  }
  ImageAugment bad;
  bad.normalization = Normalization{{0.5f, 0.5f}, {}};
  testing::expect_input_error([&] { augmented(test_image(), bad, SampleContext()); },
                              {"2 values for 3 channels"});
  bad.normalization = Normalization{{}, {0.0f}};
  testing::expect_input_error([&] { augmented(test_image(), bad, SampleContext()); },
                              {"stddev must be positive"});
}

TEST(Augment, RandomResizedCropBoxesStayInRange) {
  for (auto [w, h] : {std::pair<int, int>{500, 375}, {64, 64}, {1000, 20}}) {
    double area_sum = 0;
    for (int i = 0; i < 500; ++i) {
      SampleContext context{9, 0, static_cast<std::uint64_t>(i), true};
      CropBox box = random_resized_crop_box(w, h, 0.08, 1.0, 3.0 / 4, 4.0 / 3, context, 4);
      ASSERT_GE(box.x, 0);
      ASSERT_GE(box.y, 0);
      ASSERT_GT(box.width, 0);
      ASSERT_GT(box.height, 0);
      ASSERT_LE(box.x + box.width, w);
      ASSERT_LE(box.y + box.height, h);
      double share = static_cast<double>(box.width) * box.height / (static_cast<double>(w) * h);
      if (w == 1000) {
        // 50:1 never fits the ratio range: the fallback, a central crop of ratio 4:3.
        ASSERT_EQ(box.height, 20);
        ASSERT_EQ(box.width, 27);
      } else {
        ASSERT_GE(share, 0.075);  // scale_min, give or take the rounding of the sides
      }
      area_sum += share;
    }
    // Large shares are rejected more often (a side would not fit), so below U(0.08, 1)'s 0.54.
    if (w == 500) {
      EXPECT_GT(area_sum / 500, 0.3);
      EXPECT_LT(area_sum / 500, 0.54);
    }
  }
  CropBox center = center_crop_box(256, 300, 0.875);
  EXPECT_EQ(center.width, 224);
  EXPECT_EQ(center.height, 224);
  EXPECT_EQ(center.x, 16);
  EXPECT_EQ(center.y, 38);
}

TEST(Augment, ResizeOfTheWholeImageAtTheSameSizeIsExactAndFlipMirrors) {
  const int w = 9, h = 4;
  std::vector<std::uint8_t> rgb(w * h * 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c)
        rgb[(y * w + x) * 3 + c] = static_cast<std::uint8_t>(x * 20 + y + c);
  const float mean[3] = {0, 0, 0}, inv_std[3] = {1, 1, 1};
  std::vector<float> out(3 * w * h), flipped(3 * w * h);
  resize_crop_hwc(rgb.data(), w, h, 3, CropBox{0, 0, w, h}, w, h, false, mean, inv_std, out.data());
  resize_crop_hwc(rgb.data(), w, h, 3, CropBox{0, 0, w, h}, w, h, true, mean, inv_std,
                  flipped.data());
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x) {
        ASSERT_NEAR(out[(c * h + y) * w + x], rgb[(y * w + x) * 3 + c] / 255.0f, 1e-6);
        ASSERT_EQ(flipped[(c * h + y) * w + x], out[(c * h + y) * w + (w - 1 - x)]);
      }
  // Halving a horizontal ramp averages neighbouring columns.
  std::vector<float> half(3 * 2 * 4);
  resize_crop_hwc(rgb.data(), w, h, 3, CropBox{0, 0, 8, 4}, 4, 2, false, mean, inv_std,
                  half.data());
  EXPECT_NEAR(half[0] * 255.0f, (0 + 20) / 2.0f + 0.5f, 1e-3);  // columns 0-1, rows 0-1
}

}  // namespace
}  // namespace kiln::data
