#include "data/factory.h"

#include "core/check.h"
#include "data/file_io.h"

namespace kiln::data {

namespace {

ImageAugment fashion_mnist_augment() {
  ImageAugment augment;
  augment.normalization = Normalization{{0.2860f}, {0.3530f}};
  return augment;
}

ImageAugment cifar10_augment() {
  ImageAugment augment;
  augment.crop_padding = 4;
  augment.horizontal_flip = true;
  augment.normalization = Normalization{{0.4914f, 0.4822f, 0.4465f}, {0.2470f, 0.2435f, 0.2616f}};
  return augment;
}

// The experiment's augmentation in place of the folder's ImageNet defaults.
JpegFolderOptions jpeg_options(const DatasetOptions& options) {
  JpegFolderOptions jpeg = options.jpeg;
  if (!options.image_augment) return jpeg;
  const ImageAugment& augment = *options.image_augment;
  jpeg.random_resized_crop = augment.random_resized_crop();
  if (jpeg.random_resized_crop) {
    jpeg.scale_min = augment.resized_crop_scale_min;
    jpeg.scale_max = augment.resized_crop_scale_max;
  }
  jpeg.horizontal_flip = augment.horizontal_flip;
  jpeg.crop_padding = augment.crop_padding;
  jpeg.normalization = augment.normalization;
  return jpeg;
}

void check_split(const std::string& kind, const std::string& split) {
  if (split != "train" && split != "test" && split != "val") {
    throw InputError("unknown split '" + split + "' for " + kind + " (known: train, test, val)");
  }
}

std::string token_path(const std::string& path, const std::string& split) {
  if (is_directory(path)) {
    std::string file = join_path(path, split + ".tok");
    if (!path_exists(file)) throw InputError(file + ": no such token file");
    return file;
  }
  return path;
}

}  // namespace

std::string jpeg_split_dir(const std::string& path, const std::string& split) {
  if (!is_directory(path)) {
    throw InputError(path +
                     ": no such directory (jpeg_folder expects root/train/<class>/*.jpg and "
                     "root/val/<class>/*.jpg, or root/<class>/*.jpg)");
  }
  // ImageNet's layout names the held-out split "val", torchvision's ImageFolder users often
  // "test": the eval split ("test" in the config) takes whichever is there, "val" first.
  const std::vector<std::string> names = split == "train" ? std::vector<std::string>{"train"}
                                                          : std::vector<std::string>{"val", "test"};
  for (const std::string& name : names) {
    const std::string dir = join_path(path, name);
    if (is_directory(dir)) return dir;
  }
  // A root with split folders never has them read as classes.
  std::string present;
  for (const char* name : {"train", "val", "test"}) {
    if (is_directory(join_path(path, name)))
      present += (present.empty() ? "" : ", ") + std::string(name) + "/";
  }
  if (!present.empty()) {
    throw InputError(path + ": jpeg_folder has split folders (" + present + ") but none for the " +
                     split + " split (looked for " +
                     (split == "train" ? std::string("train/") : std::string("val/ and test/")) +
                     "); add it, or set data.eval_split: \"none\"");
  }
  return path;  // root/<class>/*.jpg: one folder for every split
}

std::vector<std::string> dataset_kinds() {
  return {"fashion_mnist", "mnist",       "cifar10",          "jpeg_folder",     "tokens_mlm",
          "tokens_clm",    "llmc_shards", "synthetic_images", "synthetic_tokens"};
}

std::shared_ptr<Dataset> make_dataset(const std::string& kind, const std::string& path,
                                      const std::string& split, const DatasetOptions& options) {
  check_split(kind, split);
  if (kind == "fashion_mnist" || kind == "mnist") {
    std::string dir = path;
    if (dir.empty()) {
      if (kind == "mnist") throw InputError("mnist needs the directory of its idx files");
      dir = default_fashion_mnist_dir();
    }
    return load_mnist_dir(dir, split, options.image_augment.value_or(fashion_mnist_augment()),
                          kind);
  }
  if (kind == "cifar10") {
    return load_cifar10_dir(path, split, options.image_augment.value_or(cifar10_augment()));
  }
  if (kind == "jpeg_folder") {
    return std::make_shared<JpegFolderDataset>(jpeg_split_dir(path, split), jpeg_options(options));
  }
  if (kind == "tokens_mlm" || kind == "tokens_clm") {
    auto file = std::make_shared<const TokenFile>(read_token_file(token_path(path, split)));
    if (kind == "tokens_mlm") {
      return std::make_shared<MaskedLmDataset>(file, options.seq_len, options.masking);
    }
    return std::make_shared<CausalLmDataset>(file, options.seq_len);
  }
  if (kind == "llmc_shards") {
    return std::make_shared<LlmcShardDataset>(path, options.seq_len, options.vocab_size);
  }
  // Synthetic test data differs from its training data by seed.
  std::uint64_t seed = options.seed + (split == "train" ? 0 : 0x9e3779b97f4a7c15ull);
  if (kind == "synthetic_images") {
    return std::make_shared<SyntheticImageDataset>(options.synthetic_size, options.channels,
                                                   options.height, options.width,
                                                   options.num_classes, seed);
  }
  if (kind == "synthetic_tokens") {
    return std::make_shared<SyntheticTokenDataset>(options.synthetic_size, options.seq_len,
                                                   options.vocab_size, seed);
  }
  std::string known;
  for (const std::string& k : dataset_kinds()) known += (known.empty() ? "" : ", ") + k;
  throw InputError("unknown dataset kind '" + kind + "' (known: " + known + ")");
}

}  // namespace kiln::data
