// The real Fashion-MNIST files of Debian's dataset-fashion-mnist package.

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "data/factory.h"
#include "data/file_io.h"
#include "data/image_datasets.h"
#include "data/loader.h"

namespace kiln::data {
namespace {

TEST(FashionMnist, TrainAndTestSplitsHaveTheirPublishedShape) {
  // A missing package is a failure, not a skip: CI installs dataset-fashion-mnist.
  ASSERT_TRUE(is_directory(default_fashion_mnist_dir()))
      << default_fashion_mnist_dir() << " missing: apt-get install dataset-fashion-mnist";
  for (auto [split, count] :
       {std::pair<const char*, std::int64_t>{"train", 60000}, {"test", 10000}}) {
    SCOPED_TRACE(split);
    std::shared_ptr<Dataset> dataset = make_dataset("fashion_mnist", "", split);
    ASSERT_EQ(dataset->size(), count);
    EXPECT_EQ(dataset->spec().input_shape, (Shape{1, 28, 28}));
    EXPECT_EQ(dataset->num_classes(), 10);
    auto* images = dynamic_cast<ImageArrayDataset*>(dataset.get());
    ASSERT_NE(images, nullptr);
    // Balanced classes: count / 10 of each of 0..9.
    std::vector<std::int64_t> per_class(10, 0);
    double pixel_sum = 0;
    for (std::int64_t i = 0; i < count; ++i) {
      int label = images->label(i);
      ASSERT_GE(label, 0);
      ASSERT_LT(label, 10);
      ++per_class[label];
      const std::uint8_t* p = images->pixels(i);
      for (int j = 0; j < 28 * 28; ++j) pixel_sum += p[j];
    }
    for (int c = 0; c < 10; ++c) EXPECT_EQ(per_class[c], count / 10) << "class " << c;
    // Fashion-MNIST's mean pixel is 0.286 of full scale (the normalisation constant used).
    EXPECT_NEAR(pixel_sum / (count * 28.0 * 28.0 * 255.0), 0.286, 0.005);
    EXPECT_EQ(images->label(0), 9);  // both splits start with an ankle boot
  }
}

TEST(FashionMnist, LoaderReadsNormalisedBatches) {
  std::shared_ptr<Dataset> test = make_dataset("fashion_mnist", "", "test");
  LoaderOptions options;
  options.batch_size = 1000;
  options.workers = 2;
  options.train = false;
  DataLoader loader(test, options);
  double sum = 0, sum_sq = 0;
  std::int64_t n = 0;
  for (std::int64_t b = 0; b < loader.batches_per_epoch(); ++b) {
    Batch batch = loader.next();
    EXPECT_EQ(batch.inputs.shape(), (Shape{1000, 1, 28, 28}));
    for (float v : batch.inputs.to_vector<float>()) {
      sum += v;
      sum_sq += v * v;
      ++n;
    }
  }
  double mean = sum / n;
  EXPECT_NEAR(mean, 0.0, 0.02);
  EXPECT_NEAR(std::sqrt(sum_sq / n - mean * mean), 1.0, 0.02);
}

}  // namespace
}  // namespace kiln::data
