// Shuffling, sharding, the loader's batch sequence, resume, worker-count independence,
// prefetch depth and the wait-time statistic.

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include "data/image_datasets.h"
#include "data/loader.h"
#include "data/sampler.h"
#include "tests/data/test_util.h"

namespace kiln::data {
namespace {

using testing::expect_input_error;

// Sample i: input (2) f32 = {i, a random number of (seed, epoch, i)}, target i.
class IndexDataset : public Dataset {
 public:
  explicit IndexDataset(std::int64_t size, int sleep_us = 0, std::int64_t fail_at = -1)
      : size_(size), sleep_us_(sleep_us), fail_at_(fail_at) {}
  std::int64_t size() const override { return size_; }
  SampleSpec spec() const override { return SampleSpec{{2}, DType::F32, {}, DType::I64}; }
  std::string describe() const override { return "index dataset"; }
  std::int64_t num_classes() const override { return size_; }
  bool get(std::int64_t index, const SampleContext& context, void* input,
           void* target) const override {
    calls.fetch_add(1);
    if (sleep_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(sleep_us_));
    if (index == fail_at_) throw InputError("sample " + std::to_string(index) + " is bad");
    auto* x = static_cast<float*>(input);
    x[0] = static_cast<float>(index);
    x[1] = static_cast<float>(context.uniform(0));
    *static_cast<std::int64_t*>(target) = index;
    return true;
  }
  mutable std::atomic<std::int64_t> calls{0};

 private:
  std::int64_t size_;
  int sleep_us_;
  std::int64_t fail_at_;
};

TEST(Sampler, ShuffleIsAPermutationFixedBySeedAndEpoch) {
  std::vector<std::int64_t> a = shuffled_order(1000, 42, 3);
  std::vector<std::int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (std::int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[i], i);
  EXPECT_EQ(a, shuffled_order(1000, 42, 3));
  EXPECT_NE(a, shuffled_order(1000, 42, 4));
  EXPECT_NE(a, shuffled_order(1000, 43, 3));
  std::int64_t fixed_points = 0;
  for (std::int64_t i = 0; i < 1000; ++i) fixed_points += a[i] == i;
  EXPECT_LT(fixed_points, 10);  // about 1 expected for a uniform permutation
}

TEST(Sampler, EveryShardModeCoversTheDataset) {
  for (std::int64_t n : {1, 2, 7, 10, 13, 64, 101}) {
    for (int world : {1, 2, 3, 4, 8}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " world=" + std::to_string(world));
      std::map<std::int64_t, int> uneven, pad, drop;
      std::int64_t pad_per_rank = -1;
      for (int rank = 0; rank < world; ++rank) {
        for (std::int64_t i : shard_indices(n, true, 5, 1, rank, world, ShardMode::kUneven)) {
          ++uneven[i];
        }
        std::vector<std::int64_t> p = shard_indices(n, true, 5, 1, rank, world, ShardMode::kPad);
        if (pad_per_rank < 0) pad_per_rank = static_cast<std::int64_t>(p.size());
        EXPECT_EQ(static_cast<std::int64_t>(p.size()), pad_per_rank);  // equal step counts
        for (std::int64_t i : p) ++pad[i];
        for (std::int64_t i : shard_indices(n, true, 5, 1, rank, world, ShardMode::kDropTail)) {
          ++drop[i];
        }
      }
      // Uneven: every sample exactly once.
      ASSERT_EQ(static_cast<std::int64_t>(uneven.size()), n);
      for (auto& [index, count] : uneven) EXPECT_EQ(count, 1) << index;
      // Pad: every sample at least once; the padding is exactly ceil(n / W) * W - n repeats.
      ASSERT_EQ(static_cast<std::int64_t>(pad.size()), n);
      std::int64_t repeats = 0;
      for (auto& [index, count] : pad) {
        EXPECT_GE(count, 1);
        repeats += count - 1;
      }
      EXPECT_EQ(repeats, pad_per_rank * world - n);
      // Drop tail: no sample twice, floor(n / W) * W read.
      std::int64_t read = 0;
      for (auto& [index, count] : drop) {
        EXPECT_EQ(count, 1);
        read += count;
      }
      EXPECT_EQ(read, n / world * world);
    }
  }
}

std::vector<Batch> take(DataLoader& loader, int count) {
  std::vector<Batch> out;
  for (int i = 0; i < count; ++i) out.push_back(loader.next());
  return out;
}

void expect_same_batches(const std::vector<Batch>& a, const std::vector<Batch>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE("batch " + std::to_string(i));
    EXPECT_EQ(a[i].epoch, b[i].epoch);
    EXPECT_EQ(a[i].index, b[i].index);
    EXPECT_EQ(a[i].sample_indices, b[i].sample_indices);
    EXPECT_EQ(a[i].inputs.to_vector<float>(), b[i].inputs.to_vector<float>());
    EXPECT_EQ(a[i].targets.to_vector<std::int64_t>(), b[i].targets.to_vector<std::int64_t>());
  }
}

