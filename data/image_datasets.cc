#include "data/image_datasets.h"

#include <turbojpeg.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

#include "core/check.h"
#include "data/device_decode.h"
#include "data/file_io.h"
#include "data/jpeg_region_decoder.h"

namespace kiln::data {

// ---------------------------------------------------------------------------------------------
// In-memory arrays

ImageArrayDataset::ImageArrayDataset(std::string name, std::vector<std::uint8_t> pixels,
                                     std::vector<std::uint8_t> labels, int channels, int height,
                                     int width, int num_classes, ImageAugment augment)
    : name_(std::move(name)),
      pixels_(std::move(pixels)),
      labels_(std::move(labels)),
      channels_(channels),
      height_(height),
      width_(width),
      num_classes_(num_classes),
      augment_(std::move(augment)) {
  KILN_CHECK(pixels_.size() == labels_.size() * channels * height * width,
             "ImageArrayDataset: pixel count does not match labels");
  std::vector<float> mean, inv_std;
  augment_.normalization.expand(channels_, &mean, &inv_std);  // validates early
}

SampleSpec ImageArrayDataset::spec() const {
  return SampleSpec{{channels_, height_, width_}, DType::F32, {}, DType::I64};
}

std::string ImageArrayDataset::describe() const {
  return name_ + " (" + std::to_string(size()) + " samples of " +
         shape_str({channels_, height_, width_}) + ", " + std::to_string(num_classes_) +
         " classes)";
}

const std::uint8_t* ImageArrayDataset::pixels(std::int64_t index) const {
  return pixels_.data() + static_cast<std::size_t>(index) * channels_ * height_ * width_;
}

bool ImageArrayDataset::get(std::int64_t index, const SampleContext& context, void* input,
                            void* target) const {
  augment_image_chw(pixels(index), channels_, height_, width_, augment_, context,
                    static_cast<float*>(input));
  *static_cast<std::int64_t*>(target) = labels_[static_cast<std::size_t>(index)];
  return true;
}

// ---------------------------------------------------------------------------------------------
// MNIST idx files

namespace {

std::uint32_t read_be32(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) |
         std::uint32_t{p[3]};
}

// Validates an idx ubyte file of `ndims` dimensions; returns the dimensions. The payload
// starts at byte 4 + 4 * ndims.
std::vector<std::uint32_t> parse_idx_header(const std::string& path,
                                            const std::vector<std::uint8_t>& bytes, int ndims) {
  if (bytes.empty()) throw_file_error(path, "empty file, expected an idx header");
  if (bytes.size() < 4) {
    throw_file_error(
        path, bytes.size(),
        "truncated idx header (file holds only " + std::to_string(bytes.size()) + " bytes)");
  }
  std::uint32_t magic = read_be32(bytes.data());
  std::uint32_t expected = 0x00000800u | static_cast<std::uint32_t>(ndims);
  if (magic != expected) {
    char text[96];
    std::snprintf(text, sizeof(text), "wrong magic 0x%08x, expected 0x%08x (idx%d ubyte)", magic,
                  expected, ndims);
    throw_file_error(path, 0, text);
  }
  std::size_t header = 4 + 4 * static_cast<std::size_t>(ndims);
  if (bytes.size() < header) {
    throw_file_error(path, bytes.size(),
                     "truncated idx header (" + std::to_string(header) + " bytes expected)");
  }
  std::vector<std::uint32_t> dims(ndims);
  std::uint64_t payload = 1;
  for (int d = 0; d < ndims; ++d) {
    dims[d] = read_be32(bytes.data() + 4 + 4 * d);
    if (d > 0 && (dims[d] == 0 || dims[d] > 65535)) {
      throw_file_error(
          path, 4 + 4 * d,
          "implausible image dimension " + std::to_string(dims[d]) + " (corrupt header?)");
    }
    payload *= dims[d];  // at most 2^32 * 2^16 * 2^16: no overflow
  }
  std::uint64_t record = dims[0] == 0 ? 0 : payload / dims[0];
  std::uint64_t held = bytes.size() - header;
  if (held < payload) {
    std::uint64_t complete = record == 0 ? 0 : held / record;
    throw_file_error(path, header + complete * record,
                     "truncated: the header claims " + std::to_string(dims[0]) +
                         " records but the file holds " + std::to_string(complete) +
                         " complete ones; record " + std::to_string(complete) + " is incomplete");
  }
  if (held > payload) {
    throw_file_error(path, header + payload,
                     std::to_string(held - payload) + " unexpected bytes after the last record");
  }
  return dims;
}

std::string find_variant(const std::string& dir, const std::string& base) {
  for (const std::string& name : {base + ".gz", base}) {
    std::string path = join_path(dir, name);
    if (path_exists(path)) return path;
  }
  throw InputError(join_path(dir, base) +
                   "[.gz]: no such file (expected MNIST-format idx files "
                   "in " +
                   dir + ")");
}

}  // namespace

