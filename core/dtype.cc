#include "core/dtype.h"

#include "core/check.h"
#include "core/enum_names.h"

namespace kiln {

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32:
      return 4;
    case DType::F64:
      return 8;
    case DType::F16:
      return 2;
    case DType::BF16:
      return 2;
    case DType::I32:
      return 4;
    case DType::I64:
      return 8;
    case DType::U8:
      return 1;
  }
  return 0;
}

namespace {
constexpr EnumName<DType> kDTypeNames[] = {
    {DType::F32, "f32"}, {DType::F64, "f64"}, {DType::F16, "f16"}, {DType::BF16, "bf16"},
    {DType::I32, "i32"}, {DType::I64, "i64"}, {DType::U8, "u8"}};
}  // namespace

const char* dtype_name(DType t) {
  return enum_name(kDTypeNames, t);
}

DType dtype_from_name(const std::string& name) {
  return parse_enum(kDTypeNames, name, "dtype");
}

std::uint16_t float_to_half_bits(float f) {
  std::uint32_t x = float_bits(f);
  std::uint32_t sign = (x >> 16) & 0x8000u;
  std::uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {
    // Subnormal half (or zero): scale so the integer part is the half mantissa, round to even.
    if (abs < 0x33000000u) return static_cast<std::uint16_t>(sign);  // below half of min subnormal
    std::uint32_t exponent = abs >> 23;
    std::uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    std::uint32_t shift = 126 - exponent;  // value = mantissa * 2^(exponent - 150); unit 2^-24
    std::uint32_t rounded = mantissa >> shift;
    std::uint32_t remainder = mantissa & ((1u << shift) - 1u);
    std::uint32_t halfway = 1u << (shift - 1);
    if (remainder > halfway || (remainder == halfway && (rounded & 1u))) ++rounded;
    return static_cast<std::uint16_t>(sign | rounded);
  }
  // Normal: rebias the exponent, round the 13 dropped mantissa bits to nearest even.
  std::uint32_t h = abs - 0x38000000u;  // exponent bias 127 -> 15, still in float layout
  std::uint32_t rounded = h >> 13;
  std::uint32_t remainder = h & 0x1fffu;
  if (remainder > 0x1000u || (remainder == 0x1000u && (rounded & 1u))) ++rounded;
  return static_cast<std::uint16_t>(sign | rounded);
}

float half_bits_to_float(std::uint16_t h) {
  std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exponent = (h >> 10) & 0x1fu;
  std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    if (mantissa == 0) return bits_float(sign);
    // Subnormal: value = mantissa * 2^-24.
    float v = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  if (exponent == 31) return bits_float(sign | 0x7f800000u | (mantissa << 13));
  return bits_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

}  // namespace kiln
