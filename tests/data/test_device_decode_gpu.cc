// data.decode GPU on the GPU (the resize kernel alone is in test_loader_gpu): nvJPEG's batches
// against the CPU loader (same samples, order and labels; pixels within the decoders'
// rounding, measured and printed), both of nvJPEG's decoders (the hardware engine, and the CUDA
// one an RTX 4090 takes, forced by KILN_NVJPEG_BACKEND=gpu), the corrupt-file policy and resume.

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/random.h"
#include "core/stream.h"
#include "data/device_decode.h"
#include "data/file_io.h"
#include "data/image_datasets.h"
#include "data/loader.h"
#include "tests/data/photo_folder.h"
#include "tests/data/test_util.h"

namespace kiln::data {
namespace {

using testing::PhotoFolder;

const Device kGpu = Device::cuda(0);

JpegFolderOptions folder_options(bool train) {
  JpegFolderOptions o;
  o.image_size = 64;
  o.crop_padding = train ? 4 : 0;
  o.random_resized_crop = train;
  o.dct_scaling = false;  // both paths decode at full size
  return o;
}

LoaderOptions loader_options(Device device, bool train) {
  LoaderOptions o;
  o.batch_size = 8;
  o.workers = 2;
  o.seed = 5;
  o.train = train;
  o.device = device;
  if (device.is_cuda()) o.decode = LoaderOptions::ImageDecode::kDevice;
  return o;
}

// Pixels in 0-255 levels from a normalised value's difference (ImageNet's stddev per channel).
struct Difference {
  double max_levels = 0, sum_levels = 0;
  std::size_t count = 0, above_8 = 0;
};

void compare_batches(DataLoader& cpu, DataLoader& gpu, int batches, Difference* d) {
  const float stddev[3] = {0.229f, 0.224f, 0.225f};
  for (int b = 0; b < batches; ++b) {
    Batch want = cpu.next();
    Batch got = gpu.next();
    ASSERT_EQ(got.sample_indices, want.sample_indices) << "batch " << b;
    ASSERT_EQ(got.targets.to_vector<std::int64_t>(), want.targets.to_vector<std::int64_t>());
    ASSERT_EQ(got.inputs.shape(), want.inputs.shape());
    ASSERT_EQ(got.skipped_samples, want.skipped_samples);
    std::vector<float> g = got.inputs.to_vector<float>(), w = want.inputs.to_vector<float>();
    const std::size_t plane = 64 * 64;
    for (std::size_t i = 0; i < g.size(); ++i) {
      const double levels = std::fabs(g[i] - w[i]) * stddev[(i / plane) % 3] * 255.0;
      d->max_levels = std::max(d->max_levels, levels);
      d->sum_levels += levels;
      d->above_8 += levels > 8.5;
      ++d->count;
    }
  }
}

class DeviceDecodeGpu : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    ASSERT_GT(cuda_device_count(), 0) << "no GPU: this suite is labelled gpu";
    ASSERT_EQ(setenv("KILN_NVJPEG_BACKEND", GetParam(), 1), 0);
  }
  void TearDown() override { unsetenv("KILN_NVJPEG_BACKEND"); }
};

TEST_P(DeviceDecodeGpu, LoaderMatchesTheCpuPathWithinDecoderRounding) {
  PhotoFolder folder(48, 4);
  for (bool train : {true, false}) {
    auto dataset = std::make_shared<JpegFolderDataset>(folder.root(), folder_options(train));
    DataLoader cpu(dataset, loader_options(Device::cpu(), train));
    DataLoader gpu(dataset, loader_options(kGpu, train));
    std::printf("decoder: %s\n", gpu.image_decoding().c_str());
    Difference d;
    compare_batches(cpu, gpu, 14, &d);  // more than two epochs of 6 batches
    const double mean = d.sum_levels / std::max<std::size_t>(d.count, 1);
    std::printf(
        "%s, %s: |GPU - CPU| per pixel value, in 0-255 levels: max %.2f, mean %.4f, "
        "%.4f %% above 8\n",
        GetParam(), train ? "train (RRC, flip, padding)" : "eval (centre crop)", d.max_levels, mean,
        100.0 * d.above_8 / std::max<std::size_t>(d.count, 1));
    // JPEG decoders differ in their IDCT and chroma upsampling: a level or two on most pixels,
    // more at colour edges (nearest against interpolated chroma).
    EXPECT_LT(mean, 1.5);
    EXPECT_LE(d.max_levels, 96.0);
    EXPECT_LT(d.above_8, d.count / 50);
  }
}

TEST_P(DeviceDecodeGpu, CorruptFilesFollowThePolicyAsOnTheCpu) {
  PhotoFolder folder(48, 4);
  std::vector<std::uint8_t> jpeg = read_file(folder.root() + "/class_1/img_1.jpg");
  std::vector<std::uint8_t> truncated(jpeg.begin(), jpeg.begin() + jpeg.size() / 2);
  write_file(folder.root() + "/class_1/truncated.jpg", truncated.data(), truncated.size());
  const std::vector<std::uint8_t> text = {'n', 'o', 't', ' ', 'j', 'p', 'e', 'g'};
  write_file(folder.root() + "/class_2/text.jpg", text.data(), text.size());
  for (bool skip : {true, false}) {
    JpegFolderOptions o = folder_options(true);
    o.on_corrupt = skip ? CorruptImagePolicy::kSkip : CorruptImagePolicy::kFail;
    auto cpu_set = std::make_shared<JpegFolderDataset>(folder.root(), o);
    auto gpu_set = std::make_shared<JpegFolderDataset>(folder.root(), o);
    DataLoader cpu(cpu_set, loader_options(Device::cpu(), true));
    DataLoader gpu(gpu_set, loader_options(kGpu, true));
    if (skip) {
      Difference d;
      compare_batches(cpu, gpu, 14, &d);
      EXPECT_GT(gpu.stats().skipped_samples, 0);
      EXPECT_EQ(gpu.stats().skipped_samples, cpu.stats().skipped_samples);
    } else {
      std::string message;
      try {
        for (int b = 0; b < 14; ++b) gpu.next();
      } catch (const InputError& e) {
        message = e.what();
      }
      EXPECT_NE(message.find("corrupt JPEG"), std::string::npos) << message;
      EXPECT_TRUE(message.find("truncated.jpg") != std::string::npos ||
                  message.find("text.jpg") != std::string::npos)
          << message;
    }
  }
}

TEST_P(DeviceDecodeGpu, ResumesAtTheSameBatchBitForBit) {
  PhotoFolder folder(48, 4);
  auto dataset = std::make_shared<JpegFolderDataset>(folder.root(), folder_options(true));
  DataLoader straight(dataset, loader_options(kGpu, true));
  for (int b = 0; b < 4; ++b) straight.next();
  const LoaderState state = straight.state();
  DataLoader resumed(dataset, loader_options(kGpu, true));
  resumed.restore(state);
  for (int b = 0; b < 5; ++b) {
    Batch want = straight.next();
    Batch got = resumed.next();
    ASSERT_EQ(got.sample_indices, want.sample_indices);
    EXPECT_EQ(got.inputs.to_vector<float>(), want.inputs.to_vector<float>()) << "batch " << b;
  }
}

// "hardware": the engine where the GPU has one (the CUDA decoder otherwise); "gpu": the CUDA
// decoder an RTX 4090 uses, forced.
INSTANTIATE_TEST_SUITE_P(Backends, DeviceDecodeGpu, ::testing::Values("hardware", "gpu"));

}  // namespace
}  // namespace kiln::data