std::unique_ptr<ImageArrayDataset> load_idx_dataset(const std::string& images_path,
                                                    const std::string& labels_path, int num_classes,
                                                    ImageAugment augment, const std::string& name) {
  std::vector<std::uint8_t> image_bytes = read_file(images_path);
  std::vector<std::uint32_t> image_dims = parse_idx_header(images_path, image_bytes, 3);
  std::vector<std::uint8_t> label_bytes = read_file(labels_path);
  std::vector<std::uint32_t> label_dims = parse_idx_header(labels_path, label_bytes, 1);
  if (image_dims[0] != label_dims[0]) {
    throw InputError(images_path + " holds " + std::to_string(image_dims[0]) + " images but " +
                     labels_path + " holds " + std::to_string(label_dims[0]) + " labels");
  }
  if (image_dims[0] == 0) throw_file_error(images_path, 4, "holds no records");
  constexpr std::size_t kLabelHeader = 8;
  std::vector<std::uint8_t> labels(label_bytes.begin() + kLabelHeader, label_bytes.end());
  for (std::size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] >= num_classes) {
      throw_file_error(labels_path, kLabelHeader + i,
                       "label " + std::to_string(labels[i]) + " of record " + std::to_string(i) +
                           " is outside [0, " + std::to_string(num_classes) + ")");
    }
  }
  constexpr std::size_t kImageHeader = 16;
  image_bytes.erase(image_bytes.begin(), image_bytes.begin() + kImageHeader);
  return std::make_unique<ImageArrayDataset>(
      name, std::move(image_bytes), std::move(labels), 1, static_cast<int>(image_dims[1]),
      static_cast<int>(image_dims[2]), num_classes, std::move(augment));
}

std::unique_ptr<ImageArrayDataset> load_mnist_dir(const std::string& dir, const std::string& split,
                                                  ImageAugment augment, const std::string& name) {
  std::string prefix;
  if (split == "train") {
    prefix = "train";
  } else if (split == "test" || split == "val") {
    prefix = "t10k";
  } else {
    throw InputError("unknown split '" + split + "' for " + name + " (known: train, test)");
  }
  std::string images = find_variant(dir, prefix + "-images-idx3-ubyte");
  std::string labels = find_variant(dir, prefix + "-labels-idx1-ubyte");
  return load_idx_dataset(images, labels, 10, std::move(augment), name + " " + split);
}

// ---------------------------------------------------------------------------------------------
// CIFAR-10 binary batches

std::unique_ptr<ImageArrayDataset> load_cifar10_files(const std::vector<std::string>& files,
                                                      ImageAugment augment) {
  constexpr int kPixels = kCifarRecordBytes - 1;
  std::vector<std::uint8_t> pixels, labels;
  for (const std::string& path : files) {
    std::vector<std::uint8_t> bytes = read_file(path);
    if (bytes.empty()) throw_file_error(path, "empty file, expected CIFAR-10 records");
    std::size_t records = bytes.size() / kCifarRecordBytes;
    if (bytes.size() % kCifarRecordBytes != 0) {
      throw_file_error(path, records * kCifarRecordBytes,
                       "truncated: " + std::to_string(bytes.size()) +
                           " bytes is not a whole number of 3073-byte records; record " +
                           std::to_string(records) + " is incomplete");
    }
    pixels.reserve(pixels.size() + records * kPixels);
    for (std::size_t r = 0; r < records; ++r) {
      const std::uint8_t* record = bytes.data() + r * kCifarRecordBytes;
      if (record[0] >= 10) {
        throw_file_error(path, r * kCifarRecordBytes,
                         "label " + std::to_string(record[0]) + " of record " + std::to_string(r) +
                             " is outside [0, 10)");
      }
      labels.push_back(record[0]);
      pixels.insert(pixels.end(), record + 1, record + kCifarRecordBytes);
    }
  }
  std::string name = "cifar10";
  if (files.size() == 1) name += " " + files[0];
  return std::make_unique<ImageArrayDataset>(name, std::move(pixels), std::move(labels), 3, 32, 32,
                                             10, std::move(augment));
}

