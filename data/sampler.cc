#include "data/sampler.h"

#include <numeric>
#include <utility>

#include "core/check.h"
#include "core/enum_names.h"
#include "core/random.h"

namespace kiln::data {

namespace {
constexpr EnumName<ShardMode> kShardModeNames[] = {
    {ShardMode::kPad, "pad"}, {ShardMode::kDropTail, "drop_tail"}, {ShardMode::kUneven, "uneven"}};
}  // namespace

const char* shard_mode_name(ShardMode mode) {
  return enum_name(kShardModeNames, mode);
}

ShardMode parse_shard_mode(const std::string& name) {
  return parse_enum(kShardModeNames, name, "shard mode");
}

std::vector<std::int64_t> shuffled_order(std::int64_t n, std::uint64_t seed, std::int64_t epoch) {
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  // A stream of its own (top bit set), apart from the per-sample augmentation streams.
  const std::uint64_t stream = static_cast<std::uint64_t>(epoch) | (1ull << 63);
  Philox4x32 block{};
  for (std::int64_t i = n - 1; i > 0; --i) {
    std::uint64_t k = static_cast<std::uint64_t>(n - 1 - i);
    if (k % 2 == 0) block = philox(k / 2, seed, stream);
    // 64 random bits per draw: the modulo bias is below 2^-32 for any realistic n.
    std::uint64_t bits =
        (static_cast<std::uint64_t>(block.v[2 * (k % 2)]) << 32) | block.v[2 * (k % 2) + 1];
    std::uint64_t j = bits % static_cast<std::uint64_t>(i + 1);
    std::swap(order[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(j)]);
  }
  return order;
}

std::int64_t shard_size(std::int64_t dataset_size, int rank, int world_size, ShardMode mode) {
  KILN_CHECK(world_size > 0 && rank >= 0 && rank < world_size, "bad rank/world size");
  switch (mode) {
    case ShardMode::kPad:
      return (dataset_size + world_size - 1) / world_size;
    case ShardMode::kDropTail:
      return dataset_size / world_size;
    case ShardMode::kUneven:
      return dataset_size / world_size + (rank < dataset_size % world_size ? 1 : 0);
  }
  return 0;
}

std::vector<std::int64_t> shard_indices(std::int64_t dataset_size, bool shuffle, std::uint64_t seed,
                                        std::int64_t epoch, int rank, int world_size,
                                        ShardMode mode) {
  if (world_size <= 0 || rank < 0 || rank >= world_size) {
    throw InputError("rank " + std::to_string(rank) + " is outside world size " +
                     std::to_string(world_size));
  }
  std::vector<std::int64_t> order;
  if (shuffle) {
    order = shuffled_order(dataset_size, seed, epoch);
  } else {
    order.resize(static_cast<std::size_t>(dataset_size));
    std::iota(order.begin(), order.end(), 0);
  }
  std::int64_t count = shard_size(dataset_size, rank, world_size, mode);
  std::vector<std::int64_t> mine(static_cast<std::size_t>(count));
  for (std::int64_t p = 0; p < count; ++p) {
    std::int64_t global = p * world_size + rank;  // below ceil(N / W) * W
    mine[static_cast<std::size_t>(p)] = order[static_cast<std::size_t>(global % dataset_size)];
  }
  return mine;
}

}  // namespace kiln::data
