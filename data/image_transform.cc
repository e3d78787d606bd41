#include "data/image_transform.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/check.h"

namespace kiln::data {

void Normalization::expand(int channels, std::vector<float>* mean_out,
                           std::vector<float>* inv_std_out) const {
  auto spread = [channels](const std::vector<float>& values, float fallback, const char* name) {
    if (values.empty()) return std::vector<float>(channels, fallback);
    if (values.size() == 1) return std::vector<float>(channels, values[0]);
    if (static_cast<int>(values.size()) != channels) {
      throw InputError(std::string("normalisation ") + name + " has " +
                       std::to_string(values.size()) + " values for " + std::to_string(channels) +
                       " channels");
    }
    return values;
  };
  *mean_out = spread(mean, 0.0f, "mean");
  std::vector<float> sd = spread(stddev, 1.0f, "stddev");
  inv_std_out->resize(channels);
  for (int c = 0; c < channels; ++c) {
    if (!(sd[c] > 0.0f)) {
      throw InputError("normalisation stddev must be positive, got " + std::to_string(sd[c]));
    }
    (*inv_std_out)[c] = 1.0f / sd[c];
  }
}

void augment_image_chw(const std::uint8_t* src, int channels, int height, int width,
                       const ImageAugment& augment, const SampleContext& context, float* dst) {
  std::vector<float> mean, inv_std;
  augment.normalization.expand(channels, &mean, &inv_std);
  int pad = context.train ? augment.crop_padding : 0;
  // The crop's top-left corner in padded coordinates, shifted back to the source's.
  int shift_x = pad > 0 ? static_cast<int>(context.below(0, 2 * pad + 1)) - pad : 0;
  int shift_y = pad > 0 ? static_cast<int>(context.below(1, 2 * pad + 1)) - pad : 0;
  bool flip = context.train && augment.horizontal_flip && (context.word(2) & 1u);
  if (context.train && augment.random_resized_crop()) {
    // The resize reads interleaved pixels: a (H, W, C) copy, then crop, resize, flip, normalise
    // in one pass, then the padded crop on the result.
    std::vector<std::uint8_t> hwc(static_cast<std::size_t>(channels) * height * width);
    for (int c = 0; c < channels; ++c) {
      for (std::size_t i = 0; i < static_cast<std::size_t>(height) * width; ++i) {
        hwc[i * channels + c] = src[static_cast<std::size_t>(c) * height * width + i];
      }
    }
    CropBox box = random_resized_crop_box(width, height, augment.resized_crop_scale_min,
                                          augment.resized_crop_scale_max, kResizedCropRatioMin,
                                          kResizedCropRatioMax, context, 4);
    resize_crop_hwc(hwc.data(), width, height, channels, box, width, height, flip, mean.data(),
                    inv_std.data(), dst);
    if (pad > 0) {
      std::vector<float> fill(channels);
      for (int c = 0; c < channels; ++c) fill[c] = (0.0f - mean[c]) * inv_std[c];
      shift_image_chw(dst, channels, height, width, shift_x, shift_y, fill.data());
    }
    return;
  }
  constexpr float kScale = 1.0f / 255.0f;
  for (int c = 0; c < channels; ++c) {
    const std::uint8_t* plane = src + static_cast<std::size_t>(c) * height * width;
    float* out = dst + static_cast<std::size_t>(c) * height * width;
    float padded = (0.0f - mean[c]) * inv_std[c];  // a black padding pixel
    for (int y = 0; y < height; ++y) {
      int sy = y + shift_y;
      float* row = out + static_cast<std::size_t>(y) * width;
      if (sy < 0 || sy >= height) {
        std::fill(row, row + width, padded);
        continue;
      }
      const std::uint8_t* src_row = plane + static_cast<std::size_t>(sy) * width;
      for (int x = 0; x < width; ++x) {
        int sx = (flip ? width - 1 - x : x) + shift_x;
        row[x] = (sx < 0 || sx >= width) ? padded : (src_row[sx] * kScale - mean[c]) * inv_std[c];
      }
    }
  }
}

void shift_image_chw(float* image, int channels, int height, int width, int shift_x, int shift_y,
                     const float* fill) {
  if (shift_x == 0 && shift_y == 0) return;
  std::vector<float> source(image, image + static_cast<std::size_t>(channels) * height * width);
  for (int c = 0; c < channels; ++c) {
    const float* in = source.data() + static_cast<std::size_t>(c) * height * width;
    float* out = image + static_cast<std::size_t>(c) * height * width;
    for (int y = 0; y < height; ++y) {
      int sy = y + shift_y;
      for (int x = 0; x < width; ++x) {
        int sx = x + shift_x;
        bool inside = sy >= 0 && sy < height && sx >= 0 && sx < width;
        out[static_cast<std::size_t>(y) * width + x] =
            inside ? in[static_cast<std::size_t>(sy) * width + sx] : fill[c];
      }
    }
  }
}

CropBox random_resized_crop_box(int width, int height, double scale_min, double scale_max,
                                double ratio_min, double ratio_max, const SampleContext& context,
                                std::uint64_t first_word) {
  double area = static_cast<double>(width) * height;
  double log_min = std::log(ratio_min), log_max = std::log(ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    std::uint64_t w = first_word + 4 * attempt;
    double target = area * (scale_min + (scale_max - scale_min) * context.uniform(w));
    double ratio = std::exp(log_min + (log_max - log_min) * context.uniform(w + 1));
    int crop_w = static_cast<int>(std::lround(std::sqrt(target * ratio)));
    int crop_h = static_cast<int>(std::lround(std::sqrt(target / ratio)));
    if (crop_w > 0 && crop_h > 0 && crop_w <= width && crop_h <= height) {
      CropBox box;
      box.width = crop_w;
      box.height = crop_h;
      box.x = static_cast<int>(context.below(w + 2, width - crop_w + 1));
      box.y = static_cast<int>(context.below(w + 3, height - crop_h + 1));
      return box;
    }
  }
  // Fallback: the whole image cropped centrally to the nearest allowed aspect ratio.
  double ratio = static_cast<double>(width) / height;
  CropBox box{0, 0, width, height};
  if (ratio < ratio_min) {
    box.height = std::max(1, static_cast<int>(std::lround(width / ratio_min)));
  } else if (ratio > ratio_max) {
    box.width = std::max(1, static_cast<int>(std::lround(height * ratio_max)));
  }
  box.x = (width - box.width) / 2;
  box.y = (height - box.height) / 2;
  return box;
}

CropBox center_crop_box(int width, int height, double fraction) {
  int side = std::max(1, static_cast<int>(std::lround(std::min(width, height) * fraction)));
  return CropBox{(width - side) / 2, (height - side) / 2, side, side};
}

void resize_crop_hwc(const std::uint8_t* src, int width, int height, int channels, CropBox box,
                     int out_width, int out_height, bool flip, const float* mean,
                     const float* inv_std, float* dst) {
  resize_crop_window(PixelWindow{src, 0, 0, width, height, width, height}, channels, box, out_width,
                     out_height, flip, mean, inv_std, dst);
}

CropBox resize_footprint(CropBox box, int width, int height) {
  const int x0 = std::max(box.x - 1, 0), y0 = std::max(box.y - 1, 0);
  const int x1 = std::min(box.x + box.width, width - 1);
  const int y1 = std::min(box.y + box.height, height - 1);
  return CropBox{x0, y0, x1 - x0 + 1, y1 - y0 + 1};
}

void resize_crop_window(const PixelWindow& src, int channels, CropBox box, int out_width,
                        int out_height, bool flip, const float* mean, const float* inv_std,
                        float* dst) {
  // Half-pixel centres (align_corners=false), clamped at the image border; i0 and i1 relative to
  // the window's first column or row.
  struct Tap {
    int i0, i1;
    float w1;
  };
  auto taps = [](int out, int start, int extent, int limit, int origin, int held) {
    std::vector<Tap> t(out);
    double step = static_cast<double>(extent) / out;
    for (int i = 0; i < out; ++i) {
      double s = start + (i + 0.5) * step - 0.5;
      s = std::clamp(s, 0.0, static_cast<double>(limit - 1));
      int i0 = static_cast<int>(s);
      int i1 = std::min(i0 + 1, limit - 1);
      KILN_CHECK(i0 >= origin && i1 < origin + held,
                 "resize_crop_window: the window does not hold the crop's footprint");
      t[i] = Tap{i0 - origin, i1 - origin, static_cast<float>(s - i0)};
    }
    return t;
  };
  std::vector<Tap> xs = taps(out_width, box.x, box.width, src.width, src.x0, src.columns);
  const std::vector<Tap> ys = taps(out_height, box.y, box.height, src.height, src.y0, src.rows);
  if (flip) std::reverse(xs.begin(), xs.end());
  // Each source row is blended horizontally once, into planar floats, and kept while the next
  // output row still reads it; the vertical blend and normalisation then run along whole rows.
  const std::size_t row_floats = static_cast<std::size_t>(out_width) * channels;
  std::vector<float> blended(2 * row_floats);
  int held_row[2] = {-1, -1};
  auto blend = [&](int row, int keep) -> const float* {
    for (int k = 0; k < 2; ++k) {
      if (held_row[k] == row) return blended.data() + k * row_floats;
    }
    const int k = held_row[0] == keep ? 1 : 0;
    float* out = blended.data() + k * row_floats;
    const std::uint8_t* r = src.pixels + static_cast<std::size_t>(row) * src.columns * channels;
    for (int x = 0; x < out_width; ++x) {
      const std::uint8_t* a = r + xs[x].i0 * channels;
      const std::uint8_t* b = r + xs[x].i1 * channels;
      const float w = xs[x].w1;
      for (int ch = 0; ch < channels; ++ch) out[ch * out_width + x] = a[ch] + (b[ch] - a[ch]) * w;
    }
    held_row[k] = row;
    return out;
  };
  constexpr float kScale = 1.0f / 255.0f;
  const std::size_t plane = static_cast<std::size_t>(out_width) * out_height;
  for (int y = 0; y < out_height; ++y) {
    const float* top = blend(ys[y].i0, ys[y].i1);
    const float* bottom = blend(ys[y].i1, ys[y].i0);
    const float wy = ys[y].w1;
    for (int ch = 0; ch < channels; ++ch) {
      const float* t = top + static_cast<std::size_t>(ch) * out_width;
      const float* b = bottom + static_cast<std::size_t>(ch) * out_width;
      float* out = dst + ch * plane + static_cast<std::size_t>(y) * out_width;
      const float m = mean[ch], inv = inv_std[ch];
      for (int x = 0; x < out_width; ++x) {
        const float value = (t[x] + (b[x] - t[x]) * wy) * kScale;
        out[x] = (value - m) * inv;
      }
    }
  }
}

}  // namespace kiln::data