TEST(DataLoader, EveryRankTogetherReadsEachSampleOncePerEpoch) {
  auto dataset = std::make_shared<IndexDataset>(23);
  for (int world : {1, 2, 3, 5}) {
    std::map<std::int64_t, int> seen;
    for (int rank = 0; rank < world; ++rank) {
      LoaderOptions options;
      options.batch_size = 3;
      options.workers = 2;
      options.seed = 11;
      options.rank = rank;
      options.world_size = world;
      options.shard_mode = ShardMode::kUneven;
      DataLoader loader(dataset, options);
      for (std::int64_t b = 0; b < loader.batches_per_epoch(); ++b) {
        Batch batch = loader.next();
        EXPECT_EQ(batch.epoch, 0);
        EXPECT_EQ(batch.last_in_epoch, b + 1 == loader.batches_per_epoch());
        std::vector<std::int64_t> targets = batch.targets.to_vector<std::int64_t>();
        EXPECT_EQ(targets, batch.sample_indices);
        for (std::int64_t i : targets) ++seen[i];
      }
      EXPECT_EQ(loader.epoch(), 1);
    }
    ASSERT_EQ(seen.size(), 23u) << "world " << world;
    for (auto& [index, count] : seen) EXPECT_EQ(count, 1) << "world " << world;
  }
}

TEST(DataLoader, BatchShapesAndDropLast) {
  auto dataset = std::make_shared<IndexDataset>(10);
  LoaderOptions options;
  options.batch_size = 4;
  options.shuffle = false;
  DataLoader keep(dataset, options);
  EXPECT_EQ(keep.batches_per_epoch(), 3);
  std::vector<Batch> batches = take(keep, 4);
  EXPECT_EQ(batches[0].inputs.shape(), (Shape{4, 2}));
  EXPECT_EQ(batches[0].targets.shape(), (Shape{4}));
  EXPECT_EQ(batches[2].inputs.shape(), (Shape{2, 2}));  // the partial last batch
  EXPECT_EQ(batches[2].sample_indices, (std::vector<std::int64_t>{8, 9}));
  EXPECT_EQ(batches[3].epoch, 1);
  EXPECT_EQ(batches[3].sample_indices, (std::vector<std::int64_t>{0, 1, 2, 3}));
  options.drop_last = true;
  DataLoader drop(dataset, options);
  EXPECT_EQ(drop.batches_per_epoch(), 2);
  std::vector<Batch> dropped = take(drop, 3);
  EXPECT_EQ(dropped[2].epoch, 1);
  EXPECT_EQ(dropped[2].index, 0);
  options.batch_size = 11;
  expect_input_error([&] { DataLoader too_big(dataset, options); }, {"less than one batch"});
}

TEST(DataLoader, SequenceIsIndependentOfWorkerCount) {
  auto dataset = std::make_shared<IndexDataset>(37);
  std::vector<Batch> reference;
  for (int workers : {0, 1, 3}) {
    LoaderOptions options;
    options.batch_size = 5;
    options.workers = workers;
    options.prefetch = 3;
    options.seed = 99;
    DataLoader loader(dataset, options);
    std::vector<Batch> batches = take(loader, 20);  // crosses two epoch boundaries
    if (reference.empty()) {
      reference = batches;
    } else {
      expect_same_batches(reference, batches);
    }
  }
  // Each epoch reads a new order and new random numbers.
  EXPECT_NE(reference[0].sample_indices, reference[8].sample_indices);
  EXPECT_EQ(reference[8].epoch, 1);
}

