// The idx (MNIST), CIFAR-10 and token-file readers: any bytes give a dataset or an InputError.
// The first input byte picks the reader; for idx the rest is split into images and labels.
#include <cstdint>
#include <cstdio>

#include "core/check.h"
#include "data/image_datasets.h"
#include "data/token_dataset.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  int which = data[0] % 3;
  data += 1;
  size -= 1;
  try {
    if (which == 0) {
      std::size_t split = data[0] % (size);
      std::string images = kiln::fuzz::write_temp("images", data, split);
      std::string labels = kiln::fuzz::write_temp("labels", data + split, size - split);
      auto d = kiln::data::load_idx_dataset(images, labels, 10, {});
      std::remove(images.c_str());
      std::remove(labels.c_str());
    } else if (which == 1) {
      std::string path = kiln::fuzz::write_temp("cifar", data, size);
      auto d = kiln::data::load_cifar10_files({path}, {});
      std::remove(path.c_str());
    } else {
      std::string path = kiln::fuzz::write_temp("tokens", data, size);
      auto f = kiln::data::read_token_file(path);
      std::remove(path.c_str());
    }
  } catch (const kiln::InputError&) {
  }
  return 0;
}
