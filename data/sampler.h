#pragma once
// Which dataset indices each rank reads in each epoch. The order is a pure function of
// (seed, epoch), so it is reproducible and a run can resume mid-epoch.

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::data {

// How a dataset of N samples is split over W ranks when W does not divide N.
enum class ShardMode {
  // PyTorch DistributedSampler(drop_last=False): every rank gets ceil(N / W) samples; the
  // shuffled order is extended by repeating its first samples. Every sample is read at least
  // once; (ceil(N / W) * W - N) are read twice. All ranks run the same number of steps.
  kPad,
  // PyTorch DistributedSampler(drop_last=True): every rank gets floor(N / W) samples; the last
  // N mod W of the shuffled order are not read this epoch (a different few each epoch).
  kDropTail,
  // Every sample exactly once: the first N mod W ranks get one more. Ranks may run different
  // step counts, so use it for evaluation, not for data-parallel training.
  kUneven,
};

const char* shard_mode_name(ShardMode mode);          // "pad", "drop_tail", "uneven"
ShardMode parse_shard_mode(const std::string& name);  // InputError listing the known names

// A permutation of 0..n-1 (Fisher-Yates over Philox words keyed by seed, stream by epoch).
std::vector<std::int64_t> shuffled_order(std::int64_t n, std::uint64_t seed, std::int64_t epoch);

// How many samples rank `rank` reads per epoch.
std::int64_t shard_size(std::int64_t dataset_size, int rank, int world_size, ShardMode mode);

// The dataset indices rank `rank` reads in `epoch`, in reading order: position p of the rank is
// position p * W + rank of the (shuffled, padded or truncated) global order.
std::vector<std::int64_t> shard_indices(std::int64_t dataset_size, bool shuffle, std::uint64_t seed,
                                        std::int64_t epoch, int rank, int world_size,
                                        ShardMode mode);

}  // namespace kiln::data
