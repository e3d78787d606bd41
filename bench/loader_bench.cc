// Loader throughput: samples/s for every dataset kind with 1, 2 and 4 workers, and JPEG images
// decoded per second on one core. Fashion-MNIST reads the installed files; CIFAR-10, JPEG and
// token files are generated into a temporary directory removed at the end.
//
//   loader_bench [--seconds S] [--jpeg-images N] [--only KIND] [--keep] [--gpu] [--jpeg-dir DIR]
// --jpeg-dir reads that JPEG folder (DIR/train/<class>/*.jpg or DIR/<class>/*.jpg) instead of the
// generated files; --gpu adds the rates of data.decode GPU on GPU 0.

#include <stdlib.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "core/check.h"
#include "core/random.h"
#include "core/stream.h"
#include "data/factory.h"
#include "data/file_io.h"
#include "data/image_datasets.h"
#include "data/jpeg_region_decoder.h"
#include "data/loader.h"
#include "data/token_dataset.h"

namespace {

using namespace kiln;
using namespace kiln::data;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void make_cifar(const std::string& dir, int records_per_batch) {
  std::filesystem::create_directories(dir);
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(records_per_batch) * kCifarRecordBytes);
  for (int b = 1; b <= 6; ++b) {
    for (std::size_t i = 0; i < bytes.size(); ++i) {
      bytes[i] = (i % kCifarRecordBytes == 0) ? static_cast<std::uint8_t>((i / 3073 + b) % 10)
                                              : static_cast<std::uint8_t>(philox_word(b, 0, i));
    }
    std::string name = b <= 5 ? "data_batch_" + std::to_string(b) + ".bin" : "test_batch.bin";
    write_file(join_path(dir, name), bytes.data(), bytes.size());
  }
}

// ImageNet-like files: 500x375 (the ImageNet median is about 500x400), smooth colour fields
// with noise so that they compress like photographs (~100 KB at quality 90).
void make_jpegs(const std::string& root, int count) {
  const int w = 500, h = 375;
  std::vector<std::uint8_t> rgb(w * h * 3);
  for (int i = 0; i < count; ++i) {
    std::string dir = join_path(root, "class_" + std::to_string(i % 10));
    std::filesystem::create_directories(dir);
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x)
        for (int c = 0; c < 3; ++c) {
          double smooth = 128 + 100 * std::sin(0.013 * (x + 37 * i) * (c + 1) + 0.021 * y);
          double noise = static_cast<double>(philox_word(i, c, y * w + x) % 41) - 20;
          int v = static_cast<int>(smooth + noise);
          rgb[(y * w + x) * 3 + c] = static_cast<std::uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
        }
    std::vector<std::uint8_t> jpeg = encode_jpeg_rgb(rgb.data(), w, h, 90);
    write_file(join_path(dir, "img_" + std::to_string(i) + ".jpg"), jpeg.data(), jpeg.size());
  }
}

