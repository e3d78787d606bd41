#pragma once
// Philox4x32-10 (Salmon et al., SC'11), usable on host and device, and the transforms from its
// 32-bit outputs to uniform and normal numbers. The transforms compute in double, so the CPU and
// the GPU round to the same float.

#include <cmath>
#include <cstdint>
#include <cstring>

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

// MurmurHash3's 32-bit finalizer: full avalanche in a few integer operations, for random bits
// where Philox's ten rounds cost more than the work they serve (stochastic rounding).
KILN_HOST_DEVICE_INLINE std::uint32_t mix32(std::uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

// The float a bfloat16 bit pattern holds (host and device).
KILN_HOST_DEVICE_INLINE float bf16_bits_widen(std::uint16_t bits) {
  const std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

// The bfloat16 bits of x rounded stochastically: the 16 bits dropped are compared with 16
// random ones, so x rounds away from zero with probability equal to its distance from the value
// below it in magnitude and E[round(x)] = x (the bias-free rounding llm.c and llm.q use for
// bf16 optimizer state). Inf and NaN stay inf and NaN.
KILN_HOST_DEVICE_INLINE std::uint16_t bf16_bits_stochastic(float x, std::uint32_t random) {
#ifdef __CUDA_ARCH__
  std::uint32_t u = __float_as_uint(x);
#else
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
#endif
  if ((u & 0x7f800000u) == 0x7f800000u) {
    return static_cast<std::uint16_t>((u >> 16) | ((u & 0x007fffffu) != 0 ? 0x40u : 0u));
  }
  return static_cast<std::uint16_t>((u + (random & 0xffffu)) >> 16);
}

}  // namespace kiln
