#pragma once
// make_dataset(): the datasets by name, for the trainer and the command line.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/image_datasets.h"
#include "data/llmc_shards.h"
#include "data/token_dataset.h"

namespace kiln::data {

struct DatasetOptions {
  // fashion_mnist, cifar10, jpeg_folder: augmentation and normalisation; unset = the kind's
  // usual (Fashion-MNIST: normalise only; CIFAR-10: pad-4 crop, flip, normalise; JPEG folder:
  // `jpeg`'s, ImageNet's random resized crop, flip and statistics). Set, it replaces the usual
  // whole: what it leaves off is off. Random parts apply only when the loader runs with
  // LoaderOptions::train.
  std::optional<ImageAugment> image_augment;
  JpegFolderOptions jpeg;  // jpeg_folder (its augmentation fields unless image_augment is set)
  // tokens_mlm, tokens_clm, synthetic_tokens, llmc_shards
  std::int64_t seq_len = 128;
  MaskingOptions masking;  // tokens_mlm (mask_token_id required)
  // synthetic_images, synthetic_tokens
  std::int64_t synthetic_size = 10000;
  int channels = 3, height = 32, width = 32, num_classes = 10;
  // synthetic_tokens: the ids drawn; llmc_shards: the model's vocabulary, every token below it
  std::int64_t vocab_size = 32000;
  std::uint64_t seed = 0;
};

// Known kinds and what `path` is for each:
//   fashion_mnist     directory of MNIST-format idx files ("" = default_fashion_mnist_dir())
//   mnist             the same format, no default directory
//   cifar10           directory of the CIFAR-10 binary batches
//   jpeg_folder       root/train/<class>/*.jpg and root/val/<class>/*.jpg (or test/), or
//                     root/<class>/*.jpg without the split level (jpeg_split_dir)
//   tokens_mlm        token file, or directory holding <split>.tok; masked-LM samples
//   tokens_clm        the same; next-token samples
//   llmc_shards       glob of llm.c token shards (data/llmc_shards.h); next-token samples. The
//                     split picks nothing: the caller passes the training glob for "train" and
//                     the validation glob for evaluation
//   synthetic_images  no path; options.synthetic_size images of options.{channels,height,width}
//   synthetic_tokens  no path; options.synthetic_size windows of options.seq_len
// `split` is "train", "test" or "val". Throws InputError for an unknown kind (listing the
// known ones) or a bad path.
std::shared_ptr<Dataset> make_dataset(const std::string& kind, const std::string& path,
                                      const std::string& split,
                                      const DatasetOptions& options = DatasetOptions());

std::vector<std::string> dataset_kinds();

// The folder a jpeg_folder split reads: root/train for "train"; root/val, else root/test, for
// "test" and "val"; the root itself when it holds none of train/, val/, test/ (root/<class>/).
// InputError naming the root when it is not a directory, or when it has split folders but not
// the one asked for (split folders are never taken for classes).
std::string jpeg_split_dir(const std::string& path, const std::string& split);

}  // namespace kiln::data
