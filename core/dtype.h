#pragma once
// Element types and the host-side half-precision conversions (round to nearest even).

#include <cstdint>
#include <cstring>
#include <string>

namespace kiln {

enum class DType : std::uint8_t { F32, F64, F16, BF16, I32, I64, U8 };

std::size_t dtype_size(DType t);
const char* dtype_name(DType t);                 // "f32", "f16", ...
DType dtype_from_name(const std::string& name);  // throws InputError listing the known names
inline bool is_floating(DType t) {
  return t == DType::F32 || t == DType::F64 || t == DType::F16 || t == DType::BF16;
}
inline bool is_half(DType t) {
  return t == DType::F16 || t == DType::BF16;
}

// The type arithmetic on an element of type T runs in, on the host and on the device alike (one
// definition, so the CPU reference and the CUDA kernels round the same): float, but double for
// f64 and i64, whose values a float would not hold.
template <typename T>
struct Compute {
  using type = float;
};
template <>
struct Compute<double> {
  using type = double;
};
template <>
struct Compute<std::int64_t> {
  using type = double;
};

// IEEE binary16 and bfloat16 stored as their bit patterns on the host.
struct Half {
  std::uint16_t bits;
};
struct BFloat16 {
  std::uint16_t bits;
};

inline std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::uint16_t float_to_half_bits(float f);  // round to nearest even, overflow to inf
float half_bits_to_float(std::uint16_t h);

inline std::uint16_t float_to_bf16_bits(float f) {
  std::uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
inline float bf16_bits_to_float(std::uint16_t b) {
  return bits_float(static_cast<std::uint32_t>(b) << 16);
}

inline Half to_half(float f) {
  return Half{float_to_half_bits(f)};
}
inline BFloat16 to_bf16(float f) {
  return BFloat16{float_to_bf16_bits(f)};
}
inline float to_float(Half h) {
  return half_bits_to_float(h.bits);
}
inline float to_float(BFloat16 b) {
  return bf16_bits_to_float(b.bits);
}

// Compile-time mapping from C++ type to DType.
template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::F32;
};
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::F64;
};
template <>
struct DTypeOf<Half> {
  static constexpr DType value = DType::F16;
};
template <>
struct DTypeOf<BFloat16> {
  static constexpr DType value = DType::BF16;
};
template <>
struct DTypeOf<std::int32_t> {
  static constexpr DType value = DType::I32;
};
template <>
struct DTypeOf<std::int64_t> {
  static constexpr DType value = DType::I64;
};
template <>
struct DTypeOf<std::uint8_t> {
  static constexpr DType value = DType::U8;
};

}  // namespace kiln
