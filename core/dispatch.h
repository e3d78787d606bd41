#pragma once
// Switches on a DType and runs a block with a type alias bound to its element type. The host
// (core/cpu/element.h) and the device (core/cuda/element.cuh) differ only in the types that store
// halves, so both build their macros from these, naming their own half and bfloat16 types.

#include "core/check.h"
#include "core/dtype.h"

#define KILN_DISPATCH_CASE_(value, T, type, ...) \
  case ::kiln::DType::value: {                   \
    using T = type;                              \
    __VA_ARGS__;                                 \
    break;                                       \
  }

#define KILN_DISPATCH_FLOATING_CASES_(T, half_type, bf16_type, ...) \
  KILN_DISPATCH_CASE_(F32, T, float, __VA_ARGS__)                   \
  KILN_DISPATCH_CASE_(F64, T, double, __VA_ARGS__)                  \
  KILN_DISPATCH_CASE_(F16, T, half_type, __VA_ARGS__)               \
  KILN_DISPATCH_CASE_(BF16, T, bf16_type, __VA_ARGS__)

// Runs `...` with T bound to the element type of `dtype` (floating types only).
#define KILN_DISPATCH_FLOATING_AS(dtype, T, half_type, bf16_type, ...)  \
  switch (dtype) {                                                      \
    KILN_DISPATCH_FLOATING_CASES_(T, half_type, bf16_type, __VA_ARGS__) \
    default:                                                            \
      KILN_CHECK(false, "expected a floating-point dtype");             \
  }

// Runs `...` with T bound to the element type of `dtype` (every dtype).
#define KILN_DISPATCH_ALL_AS(dtype, T, half_type, bf16_type, ...)       \
  switch (dtype) {                                                      \
    KILN_DISPATCH_FLOATING_CASES_(T, half_type, bf16_type, __VA_ARGS__) \
    KILN_DISPATCH_CASE_(I32, T, std::int32_t, __VA_ARGS__)              \
    KILN_DISPATCH_CASE_(I64, T, std::int64_t, __VA_ARGS__)              \
    KILN_DISPATCH_CASE_(U8, T, std::uint8_t, __VA_ARGS__)               \
  }