TEST(DataLoader, RestoredPositionGivesTheIdenticalSequence) {
  auto dataset = std::make_shared<IndexDataset>(29);
  LoaderOptions options;
  options.batch_size = 4;
  options.workers = 2;
  options.seed = 1234;
  DataLoader original(dataset, options);
  take(original, 5);
  LoaderState saved = original.state();
  EXPECT_EQ(saved.epoch, 0);
  EXPECT_EQ(saved.next_batch, 5);
  EXPECT_EQ(saved.batches_per_epoch, 8);
  std::vector<Batch> expected = take(original, 12);

  // A new process: another worker count and seed in its options; the state's seed wins.
  options.workers = 3;
  options.seed = 1;
  DataLoader resumed(dataset, options);
  take(resumed, 2);  // some batches already prefetched, to be thrown away
  resumed.restore(saved);
  EXPECT_EQ(resumed.state().next_batch, 5);
  expect_same_batches(expected, take(resumed, 12));

  // Restoring in the same loader, back to a mid-epoch position.
  original.restore(saved);
  expect_same_batches(expected, take(original, 12));

  // set_epoch starts an epoch.
  original.set_epoch(3);
  Batch first = original.next();
  EXPECT_EQ(first.epoch, 3);
  EXPECT_EQ(first.index, 0);

  LoaderState wrong = saved;
  wrong.batches_per_epoch = 9;
  expect_input_error([&] { resumed.restore(wrong); }, {"9 batches per epoch", "has 8"});
  LoaderState beyond = saved;
  beyond.next_batch = 8;
  expect_input_error([&] { resumed.restore(beyond); }, {"out of range"});
}

// One loader per rank of a world of `world`, each at `state` (or at the start).
std::vector<std::unique_ptr<DataLoader>> world_of(std::shared_ptr<const Dataset> dataset, int world,
                                                  std::int64_t batch_size,
                                                  const LoaderState* state = nullptr) {
  std::vector<std::unique_ptr<DataLoader>> ranks;
  for (int r = 0; r < world; ++r) {
    LoaderOptions options;
    options.batch_size = batch_size;
    options.workers = 1;
    options.seed = 99;
    options.rank = r;
    options.world_size = world;
    ranks.push_back(std::make_unique<DataLoader>(dataset, options));
    if (state != nullptr) ranks.back()->restore(*state);
  }
  return ranks;
}

// The samples of each of `steps` optimizer steps of `accumulation` batches, over every rank.
std::vector<std::multiset<std::int64_t>> step_samples(
    std::vector<std::unique_ptr<DataLoader>>& ranks, int steps, int accumulation) {
  std::vector<std::multiset<std::int64_t>> out(static_cast<std::size_t>(steps));
  for (auto& rank : ranks) {
    for (int s = 0; s < steps; ++s) {
      for (const Batch& b : take(*rank, accumulation)) {
        out[static_cast<std::size_t>(s)].insert(b.sample_indices.begin(), b.sample_indices.end());
      }
    }
  }
  return out;
}

TEST(DataLoader, APositionContinuesOnAnotherWorldSize) {
  // A global batch of 24 (4 per rank, accumulated 3 times on 2 ranks, twice on 3, 6 times on 1)
  // over 120 samples: 5 steps per epoch. 7 steps on 2 ranks end at sample 48 of epoch 1.
  auto dataset = std::make_shared<IndexDataset>(120);
  auto two = world_of(dataset, 2, 4);
  for (auto& rank : two) take(*rank, 7 * 3);
  const LoaderState saved = two[0]->state();
  EXPECT_EQ(saved.epoch, 1);
  EXPECT_EQ(saved.epoch_sample(), 48);
  EXPECT_EQ(saved.samples_per_batch, 8);
  EXPECT_EQ(saved.dataset_size, 120);
  const auto expected = step_samples(two, 6, 3);  // into epoch 2
  for (int world : {1, 3}) {
    SCOPED_TRACE("world size " + std::to_string(world));
    const int accumulation = 24 / (4 * world);
    auto resumed = world_of(dataset, world, 4, &saved);
    EXPECT_EQ(resumed[0]->state().epoch_sample(), 48);
    EXPECT_EQ(step_samples(resumed, 6, accumulation), expected);
    // Rank for rank the batches of an uninterrupted run of this world size.
    auto fresh = world_of(dataset, world, 4);
    auto again = world_of(dataset, world, 4, &saved);
    for (int r = 0; r < world; ++r) {
      take(*fresh[static_cast<std::size_t>(r)], 7 * accumulation);
      expect_same_batches(take(*fresh[static_cast<std::size_t>(r)], 6 * accumulation),
                          take(*again[static_cast<std::size_t>(r)], 6 * accumulation));
    }
  }

  // 100 samples: an epoch of 2 ranks is 13 batches of 8 samples (the last padded), so epoch 1's
  // batch 2 starts at sample 16, inside a batch of 3 ranks (12 samples).
  auto small = std::make_shared<IndexDataset>(100);
  auto writer = world_of(small, 2, 4);
  take(*writer[0], 15);
  const LoaderState inside = writer[0]->state();
  EXPECT_EQ(inside.epoch_sample(), 16);
  auto three = world_of(small, 3, 4);
  expect_input_error([&] { three[0]->restore(inside); }, {"sample 16 is not a multiple of 12"});
  auto other = world_of(dataset, 3, 4);
  expect_input_error([&] { other[0]->restore(inside); }, {"data set of 100 samples", "reads 120"});
}

