// Decoding on the device (data.decode GPU), the parts that run without a GPU: which JPEGs go to
// nvJPEG's batched decoder, and the encoded samples the workers leave for the device carrying
// exactly the choices (crop, flip, padded shift) and corrupt-file policy of the CPU path. The GPU
// side (nvJPEG and the resize kernel against this CPU path) is test_data_loader_gpu.

#include <gtest/gtest.h>
#include <turbojpeg.h>

#include <algorithm>
#include <filesystem>
#include <vector>

#include "core/random.h"
#include "data/device_decode.h"
#include "data/factory.h"
#include "data/file_io.h"
#include "data/image_datasets.h"
#include "data/loader.h"
#include "tests/data/photo_folder.h"
#include "tests/data/test_util.h"

namespace kiln::data {
namespace {

using testing::expect_input_error;
using testing::photo_like_jpeg;
using testing::PhotoFolder;

void write_bytes(const std::string& path, const std::vector<std::uint8_t>& bytes) {
  write_file(path, bytes.data(), bytes.size());
}

// The first byte of the frame header's marker (FF C0) in a baseline JPEG.
std::size_t start_of_frame(const std::vector<std::uint8_t>& jpeg) {
  for (std::size_t i = 2; i + 1 < jpeg.size(); ++i) {
    if (jpeg[i] == 0xFF && jpeg[i + 1] == 0xC0) return i;
  }
  return 0;
}

TEST(JpegDecodableOnDevice, BaselineGoesAndEverythingElseStays) {
  std::vector<std::uint8_t> jpeg = photo_like_jpeg(64, 48, 1);
  bool truncated = true;
  EXPECT_TRUE(jpeg_decodable_on_device(jpeg.data(), jpeg.size(), &truncated));
  EXPECT_FALSE(truncated);
  // Trailing bytes after the end-of-image marker (some writers pad) still go.
  std::vector<std::uint8_t> padded = jpeg;
  padded.insert(padded.end(), 100, 0);
  EXPECT_TRUE(jpeg_decodable_on_device(padded.data(), padded.size(), &truncated));

  std::vector<std::uint8_t> cut(jpeg.begin(), jpeg.begin() + jpeg.size() / 2);
  EXPECT_FALSE(jpeg_decodable_on_device(cut.data(), cut.size(), &truncated));
  EXPECT_TRUE(truncated);

  const std::size_t sof = start_of_frame(jpeg);
  ASSERT_GT(sof, 0u);
  std::vector<std::uint8_t> progressive = jpeg;
  progressive[sof + 1] = 0xC2;
  EXPECT_FALSE(jpeg_decodable_on_device(progressive.data(), progressive.size(), &truncated));
  EXPECT_FALSE(truncated);
  std::vector<std::uint8_t> subsampled_411 = jpeg;  // luma 4 x 1: not one of nvJPEG's
  subsampled_411[sof + 11] = 0x41;
  EXPECT_FALSE(jpeg_decodable_on_device(subsampled_411.data(), subsampled_411.size(), &truncated));
  std::vector<std::uint8_t> rgb_ids = jpeg;  // components named R, G, B: not YCbCr
  rgb_ids[sof + 10] = 'R';
  rgb_ids[sof + 13] = 'G';
  rgb_ids[sof + 16] = 'B';
  EXPECT_FALSE(jpeg_decodable_on_device(rgb_ids.data(), rgb_ids.size(), &truncated));

  const std::vector<std::uint8_t> text = {'n', 'o', 't', ' ', 'a', ' ', 'j', 'p', 'e', 'g'};
  EXPECT_FALSE(jpeg_decodable_on_device(text.data(), text.size(), &truncated));
  EXPECT_FALSE(jpeg_decodable_on_device(text.data(), 0, &truncated));
}

JpegFolderOptions folder_options(bool train_augment) {
  JpegFolderOptions o;
  o.image_size = 32;
  o.crop_padding = train_augment ? 4 : 0;
  o.dct_scaling = false;  // the device decodes at full size
  return o;
}

// What the device does with an encoded sample, done on the CPU: decode at full size, then the
// resize, mirror and shift.
std::vector<float> finish_on_cpu(const EncodedImage& image, const ResizeCropParams& finish) {
  std::vector<std::uint8_t> rgb = image.rgb;
  int width = image.width, height = image.height;
  if (rgb.empty()) {
    std::string error;
    EXPECT_TRUE(
        decode_jpeg_rgb(image.bytes.data(), image.bytes.size(), &rgb, &width, &height, &error))
        << error;
  }
  std::vector<float> out(static_cast<std::size_t>(3) * finish.out_width * finish.out_height);
  resize_crop_hwc(rgb.data(), width, height, 3, image.box, finish.out_width, finish.out_height,
                  image.flip, finish.mean, finish.inv_std, out.data());
  shift_image_chw(out.data(), 3, finish.out_height, finish.out_width, image.shift_x, image.shift_y,
                  finish.fill);
  return out;
}

TEST(JpegFolderEncoded, TheDeviceGetsTheCpuPathsChoices) {
  PhotoFolder folder(12, 3);
  for (bool train : {true, false}) {
    JpegFolderDataset dataset(folder.root(), folder_options(train));
    ASSERT_TRUE(dataset.encodes_images());
    const ResizeCropParams finish = dataset.device_finish();
    EXPECT_EQ(finish.out_width, 32);
    int flipped = 0, shifted = 0;
    for (std::int64_t index = 0; index < dataset.size(); ++index) {
      for (std::uint64_t epoch : {0u, 3u}) {
        SampleContext context{7, epoch, static_cast<std::uint64_t>(index), train};
        std::vector<float> want(3 * 32 * 32);
        std::int64_t want_label = -1, got_label = -2;
        ASSERT_TRUE(dataset.get(index, context, want.data(), &want_label));
        EncodedImage image;
        ASSERT_TRUE(dataset.get_encoded(index, context, &image, &got_label));
        EXPECT_EQ(got_label, want_label);
        EXPECT_EQ(image.file, dataset.file(index));
        EXPECT_FALSE(image.bytes.empty());  // baseline 4:2:0: left for nvJPEG
        EXPECT_TRUE(image.rgb.empty());
        EXPECT_EQ(finish_on_cpu(image, finish), want) << "sample " << index << " epoch " << epoch;
        flipped += image.flip;
        shifted += image.shift_x != 0 || image.shift_y != 0;
        if (!train) {
          EXPECT_FALSE(image.flip || image.shift_x || image.shift_y);
        }
      }
    }
    if (train) {  // the choices were exercised, not all left at their defaults
      EXPECT_GT(flipped, 0);
      EXPECT_GT(shifted, 0);
    }
  }
}

TEST(JpegFolderEncoded, FilesNvjpegDoesNotTakeAreDecodedByTheWorker) {
  PhotoFolder folder(12, 3);
  // A grayscale JPEG (one component): TurboJPEG decodes it to RGB, nvJPEG's batched decoder not.
  std::vector<std::uint8_t> gray(80 * 60 * 3);
  for (std::size_t i = 0; i < gray.size(); ++i) gray[i] = static_cast<std::uint8_t>(i / 3 % 251);
  tjhandle encoder = tjInitCompress();
  unsigned char* out = nullptr;
  unsigned long size = 0;
  ASSERT_EQ(tjCompress2(encoder, gray.data(), 80, 0, 60, TJPF_RGB, &out, &size, TJSAMP_GRAY, 90, 0),
            0);
  std::vector<std::uint8_t> jpeg(out, out + size);
  tjFree(out);
  tjDestroy(encoder);
  bool truncated = true;
  EXPECT_FALSE(jpeg_decodable_on_device(jpeg.data(), jpeg.size(), &truncated));
  EXPECT_FALSE(truncated);
  const std::string path = folder.root() + "/class_0/zz_gray.jpg";
  write_bytes(path, jpeg);
  JpegFolderDataset dataset(folder.root(), folder_options(true));
  std::int64_t index = -1;
  for (std::int64_t i = 0; i < dataset.size(); ++i) {
    if (dataset.file(i) == path) index = i;
  }
  ASSERT_GE(index, 0);
  SampleContext context{1, 0, static_cast<std::uint64_t>(index), true};
  EncodedImage image;
  std::int64_t label = -1;
  std::vector<float> want(3 * 32 * 32);
  ASSERT_TRUE(dataset.get(index, context, want.data(), &label));
  ASSERT_TRUE(dataset.get_encoded(index, context, &image, &label));
  EXPECT_TRUE(image.bytes.empty());
  EXPECT_EQ(image.rgb.size(), static_cast<std::size_t>(image.width) * image.height * 3);
  EXPECT_EQ(finish_on_cpu(image, dataset.device_finish()), want);
}

TEST(JpegFolderEncoded, CorruptFilesFollowTheCpuPathsPolicy) {
  PhotoFolder folder(12, 3);
  std::vector<std::uint8_t> jpeg = photo_like_jpeg(64, 48, 5);
  jpeg.resize(jpeg.size() * 2 / 3);
  write_bytes(folder.root() + "/class_1/truncated.jpg", jpeg);
  write_bytes(folder.root() + "/class_1/text.jpg", {'h', 'e', 'l', 'l', 'o'});
  for (const char* name : {"truncated.jpg", "text.jpg"}) {
    const std::string path = folder.root() + "/class_1/" + name;
    JpegFolderOptions fail = folder_options(true);
    JpegFolderDataset failing(folder.root(), fail);
    std::int64_t index = -1;
    for (std::int64_t i = 0; i < failing.size(); ++i) {
      if (failing.file(i) == path) index = i;
    }
    ASSERT_GE(index, 0);
    SampleContext context{1, 0, static_cast<std::uint64_t>(index), true};
    EncodedImage image;
    std::int64_t label = 0;
    expect_input_error([&] { failing.get_encoded(index, context, &image, &label); },
                       {path, "corrupt JPEG", "on_corrupt"});
    JpegFolderOptions skip = fail;
    skip.on_corrupt = CorruptImagePolicy::kSkip;
    JpegFolderDataset skipping(folder.root(), skip);
    EXPECT_FALSE(skipping.get_encoded(index, context, &image, &label));
    EXPECT_EQ(skipping.skipped_samples(), 1);
  }
}

TEST(JpegFolderEncoded, TheLoaderSaysWhereImagesAreDecoded) {
  PhotoFolder folder(12, 3);
  auto dataset = std::make_shared<JpegFolderDataset>(folder.root(), folder_options(true));
  LoaderOptions options;
  options.batch_size = 4;
  options.workers = 0;
  options.decode = LoaderOptions::ImageDecode::kAuto;
  EXPECT_EQ(DataLoader(dataset, options).image_decoding(), "on the host (TurboJPEG)");
  options.decode = LoaderOptions::ImageDecode::kDevice;  // the loader delivers to the host
  expect_input_error([&] { DataLoader loader(dataset, options); }, {"data.decode GPU", "CUDA"});
  auto tokens = make_dataset("synthetic_tokens", "", "train", DatasetOptions{});
  expect_input_error([&] { DataLoader loader(tokens, options); },
                     {"data.decode GPU", "no encoded images"});
}

}  // namespace
}  // namespace kiln::data
