#pragma once
// Philox4x32-10 (Salmon et al., SC'11), usable on host and device, and the transforms from its
// 32-bit outputs to uniform and normal numbers. The transforms compute in double, so the CPU and
// the GPU round to the same float.

#include <cmath>
#include <cstdint>

#include "core/host_device.h"

namespace kiln {

struct Philox4x32 {
  std::uint32_t v[4];
};

KILN_HOST_DEVICE_INLINE std::uint32_t philox_mulhilo(std::uint32_t a, std::uint32_t b,
                                                     std::uint32_t* hi) {
  std::uint64_t p = static_cast<std::uint64_t>(a) * b;
  *hi = static_cast<std::uint32_t>(p >> 32);
  return static_cast<std::uint32_t>(p);
}

// Four 32-bit random words for `counter` under `key`.
KILN_HOST_DEVICE_INLINE Philox4x32 philox(std::uint64_t counter, std::uint64_t key,
                                          std::uint64_t stream = 0) {
  std::uint32_t c0 = static_cast<std::uint32_t>(counter),
                c1 = static_cast<std::uint32_t>(counter >> 32);
  std::uint32_t c2 = static_cast<std::uint32_t>(stream),
                c3 = static_cast<std::uint32_t>(stream >> 32);
  std::uint32_t k0 = static_cast<std::uint32_t>(key), k1 = static_cast<std::uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    std::uint32_t hi0, hi1;
    std::uint32_t lo0 = philox_mulhilo(0xD2511F53u, c0, &hi0);
    std::uint32_t lo1 = philox_mulhilo(0xCD9E8D57u, c2, &hi1);
    std::uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Philox4x32{{c0, c1, c2, c3}};
}

// Uniform in (0, 1): never 0, so log() is safe.
KILN_HOST_DEVICE_INLINE double philox_uniform(std::uint32_t word) {
  return (static_cast<double>(word) + 0.5) * (1.0 / 4294967296.0);
}

// The 32-bit word for element i of a stream keyed by (seed, offset).
KILN_HOST_DEVICE_INLINE std::uint32_t philox_word(std::uint64_t seed, std::uint64_t offset,
                                                  std::uint64_t i) {
  Philox4x32 r = philox(offset + i / 4, seed);
  return r.v[i % 4];
}

// A standard normal for element i (Box-Muller over pairs of words of one Philox block).
KILN_HOST_DEVICE_INLINE double philox_normal(std::uint64_t seed, std::uint64_t offset,
                                             std::uint64_t i) {
  Philox4x32 r = philox(offset + i / 4, seed);
  unsigned pair = static_cast<unsigned>((i % 4) / 2);
  double u1 = philox_uniform(r.v[2 * pair]);
  double u2 = philox_uniform(r.v[2 * pair + 1]);
  double radius = ::sqrt(-2.0 * ::log(u1));
  double angle = 6.283185307179586 * u2;
  return (i % 2 == 0) ? radius * ::cos(angle) : radius * ::sin(angle);
}

}  // namespace kiln