std::unique_ptr<ImageArrayDataset> load_cifar10_dir(const std::string& dir,
                                                    const std::string& split,
                                                    ImageAugment augment) {
  std::vector<std::string> files;
  if (split == "train") {
    for (int i = 1; i <= 5; ++i) {
      files.push_back(join_path(dir, "data_batch_" + std::to_string(i) + ".bin"));
    }
  } else if (split == "test" || split == "val") {
    files.push_back(join_path(dir, "test_batch.bin"));
  } else {
    throw InputError("unknown split '" + split + "' for cifar10 (known: train, test)");
  }
  for (const std::string& f : files) {
    if (!path_exists(f)) {
      throw InputError(f + ": no such file (expected the CIFAR-10 binary version in " + dir + ")");
    }
  }
  auto dataset = load_cifar10_files(files, std::move(augment));
  return dataset;
}

// ---------------------------------------------------------------------------------------------
// JPEG folders

namespace {

// One TurboJPEG handle per thread: handles are not thread-safe and cost a malloc to create.
struct TurboJpegHandle {
  tjhandle decoder = nullptr;
  tjhandle encoder = nullptr;
  ~TurboJpegHandle() {
    if (decoder) tjDestroy(decoder);
    if (encoder) tjDestroy(encoder);
  }
};

TurboJpegHandle& thread_turbojpeg() {
  thread_local TurboJpegHandle handle;
  return handle;
}

bool has_jpeg_extension(const std::filesystem::path& path) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext == ".jpg" || ext == ".jpeg";
}

}  // namespace

namespace {

// The thread's decoder, made on first use; null with `error` set when TurboJPEG cannot make one.
tjhandle thread_decoder(std::string* error) {
  TurboJpegHandle& handle = thread_turbojpeg();
  if (!handle.decoder) handle.decoder = tjInitDecompress();
  if (!handle.decoder) *error = std::string("tjInitDecompress failed: ") + tjGetErrorStr2(nullptr);
  return handle.decoder;
}

// A file that failed to decode can leave the handle unable to read the next header (TurboJPEG
// 2.1 then reports a 0x0 image): the next file gets a fresh one.
bool decoder_failed(std::string* error) {
  TurboJpegHandle& handle = thread_turbojpeg();
  *error = tjGetErrorStr2(handle.decoder);
  tjDestroy(handle.decoder);
  handle.decoder = nullptr;
  return false;
}

}  // namespace

bool read_jpeg_header(const std::uint8_t* bytes, std::size_t size, int* width, int* height,
                      std::string* error) {
  tjhandle decoder = thread_decoder(error);
  if (!decoder) return false;
  if (size == 0 || size > 0xffffffffu) {
    *error = "empty or oversized file";
    return false;
  }
  int subsampling = 0, colorspace = 0;
  if (tjDecompressHeader3(decoder, bytes, static_cast<unsigned long>(size), width, height,
                          &subsampling, &colorspace) != 0) {
    return decoder_failed(error);
  }
  if (*width <= 0 || *height <= 0 || static_cast<std::int64_t>(*width) * *height > (1 << 28)) {
    *error = "implausible image size " + std::to_string(*width) + "x" + std::to_string(*height);
    return false;
  }
  return true;
}

bool decode_jpeg_rgb(const std::uint8_t* bytes, std::size_t size, std::vector<std::uint8_t>* rgb,
                     int* width, int* height, std::string* error, int eighths) {
  if (!read_jpeg_header(bytes, size, width, height, error)) return false;
  KILN_CHECK(eighths >= 1 && eighths <= 8,
             "decode_jpeg_rgb: scale " + std::to_string(eighths) + "/8 is not in 1/8 .. 8/8");
  *width = jpeg_scaled_size(*width, eighths);
  *height = jpeg_scaled_size(*height, eighths);
  rgb->resize(static_cast<std::size_t>(*width) * *height * 3);
  // Warnings (a truncated scan, corrupt entropy data) count as corrupt: the decoded pixels
  // would be partly grey fill.
  tjhandle decoder = thread_turbojpeg().decoder;
  if (tjDecompress2(decoder, bytes, static_cast<unsigned long>(size), rgb->data(), *width, 0,
                    *height, TJPF_RGB, TJFLAG_STOPONWARNING) != 0) {
    return decoder_failed(error);
  }
  return true;
}

