#pragma once
// Work split over the host's cores for element-wise host passes (the optimizer's CPU step, which
// offload runs over billions of elements). Callers give work whose result does not depend on how
// it is split (independent elements, or per-block partial sums added in block order), so a run
// gives the same bits on any number of cores.

#include <algorithm>
#include <cstdint>
#include <exception>
#include <thread>
#include <vector>

namespace kiln::cpu {

// The threads parallel_blocks uses: KILN_CPU_THREADS when set (>= 1), else the hardware's.
int host_threads();

// Calls f(b) for every block b in [0, blocks), on up to host_threads() threads, each taking a
// contiguous run of blocks; inline when `work` (the elements in all blocks) is below
// `inline_below`, where starting threads would cost more than it saves. The first exception
// thrown by any call is rethrown here after every thread has ended.
template <typename F>
void parallel_blocks(std::int64_t blocks, std::int64_t work, F&& f,
                     std::int64_t inline_below = std::int64_t{1} << 20) {
  const int threads =
      static_cast<int>(std::min<std::int64_t>(host_threads(), std::max<std::int64_t>(blocks, 1)));
  if (threads <= 1 || work < inline_below) {
    for (std::int64_t b = 0; b < blocks; ++b) f(b);
    return;
  }
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(threads));
  std::vector<std::thread> pool;
  pool.reserve(static_cast<std::size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    const std::int64_t begin = blocks * t / threads, end = blocks * (t + 1) / threads;
    pool.emplace_back([&f, &errors, t, begin, end] {
      try {
        for (std::int64_t b = begin; b < end; ++b) f(b);
      } catch (...) {
        errors[static_cast<std::size_t>(t)] = std::current_exception();
      }
    });
  }
  for (std::thread& th : pool) th.join();
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace kiln::cpu
