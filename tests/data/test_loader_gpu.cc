// The loader delivering to a GPU: batches staged in pinned memory, copied on the loader's own
// stream, equal to what the CPU loader delivers, and resumable with copies in flight.

#include <gtest/gtest.h>

#include "core/allocator.h"
#include "core/stream.h"
#include "data/image_datasets.h"
#include "data/loader.h"
#include "data/token_dataset.h"

namespace kiln::data {
namespace {

const Device kGpu = Device::cuda(0);

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

}  // namespace
}  // namespace kiln::data
