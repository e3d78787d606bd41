// The loader delivering to a GPU: batches staged in pinned memory, copied on the loader's own
// stream, equal to what the CPU loader delivers, and resumable with copies in flight; the batch
// resize kernel against the CPU transform, bit for bit.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/stream.h"
#include "data/cuda/resize_crop_cuda.h"
#include "data/image_datasets.h"
#include "data/image_transform.h"
#include "data/loader.h"
#include "data/token_dataset.h"

namespace kiln::data {
namespace {

const Device kGpu = Device::cuda(0);

std::uint32_t bits_of(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

LoaderOptions options_for(Device device, int workers) {
  LoaderOptions options;
  options.batch_size = 16;
  options.workers = workers;
  options.prefetch = 4;
  options.seed = 21;
  options.device = device;
  return options;
}

TEST(DataLoaderGpu, DeliversTheCpuBatchesOnTheDevice) {
  ASSERT_GT(cuda_device_count(), 0) << "no GPU: this suite is labelled gpu";
  auto dataset = std::make_shared<SyntheticImageDataset>(100, 3, 8, 8, 10, 5);
  DataLoader cpu(dataset, options_for(Device::cpu(), 2));
  std::uint64_t pinned_before = pinned_allocator().stats().allocations;
  DataLoader gpu(dataset, options_for(kGpu, 2));
  for (int i = 0; i < 15; ++i) {  // crosses two epoch boundaries (7 batches per epoch)
    Batch want = cpu.next();
    Batch got = gpu.next();
    ASSERT_TRUE(got.inputs.device() == kGpu);
    ASSERT_TRUE(got.targets.device() == kGpu);
    EXPECT_EQ(got.inputs.shape(), want.inputs.shape());
    EXPECT_EQ(got.sample_indices, want.sample_indices);
    // to_vector reads on the current stream, which next() made wait for the copy.
    EXPECT_EQ(got.inputs.to_vector<float>(), want.inputs.to_vector<float>());
    EXPECT_EQ(got.targets.to_vector<std::int64_t>(), want.targets.to_vector<std::int64_t>());
  }
  EXPECT_GT(pinned_allocator().stats().allocations, pinned_before);
}

TEST(DataLoaderGpu, StateCountsOnlyReturnedBatchesAndResumes) {
  auto dataset = std::make_shared<SyntheticTokenDataset>(90, 32, 1000, 8);
  DataLoader gpu(dataset, options_for(kGpu, 3));
  for (int i = 0; i < 4; ++i) gpu.next();
  LoaderState saved = gpu.state();  // a copy of batch 4 may be in flight already
  EXPECT_EQ(saved.epoch, 0);
  EXPECT_EQ(saved.next_batch, 4);
  std::vector<std::vector<std::int64_t>> expected;
  for (int i = 0; i < 6; ++i) expected.push_back(gpu.next().inputs.to_vector<std::int64_t>());

  DataLoader resumed(dataset, options_for(kGpu, 1));
  resumed.next();
  resumed.restore(saved);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(resumed.next().inputs.to_vector<std::int64_t>(), expected[i]) << "batch " << i;
  }
}

TEST(DataLoaderGpu, BatchesArriveOnANonDefaultConsumerStream) {
  auto dataset = std::make_shared<SyntheticImageDataset>(64, 3, 16, 16, 10, 2);
  DataLoader cpu(dataset, options_for(Device::cpu(), 0));
  DataLoader gpu(dataset, options_for(kGpu, 2));
  Stream compute = Stream::create(kGpu);
  StreamGuard guard(kGpu, compute.handle());
  for (int i = 0; i < 8; ++i) {
    Batch got = gpu.next();
    EXPECT_EQ(got.inputs.to_vector<float>(), cpu.next().inputs.to_vector<float>());
  }
}

// resize_crop_batch_cuda against resize_crop_hwc + shift_image_chw on the same pixels: every
// float equal bit for bit. Images of odd sizes (1 x 1 among them) packed into one buffer, boxes
// from the whole image down to one pixel, both mirrors, shifts from none to the whole output (all
// fill), square and non-square outputs (a swapped width and height would show).
TEST(ResizeCropGpu, EqualsTheCpuTransformBitForBit) {
  ASSERT_GT(cuda_device_count(), 0) << "no GPU: this suite is labelled gpu";
  const int image_sizes[][2] = {{37, 23}, {500, 375}, {64, 64}, {1, 1}, {3, 200}, {300, 2}};
  const int out_sizes[][2] = {{24, 24}, {224, 224}, {40, 17}};
  std::mt19937 rng(2026);
  auto uniform_int = [&rng](int lo, int hi) {  // [lo, hi]
    return std::uniform_int_distribution<int>(lo, hi)(rng);
  };
  auto uniform_float = [&rng](float lo, float hi) {
    return std::uniform_real_distribution<float>(lo, hi)(rng);
  };
  for (const auto& out_size : out_sizes) {
    const int out_w = out_size[0], out_h = out_size[1];
    SCOPED_TRACE("output " + std::to_string(out_w) + " x " + std::to_string(out_h));
    std::vector<std::uint8_t> pixels;
    std::vector<ResizeCropSample> samples;
    for (int i = 0; i < 36; ++i) {
      const int w = image_sizes[i % 6][0], h = image_sizes[i % 6][1];
      ResizeCropSample s;
      s.offset = static_cast<std::int64_t>(pixels.size());
      s.width = w;
      s.height = h;
      for (int k = 0; k < w * h * 3; ++k) pixels.push_back(static_cast<std::uint8_t>(rng()));
      // Odd gaps between images: a sample reading its neighbour's bytes would show.
      pixels.resize(pixels.size() + static_cast<std::size_t>(uniform_int(0, 5)), 0x5A);
      switch ((i / 6) % 3) {
        case 0:
          s.box = CropBox{0, 0, w, h};
          break;
        case 1: {  // tiny: one or two pixels on a side
          const int bw = uniform_int(1, std::min(w, 2)), bh = uniform_int(1, std::min(h, 2));
          s.box = CropBox{uniform_int(0, w - bw), uniform_int(0, h - bh), bw, bh};
          break;
        }
        default: {
          const int bw = uniform_int(1, w), bh = uniform_int(1, h);
          s.box = CropBox{uniform_int(0, w - bw), uniform_int(0, h - bh), bw, bh};
        }
      }
      s.flip = i % 2;
      switch (i % 4) {
        case 0:  // no shift
          break;
        case 1:
        case 2:
          s.shift_x = uniform_int(-4, 4);
          s.shift_y = uniform_int(-4, 4);
          break;
        default:  // up to the whole output: only fill at the ends
          s.shift_x = uniform_int(-out_w, out_w);
          s.shift_y = uniform_int(-out_h, out_h);
      }
      samples.push_back(s);
    }
    samples[3].shift_x = out_w;  // every pixel shifted in
    samples[7].shift_y = -out_h;

    ResizeCropParams p;
    p.out_width = out_w;
    p.out_height = out_h;
    for (int c = 0; c < 3; ++c) {
      p.mean[c] = uniform_float(0.0f, 1.0f);
      p.inv_std[c] = 1.0f / uniform_float(0.1f, 0.5f);
      p.fill[c] = uniform_float(-3.0f, 3.0f);
    }

    const std::size_t image = static_cast<std::size_t>(3) * out_w * out_h;
    std::vector<float> want(samples.size() * image);
    for (std::size_t i = 0; i < samples.size(); ++i) {
      const ResizeCropSample& s = samples[i];
      float* dst = want.data() + i * image;
      resize_crop_hwc(pixels.data() + s.offset, s.width, s.height, 3, s.box, out_w, out_h,
                      s.flip != 0, p.mean, p.inv_std, dst);
      shift_image_chw(dst, 3, out_h, out_w, s.shift_x, s.shift_y, p.fill);
    }

    Tensor d_pixels =
        Tensor::from_vector(pixels, {static_cast<std::int64_t>(pixels.size())}).to(kGpu);
    std::vector<std::uint8_t> sample_bytes(samples.size() * sizeof(ResizeCropSample));
    std::memcpy(sample_bytes.data(), samples.data(), sample_bytes.size());
    Tensor d_samples =
        Tensor::from_vector(sample_bytes, {static_cast<std::int64_t>(sample_bytes.size())})
            .to(kGpu);
    // Poisoned: a pixel the kernel never writes reads NaN, which equals nothing.
    const std::vector<float> poison(want.size(), std::numeric_limits<float>::quiet_NaN());
    Tensor d_out =
        Tensor::from_vector(poison, {static_cast<std::int64_t>(samples.size()), 3, out_h, out_w})
            .to(kGpu);
    resize_crop_batch_cuda(
        d_pixels.data<std::uint8_t>(), static_cast<const ResizeCropSample*>(d_samples.data()),
        static_cast<int>(samples.size()), p, d_out.data<float>(), current_stream(kGpu));
    const std::vector<float> got = d_out.to_vector<float>();  // reads on the current stream
    ASSERT_EQ(got.size(), want.size());

    std::size_t differ = 0, first = 0, filled = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && differ++ == 0) first = i;
      filled += want[i] == p.fill[(i / (image / 3)) % 3];
    }
    // The reference is mostly resized pixels, not the fill the shifts bring in.
    EXPECT_LT(filled, want.size() / 2);
    if (differ > 0) {
      const std::size_t n = first / image, c = first % image / (image / 3);
      const std::size_t y = first % (image / 3) / out_w, x = first % out_w;
      const ResizeCropSample& s = samples[n];
      ADD_FAILURE() << differ << " of " << got.size() << " floats differ; the first: sample " << n
                    << " (image " << s.width << " x " << s.height << ", box " << s.box.x << ","
                    << s.box.y << " " << s.box.width << " x " << s.box.height << ", flip " << s.flip
                    << ", shift " << s.shift_x << "," << s.shift_y << ") channel " << c << " y "
                    << y << " x " << x << ": GPU " << got[first] << " (0x" << std::hex
                    << bits_of(got[first]) << "), CPU " << want[first] << " (0x"
                    << bits_of(want[first]) << std::dec << ")";
    }
  }
}

}  // namespace
}  // namespace kiln::data