int jpeg_scaled_size(int size, int eighths) {
  return static_cast<int>((static_cast<std::int64_t>(size) * eighths + 7) / 8);
}

int jpeg_decode_eighths(CropBox box, int out_width, int out_height) {
  if (box.width <= 0 || box.height <= 0) return 8;
  auto need = [](int out, int in) {  // ceil(8 out / in)
    return static_cast<int>((8 * static_cast<std::int64_t>(out) + in - 1) / in);
  };
  const int need_eighths = std::max(need(out_width, box.width), need(out_height, box.height));
  // 1/8, 1/4 and 1/2 only: libjpeg-turbo's other scales run slower IDCTs than the full size's.
  int eighths = 1;
  while (eighths < 8 && eighths < need_eighths) eighths *= 2;
  return eighths;
}

CropBox scale_crop_box(CropBox box, int eighths, int width, int height) {
  if (eighths == 8) return box;
  auto down = [&](int v) { return static_cast<int>(static_cast<std::int64_t>(v) * eighths / 8); };
  auto up = [&](int v) {
    return static_cast<int>((static_cast<std::int64_t>(v) * eighths + 7) / 8);
  };
  CropBox out;
  out.x = std::min(down(box.x), width - 1);
  out.y = std::min(down(box.y), height - 1);
  out.width = std::max(1, std::min(up(box.x + box.width), width) - out.x);
  out.height = std::max(1, std::min(up(box.y + box.height), height) - out.y);
  return out;
}

std::vector<std::uint8_t> encode_jpeg_rgb(const std::uint8_t* rgb, int width, int height,
                                          int quality) {
  TurboJpegHandle& handle = thread_turbojpeg();
  if (!handle.encoder) handle.encoder = tjInitCompress();
  KILN_CHECK(handle.encoder != nullptr, "tjInitCompress failed");
  unsigned char* jpeg = nullptr;
  unsigned long size = 0;
  int status = tjCompress2(handle.encoder, rgb, width, 0, height, TJPF_RGB, &jpeg, &size,
                           TJSAMP_420, quality, 0);
  if (status != 0) {
    if (jpeg) tjFree(jpeg);
    throw Error(std::string("tjCompress2 failed: ") + tjGetErrorStr2(handle.encoder));
  }
  std::vector<std::uint8_t> out(jpeg, jpeg + size);
  tjFree(jpeg);
  return out;
}

JpegFolderDataset::JpegFolderDataset(const std::string& root, JpegFolderOptions options)
    : root_(root), options_(std::move(options)) {
  namespace fs = std::filesystem;
  if (!is_directory(root)) {
    throw InputError(root + ": no such directory (expected root/<class>/*.jpg)");
  }
  if (options_.image_size <= 0) {
    throw InputError("jpeg_folder image_size must be positive, got " +
                     std::to_string(options_.image_size));
  }
  if (options_.random_resized_crop &&
      !(options_.scale_min > 0 && options_.scale_min <= options_.scale_max &&
        options_.scale_max <= 1)) {
    throw InputError("jpeg_folder random resized crop scale must satisfy 0 < min <= max <= 1");
  }
  if (options_.crop_padding < 0) throw InputError("jpeg_folder crop_padding must be >= 0");
  options_.normalization.expand(3, &mean_, &inv_std_);
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(root, ec)) {
    if (entry.is_directory()) class_names_.push_back(entry.path().filename().string());
  }
  if (ec) throw InputError(root + ": cannot list: " + ec.message());
  std::sort(class_names_.begin(), class_names_.end());
  if (class_names_.empty()) {
    throw InputError(root + ": no class directories (expected root/<class>/*.jpg)");
  }
  for (std::size_t label = 0; label < class_names_.size(); ++label) {
    std::vector<std::string> names;
    fs::path dir = fs::path(root) / class_names_[label];
    for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
      if (entry.is_regular_file() && has_jpeg_extension(entry.path())) {
        names.push_back(entry.path().string());
      }
    }
    if (ec) throw InputError(dir.string() + ": cannot list: " + ec.message());
    std::sort(names.begin(), names.end());
    for (std::string& name : names) {
      files_.push_back(std::move(name));
      labels_.push_back(static_cast<int>(label));
    }
  }
  if (files_.empty()) throw InputError(root + ": no .jpg/.jpeg files in any class directory");
}