// Runs the loader for about `seconds` after one warm-up batch; returns samples/s.
// With `gpu`, batches go to GPU 0 and JPEG folders are decoded there (data.decode GPU); each
// batch is waited for on the device, so the rate is what a training step could consume.
double measure(std::shared_ptr<const Dataset> dataset, std::int64_t batch_size, int workers,
               double seconds, double* wait_share, bool gpu = false) {
  LoaderOptions options;
  options.batch_size = batch_size;
  options.workers = workers;
  options.prefetch = 2 * workers;
  options.seed = 1;
  if (gpu) {
    options.device = Device::cuda(0);
    options.decode = LoaderOptions::ImageDecode::kDevice;
  }
  DataLoader loader(dataset, options);
  auto next = [&] {
    std::int64_t n = loader.next().size();
    if (gpu) device_synchronize(options.device);
    return n;
  };
  next();
  double waited_before = loader.wait_time();
  std::int64_t samples = 0;
  Clock::time_point start = Clock::now();
  double elapsed = 0;
  while ((elapsed = seconds_since(start)) < seconds) samples += next();
  *wait_share = (loader.wait_time() - waited_before) / elapsed;
  if (gpu) std::printf(" (%s)", loader.image_decoding().c_str());
  return samples / elapsed;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 3.0;
  int jpeg_images = 256;
  bool keep = false, gpu = false;
  std::string only;      // run the dataset kinds containing this text only
  std::string jpeg_dir;  // an existing JPEG folder instead of generated files
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--seconds") && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else if (!std::strcmp(argv[i], "--jpeg-images") && i + 1 < argc) {
      jpeg_images = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) {
      only = argv[++i];
    } else if (!std::strcmp(argv[i], "--keep")) {
      keep = true;
    } else if (!std::strcmp(argv[i], "--gpu")) {
      gpu = true;
    } else if (!std::strcmp(argv[i], "--jpeg-dir") && i + 1 < argc) {
      jpeg_dir = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: %s [--seconds S] [--jpeg-images N] [--only KIND] [--keep] [--gpu] "
                   "[--jpeg-dir DIR]\n",
                   argv[0]);
      return 2;
    }
  }
  try {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "kiln-loader-bench-XXXXXX").string();
    if (!mkdtemp(pattern.data())) throw Error("mkdtemp failed");
    const std::string dir = pattern;
    std::printf("loader_bench: %u hardware threads, %.1f s per figure, files in %s\n",
                std::thread::hardware_concurrency(), seconds, dir.c_str());

    Clock::time_point start = Clock::now();
    make_cifar(join_path(dir, "cifar"), 2000);
    if (jpeg_dir.empty()) {
      jpeg_dir = join_path(dir, "jpeg");
      make_jpegs(jpeg_dir, jpeg_images);
    }
    std::vector<std::uint32_t> tokens(4u << 20);
    for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = philox_word(3, 0, i) % 30522;
    write_token_file(join_path(dir, "train.tok"), tokens, 30522, 2);
    std::printf("generated files in %.1f s\n\n", seconds_since(start));

    // JPEG decode rate on one core, full-size decode to RGB, files already in memory.
    {
      std::vector<std::vector<std::uint8_t>> files;
      for (const auto& entry :
           std::filesystem::recursive_directory_iterator(jpeg_split_dir(jpeg_dir, "train"))) {
        if (entry.is_regular_file()) files.push_back(read_file(entry.path().string()));
      }
      std::size_t bytes = 0;
      for (const auto& f : files) bytes += f.size();
      std::vector<std::uint8_t> rgb;
      int w = 0, h = 0;
      std::string error;
      // At full size, then in the DCT domain at 6/8 (what the eval's 328-pixel centre crop to
      // 224 would need: slower than 8/8, so never used) and 4/8 and 2/8 (crops of 448 and 896
      // pixels or more).
      for (int eighths : {8, 6, 4, 2}) {
        std::int64_t decoded = 0;
        Clock::time_point t0 = Clock::now();
        while (seconds_since(t0) < seconds) {
          const auto& f = files[decoded % files.size()];
          if (!decode_jpeg_rgb(f.data(), f.size(), &rgb, &w, &h, &error, eighths)) {
            throw Error(error);
          }
          ++decoded;
        }
        std::printf(
            "JPEG decode (TurboJPEG, 500x375, %.0f KB average) at %d/8 scale: %.0f "
            "images/s per core\n",
            bytes / 1024.0 / files.size(), eighths, decoded / seconds_since(t0));
      }
      // What the training path decodes: only RandomResizedCrop's box (ImageNet's scale 0.08-1)
      // and the pixel around it, stopping after its last row; and the entropy decoding alone,
      // which no crop avoids for the rows above the box (the bound of any exact CPU decode).
      DecodedRegion region;
      std::int64_t decoded = 0;
      Clock::time_point t0 = Clock::now();
      while (seconds_since(t0) < seconds) {
        const auto& f = files[decoded % files.size()];
        if (!read_jpeg_header(f.data(), f.size(), &w, &h, &error)) throw Error(error);
        const SampleContext context{1, 0, static_cast<std::uint64_t>(decoded), true};
        const CropBox box = random_resized_crop_box(w, h, 0.08, 1.0, kResizedCropRatioMin,
                                                    kResizedCropRatioMax, context, 4);
        if (!decode_jpeg_region(f.data(), f.size(), 8, resize_footprint(box, w, h), &region,
                                &error)) {
          throw Error(error);
        }
        ++decoded;
      }
      std::printf(
          "JPEG decode of RandomResizedCrop's box only (libjpeg crop and skip): %.0f "
          "images/s per core\n",
          decoded / seconds_since(t0));
      decoded = 0;
      t0 = Clock::now();
      while (seconds_since(t0) < seconds) {
        const auto& f = files[decoded % files.size()];
        if (!jpeg_entropy_decode(f.data(), f.size(), &error)) throw Error(error);
        ++decoded;
      }
      std::printf(
          "JPEG entropy decoding alone (the Huffman-coded scan to coefficients): %.0f "
          "images/s per core\n",
          decoded / seconds_since(t0));
      std::printf("\n");
    }

    struct Case {
      const char* label;
      std::string kind, path;
      DatasetOptions options;
      std::int64_t batch;
    };
    std::vector<Case> cases;
    cases.push_back({"fashion_mnist train (1x28x28, normalise)", "fashion_mnist", "", {}, 256});
    cases.push_back(
        {"cifar10 (3x32x32, crop+flip+normalise)", "cifar10", join_path(dir, "cifar"), {}, 256});
    DatasetOptions jpeg;
    jpeg.jpeg.image_size = 224;
    cases.push_back({"jpeg_folder (500x375 -> RRC 224, flip)", "jpeg_folder", jpeg_dir, jpeg, 32});
    DatasetOptions mlm;
    mlm.seq_len = 128;
    mlm.masking.mask_token_id = 103;
    cases.push_back({"tokens_mlm (T=128, uint16)", "tokens_mlm", dir, mlm, 256});
    DatasetOptions clm;
    clm.seq_len = 1024;
    cases.push_back({"tokens_clm (T=1024, uint16)", "tokens_clm", dir, clm, 32});
    DatasetOptions synth;
    synth.synthetic_size = 50000;
    cases.push_back({"synthetic_images (3x32x32)", "synthetic_images", "", synth, 256});
    synth.seq_len = 1024;
    cases.push_back({"synthetic_tokens (T=1024)", "synthetic_tokens", "", synth, 32});

    std::printf("| dataset | batch | 1 worker | 2 workers | 4 workers |\n");
    std::printf("| --- | --- | --- | --- | --- |\n");
    for (const Case& c : cases) {
      if (!only.empty() && c.kind.find(only) == std::string::npos) continue;
      std::shared_ptr<Dataset> dataset = make_dataset(c.kind, c.path, "train", c.options);
      std::printf("| %s | %lld |", c.label, static_cast<long long>(c.batch));
      for (int workers : {1, 2, 4}) {
        double wait_share = 0;
        double rate = measure(dataset, c.batch, workers, seconds, &wait_share);
        std::printf(" %.0f |", rate);
        std::fflush(stdout);
      }
      std::printf("\n");
    }
    std::printf("\n(samples/s delivered to a consumer that does nothing else)\n");
    if (gpu) {
      // The same JPEGs decoded on GPU 0 (nvJPEG + one resize kernel), batches of 256: the workers
      // only read files and headers.
      std::shared_ptr<Dataset> dataset = make_dataset("jpeg_folder", jpeg_dir, "train", jpeg);
      std::printf("\njpeg_folder decoded on the GPU, batch 256, samples/s:\n");
      for (int workers : {1, 2, 4, 8}) {
        double wait_share = 0;
        std::printf("%d workers:", workers);
        double rate = measure(dataset, 256, workers, seconds, &wait_share, true);
        std::printf(" %.0f (consumer waited %.0f %%)\n", rate, 100 * wait_share);
        std::fflush(stdout);
      }
    }
    if (!keep) std::filesystem::remove_all(dir);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loader_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
