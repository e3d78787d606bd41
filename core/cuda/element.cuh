#pragma once
// Device-side element access: floating types compute in float, f64 in double (Compute,
// core/dtype.h); half storage rounds to nearest even on store.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <initializer_list>

#include "core/dispatch.h"
#include "core/dtype.h"

namespace kiln::cuda {

// Device storage types for each DType.
template <DType D>
struct Storage;
template <>
struct Storage<DType::F32> {
  using type = float;
};
template <>
struct Storage<DType::F64> {
  using type = double;
};
template <>
struct Storage<DType::F16> {
  using type = __half;
};
template <>
struct Storage<DType::BF16> {
  using type = __nv_bfloat16;
};
template <>
struct Storage<DType::I32> {
  using type = std::int32_t;
};
template <>
struct Storage<DType::I64> {
  using type = std::int64_t;
};
template <>
struct Storage<DType::U8> {
  using type = std::uint8_t;
};

__device__ __forceinline__ float load(float v) {
  return v;
}
__device__ __forceinline__ double load(double v) {
  return v;
}
__device__ __forceinline__ float load(__half v) {
  return __half2float(v);
}
__device__ __forceinline__ float load(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
__device__ __forceinline__ float load(std::int32_t v) {
  return static_cast<float>(v);
}
__device__ __forceinline__ double load(std::int64_t v) {
  return static_cast<double>(v);
}
__device__ __forceinline__ float load(std::uint8_t v) {
  return static_cast<float>(v);
}

template <typename T>
__device__ __forceinline__ T store(float v);
template <typename T>
__device__ __forceinline__ T store(double v);

template <>
__device__ __forceinline__ float store<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float store<float>(double v) {
  return static_cast<float>(v);
}
template <>
__device__ __forceinline__ double store<double>(float v) {
  return v;
}
template <>
__device__ __forceinline__ double store<double>(double v) {
  return v;
}
template <>
__device__ __forceinline__ __half store<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __half store<__half>(double v) {
  return __double2half(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 store<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 store<__nv_bfloat16>(double v) {
  return __double2bfloat16(v);
}
template <>
__device__ __forceinline__ std::int32_t store<std::int32_t>(float v) {
  return static_cast<std::int32_t>(v);
}
template <>
__device__ __forceinline__ std::int32_t store<std::int32_t>(double v) {
  return static_cast<std::int32_t>(v);
}
template <>
__device__ __forceinline__ std::int64_t store<std::int64_t>(float v) {
  return static_cast<std::int64_t>(v);
}
template <>
__device__ __forceinline__ std::int64_t store<std::int64_t>(double v) {
  return static_cast<std::int64_t>(v);
}
template <>
__device__ __forceinline__ std::uint8_t store<std::uint8_t>(float v) {
  return static_cast<std::uint8_t>(v);
}
template <>
__device__ __forceinline__ std::uint8_t store<std::uint8_t>(double v) {
  return static_cast<std::uint8_t>(v);
}

// 16 bytes of T (8 halves, 4 floats, 2 doubles): one vector load or store. Memory-bound
// kernels move a Pack per thread and step, which keeps every access a full 16-byte transaction.
template <typename T>
struct alignas(16) Pack {
  static constexpr int kSize = 16 / static_cast<int>(sizeof(T));
  T v[kSize];
};

// Whether every pointer is 16-byte aligned (the condition for Pack access).
inline bool aligned16(std::initializer_list<const void*> pointers) {
  for (const void* p : pointers) {
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

inline unsigned grid_for(std::int64_t n, unsigned block = 256, unsigned max_blocks = 65535u * 8) {
  std::int64_t blocks = (n + block - 1) / block;
  if (blocks < 1) blocks = 1;
  return static_cast<unsigned>(blocks > max_blocks ? max_blocks : blocks);
}

}  // namespace kiln::cuda

// Runs `...` with T bound to the device storage type of `dtype` (floating types only; every
// dtype).
#define KILN_CUDA_DISPATCH_FLOATING(dtype, T, ...) \
  KILN_DISPATCH_FLOATING_AS(dtype, T, __half, __nv_bfloat16, __VA_ARGS__)
#define KILN_CUDA_DISPATCH_ALL(dtype, T, ...) \
  KILN_DISPATCH_ALL_AS(dtype, T, __half, __nv_bfloat16, __VA_ARGS__)