SampleSpec JpegFolderDataset::spec() const {
  return SampleSpec{{3, options_.image_size, options_.image_size}, DType::F32, {}, DType::I64};
}

std::string JpegFolderDataset::describe() const {
  return "jpeg_folder " + root_ + " (" + std::to_string(size()) + " images, " +
         std::to_string(num_classes()) + " classes, output " +
         shape_str({3, options_.image_size, options_.image_size}) + ")";
}

JpegFolderDataset::Choices JpegFolderDataset::choose(int width, int height,
                                                     const SampleContext& context) const {
  Choices c;
  if (context.train && options_.random_resized_crop) {
    c.box = random_resized_crop_box(width, height, options_.scale_min, options_.scale_max,
                                    options_.ratio_min, options_.ratio_max, context, 4);
  } else {
    c.box = center_crop_box(width, height, options_.eval_crop_fraction);
  }
  if (context.train) c.flip = options_.horizontal_flip && (context.word(0) & 1u);
  const int pad = context.train ? options_.crop_padding : 0;
  if (pad > 0) {
    c.shift_x = static_cast<int>(context.below(1, 2 * pad + 1)) - pad;
    c.shift_y = static_cast<int>(context.below(2, 2 * pad + 1)) - pad;
  }
  return c;
}

bool JpegFolderDataset::refuse(std::int64_t index, const std::string& error) const {
  if (options_.on_corrupt == CorruptImagePolicy::kFail) {
    throw InputError(files_[static_cast<std::size_t>(index)] + ": corrupt JPEG (sample " +
                     std::to_string(index) + "): " + error +
                     " (set on_corrupt to skip to skip such images)");
  }
  count_skipped();
  return false;
}

bool JpegFolderDataset::get(std::int64_t index, const SampleContext& context, void* input,
                            void* target) const {
  const std::string& path = files_[static_cast<std::size_t>(index)];
  thread_local DecodedRegion region;  // one buffer per worker, grown to the largest crop
  int width = 0, height = 0;
  std::string error;
  bool decoded = false;
  Choices c;
  try {
    std::vector<std::uint8_t> bytes = read_file(path);
    // The crop is drawn on the full size the header gives, so it does not depend on the scale.
    if (read_jpeg_header(bytes.data(), bytes.size(), &width, &height, &error)) {
      c = choose(width, height, context);
      const int size = options_.image_size;
      const int eighths = options_.dct_scaling ? jpeg_decode_eighths(c.box, size, size) : 8;
      const int scaled_width = jpeg_scaled_size(width, eighths);
      const int scaled_height = jpeg_scaled_size(height, eighths);
      c.box = scale_crop_box(c.box, eighths, scaled_width, scaled_height);
      if (options_.region_decode) {
        decoded = decode_jpeg_region(bytes.data(), bytes.size(), eighths,
                                     resize_footprint(c.box, scaled_width, scaled_height), &region,
                                     &error);
      } else {
        decoded = decode_jpeg_rgb(bytes.data(), bytes.size(), &region.rgb, &width, &height, &error,
                                  eighths);
        region.x0 = region.y0 = 0;
        region.columns = region.width = width;
        region.rows = region.height = height;
      }
    }
  } catch (const InputError& e) {
    if (options_.on_corrupt == CorruptImagePolicy::kFail) throw;
    error = e.what();
  }
  if (!decoded) return refuse(index, error);
  float* image = static_cast<float*>(input);
  const int size = options_.image_size;
  resize_crop_window(region.window(), 3, c.box, size, size, c.flip, mean_.data(), inv_std_.data(),
                     image);
  if (c.shift_x != 0 || c.shift_y != 0) {
    float fill[3];
    for (int ch = 0; ch < 3; ++ch) fill[ch] = -mean_[ch] * inv_std_[ch];  // a black padding pixel
    shift_image_chw(image, 3, size, size, c.shift_x, c.shift_y, fill);
  }
  *static_cast<std::int64_t*>(target) = labels_[static_cast<std::size_t>(index)];
  return true;
}