TEST(DataLoader, AugmentationIsDeterministicAcrossWorkerCounts) {
  // CIFAR-shaped images with crop and flip: the same tensors whatever the worker count.
  std::vector<std::uint8_t> pixels(12 * 3 * 8 * 8), labels(12);
  for (std::size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<std::uint8_t>(i * 31);
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<std::uint8_t>(i % 10);
  ImageAugment augment;
  augment.crop_padding = 2;
  augment.horizontal_flip = true;
  augment.normalization = Normalization{{0.5f}, {0.25f}};
  auto dataset = std::make_shared<ImageArrayDataset>("tiny", pixels, labels, 3, 8, 8, 10, augment);
  std::vector<Batch> reference;
  for (int workers : {1, 4}) {
    LoaderOptions options;
    options.batch_size = 5;
    options.workers = workers;
    options.seed = 3;
    DataLoader loader(dataset, options);
    std::vector<Batch> batches = take(loader, 6);
    EXPECT_EQ(batches[0].inputs.shape(), (Shape{5, 3, 8, 8}));
    if (reference.empty()) {
      reference = batches;
    } else {
      expect_same_batches(reference, batches);
    }
  }
}

TEST(DataLoader, PrefetchBoundsWorkAheadAndWaitTimeIsCounted) {
  auto dataset = std::make_shared<IndexDataset>(1000, /*sleep_us=*/2000);
  LoaderOptions options;
  options.batch_size = 2;
  options.workers = 2;
  options.prefetch = 3;
  {
    DataLoader loader(dataset, options);
    Batch first = loader.next();
    EXPECT_GT(loader.wait_time(), 0.001);  // at least one sample's load
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    // Batches 1..3 may be loaded ahead, not more: (1 + 3) batches of 2 samples.
    EXPECT_LE(dataset->calls.load(), 8);
    EXPECT_GE(dataset->calls.load(), 6);
    double waited = loader.wait_time();
    loader.next();  // already loaded: no wait
    EXPECT_LT(loader.wait_time() - waited, 0.002);
    LoaderStats stats = loader.stats();
    EXPECT_EQ(stats.batches, 2);
    EXPECT_EQ(stats.samples, 4);
  }
  {
    // More workers than prefetch: every worker gets a batch (4 ahead), or 2 of them would idle.
    LoaderOptions busy = options;
    busy.workers = 4;
    auto slow = std::make_shared<IndexDataset>(1000, /*sleep_us=*/2000);
    DataLoader loader(slow, busy);
    loader.next();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_LE(slow->calls.load(), 10);  // (1 + 4) batches of 2
    EXPECT_GE(slow->calls.load(), 8);
  }
}

TEST(DataLoader, SampleErrorsReachTheConsumer) {
  auto dataset = std::make_shared<IndexDataset>(20, 0, /*fail_at=*/13);
  LoaderOptions options;
  options.batch_size = 4;
  options.shuffle = false;
  options.workers = 2;
  DataLoader loader(dataset, options);
  take(loader, 3);
  expect_input_error([&] { loader.next(); }, {"sample 13 is bad"});
  Batch after = loader.next();  // the loader goes on with the next batch
  EXPECT_EQ(after.index, 4);

  LoaderOptions bad = options;
  bad.rank = 2;
  bad.world_size = 2;
  expect_input_error([&] { DataLoader l(dataset, bad); }, {"rank 2 is outside world size 2"});
  bad = options;
  bad.device = Device::cuda(0);
  if (!cuda_built()) {
    expect_input_error([&] { DataLoader l(dataset, bad); }, {"built without CUDA"});
  }
}

}  // namespace
}  // namespace kiln::data
