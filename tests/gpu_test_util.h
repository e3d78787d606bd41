#pragma once
// Shared by the GPU test suites: the device, fresh seeds for every run, the dtype epsilons of
// the tolerance rule (absolute + relative x epsilon), and NaN-poisoning of the caching
// allocator's free blocks, so that a layer output left unwritten shows up as NaN.

#include <chrono>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/stream.h"
#include "core/tensor.h"

namespace kiln::testing {

inline const Device kGpu = Device::cuda(0);

inline std::uint64_t fresh_seed() {
  return static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
}

inline double eps_of(DType t) {
  switch (t) {
    case DType::F64:
      return 2.2e-16;
    case DType::F32:
      return 1.2e-7;
    case DType::F16:
      return 9.8e-4;
    default:
      return 7.8e-3;
  }
}

// Fills the GPU caching allocator's free blocks with NaN: layer outputs allocated next reuse them.
inline void poison_gpu_cache() {
  for (std::int64_t n : {1 << 10, 1 << 14, 1 << 18, 1 << 22}) {
    std::vector<Tensor> blocks;
    for (int i = 0; i < 4; ++i) {
      blocks.push_back(Tensor::full({n}, NAN, DType::F32, kGpu));
      blocks.push_back(Tensor::full({n / 2 + 3}, NAN, DType::F16, kGpu));
    }
  }
  device_synchronize(kGpu);
}

}  // namespace kiln::testing