bool JpegFolderDataset::get_encoded(std::int64_t index, const SampleContext& context,
                                    EncodedImage* image, void* target) const {
  image->file = files_[static_cast<std::size_t>(index)];
  image->rgb.clear();
  std::string error;
  try {
    image->bytes = read_file(image->file);
  } catch (const InputError& e) {
    if (options_.on_corrupt == CorruptImagePolicy::kFail) throw;
    return refuse(index, e.what());
  }
  if (!read_jpeg_header(image->bytes.data(), image->bytes.size(), &image->width, &image->height,
                        &error)) {
    return refuse(index, error);
  }
  const Choices c = choose(image->width, image->height, context);
  image->box = c.box;
  image->flip = c.flip;
  image->shift_x = c.shift_x;
  image->shift_y = c.shift_y;
  bool truncated = false;
  if (!jpeg_decodable_on_device(image->bytes.data(), image->bytes.size(), &truncated)) {
    // Progressive, grayscale, CMYK...: decoded here at full size (the device only finishes it);
    // a truncated file fails here as it does on the CPU path.
    int width = 0, height = 0;
    if (!decode_jpeg_rgb(image->bytes.data(), image->bytes.size(), &image->rgb, &width, &height,
                         &error)) {
      return refuse(index, error);
    }
    image->bytes.clear();
  }
  *static_cast<std::int64_t*>(target) = labels_[static_cast<std::size_t>(index)];
  return true;
}

ResizeCropParams JpegFolderDataset::device_finish() const {
  ResizeCropParams p;
  p.out_width = p.out_height = options_.image_size;
  for (int c = 0; c < 3; ++c) {
    p.mean[c] = mean_[c];
    p.inv_std[c] = inv_std_[c];
    p.fill[c] = -mean_[c] * inv_std_[c];
  }
  return p;
}

// ---------------------------------------------------------------------------------------------
// Synthetic images

SyntheticImageDataset::SyntheticImageDataset(std::int64_t size, int channels, int height, int width,
                                             int num_classes, std::uint64_t seed)
    : size_(size),
      channels_(channels),
      height_(height),
      width_(width),
      num_classes_(num_classes),
      seed_(seed) {
  if (size <= 0 || channels <= 0 || height <= 0 || width <= 0 || num_classes <= 0) {
    throw InputError("synthetic images need positive size, shape and class count");
  }
}

SampleSpec SyntheticImageDataset::spec() const {
  return SampleSpec{{channels_, height_, width_}, DType::F32, {}, DType::I64};
}

std::string SyntheticImageDataset::describe() const {
  return "synthetic_images (" + std::to_string(size_) + " samples of " +
         shape_str({channels_, height_, width_}) + ", seed " + std::to_string(seed_) + ")";
}

bool SyntheticImageDataset::get(std::int64_t index, const SampleContext& /*context*/, void* input,
                                void* target) const {
  auto* out = static_cast<float*>(input);
  std::int64_t count = static_cast<std::int64_t>(channels_) * height_ * width_;
  // Uniform in (-sqrt(3), sqrt(3)): mean 0, variance 1. Philox keys each sample by (seed,
  // index); within it a SplitMix64 stream gives four 16-bit pixels per step, several times
  // cheaper than a Philox block per four pixels, so 224x224 images keep up with a GPU.
  Philox4x32 key = philox(static_cast<std::uint64_t>(index), seed_, 2);
  std::uint64_t state = (static_cast<std::uint64_t>(key.v[0]) << 32) | key.v[1];
  constexpr float kHalfWidth = 1.7320508075688772f;
  constexpr float kStep = 2.0f * kHalfWidth / 65536.0f;
  for (std::int64_t i = 0; i < count; i += 4) {
    state += 0x9E3779B97F4A7C15ull;
    std::uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    for (std::int64_t k = 0; k < 4 && i + k < count; ++k) {
      out[i + k] = (static_cast<float>((z >> (16 * k)) & 0xFFFF) + 0.5f) * kStep - kHalfWidth;
    }
  }
  std::uint32_t word = philox(static_cast<std::uint64_t>(index), seed_, 1).v[0];
  *static_cast<std::int64_t*>(target) =
      static_cast<std::int64_t>((static_cast<std::uint64_t>(word) * num_classes_) >> 32);
  return true;
}

}  // namespace kiln::data
