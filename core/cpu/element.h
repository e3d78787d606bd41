#pragma once
// Host-side element access: every floating type computes in float, f64 in double (Compute,
// core/dtype.h).

#include <cstdint>

#include "core/check.h"
#include "core/dispatch.h"
#include "core/dtype.h"

namespace kiln::cpu {

using ::kiln::Compute;  // core/dtype.h; callers name it cpu::Compute beside cpu::load

inline float load(float v) {
  return v;
}
inline double load(double v) {
  return v;
}
inline float load(Half v) {
  return to_float(v);
}
inline float load(BFloat16 v) {
  return to_float(v);
}
inline double load(std::int32_t v) {
  return v;
}
inline double load(std::int64_t v) {
  return static_cast<double>(v);
}
inline double load(std::uint8_t v) {
  return v;
}

template <typename T>
inline T store(double v);
template <>
inline float store<float>(double v) {
  return static_cast<float>(v);
}
template <>
inline double store<double>(double v) {
  return v;
}
template <>
inline Half store<Half>(double v) {
  return to_half(static_cast<float>(v));
}
template <>
inline BFloat16 store<BFloat16>(double v) {
  return to_bf16(static_cast<float>(v));
}
template <>
inline std::int32_t store<std::int32_t>(double v) {
  return static_cast<std::int32_t>(v);
}
template <>
inline std::int64_t store<std::int64_t>(double v) {
  return static_cast<std::int64_t>(v);
}
template <>
inline std::uint8_t store<std::uint8_t>(double v) {
  return static_cast<std::uint8_t>(v);
}

// Storing a float into a float must not go through double rounding twice for halves: a float
// value converts to half exactly as to_half(float) would.
template <typename T>
inline T store_float(float v) {
  return store<T>(v);
}

}  // namespace kiln::cpu

// Runs `...` with T bound to the C++ type of `dtype` (floating types only; every dtype).
#define KILN_DISPATCH_FLOATING(dtype, T, ...) \
  KILN_DISPATCH_FLOATING_AS(dtype, T, ::kiln::Half, ::kiln::BFloat16, __VA_ARGS__)
#define KILN_DISPATCH_ALL(dtype, T, ...) \
  KILN_DISPATCH_ALL_AS(dtype, T, ::kiln::Half, ::kiln::BFloat16, __VA_ARGS__)
