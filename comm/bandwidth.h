#pragma once
// All-reduce bandwidth over a Communicator, measured as nccl-tests measures it (all_reduce.cu):
// algorithm bandwidth = bytes / time, bus bandwidth = algbw × 2(n−1)/n, the figure comparable
// with the link's speed whatever the number of ranks. Each size is also checked against a closed
// form: every rank fills its buffer with rank + 1, and after one sum every element must read
// n(n+1)/2 (exact in f32 for any realistic n); the count of other values is reported.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/communicator.h"

namespace kiln {

struct AllReduceBandwidth {
  std::size_t bytes = 0;
  int iterations = 0;
  double seconds = 0;      // per all-reduce, the slowest rank's
  double algbw_gbs = 0;    // GB/s (1e9 bytes)
  double busbw_gbs = 0;    // GB/s; 0 with one rank
  std::int64_t wrong = 0;  // elements not equal to n(n+1)/2, summed over ranks
};

// 2(n−1)/n: the bytes each rank sends and receives per byte of buffer in a ring all-reduce.
double all_reduce_bus_factor(int ranks);

// Sizes from `min_bytes` up to `max_bytes`, ×4 each step (both ends included; max_bytes alone if
// it is below min_bytes). Multiples of 4 bytes (f32 elements).
std::vector<std::size_t> all_reduce_sizes(std::size_t min_bytes, std::size_t max_bytes);

// Times f32 sum all-reduces of `bytes` on comm.device(): `warmup` untimed, then `iterations`
// timed from a barrier to the host seeing the last one finish. Collective: every rank calls it
// with the same arguments. Bounded by the communicator's collective timeout (the watchdog).
AllReduceBandwidth measure_all_reduce(Communicator& comm, std::size_t bytes, int iterations,
                                      int warmup = 2);

}  // namespace kiln
