// FP8 projections' casts on CUDA (layers/cuda/fp8_projection_cuda.h): the tensor read once in
// 16-byte vectors, the rows layout and/or the transposed one (through a 64 x 64 shared-memory
// tile) written as 8-byte packs of FP8, the amax measured on the way; the block that finishes
// last records it into the state (core/fp8.h's rule), so no launch of its own and no host read is
// needed.

#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>

#include "core/cuda/cuda_check.h"
#include "core/cuda/element.cuh"
#include "core/stream.h"
#include "layers/cuda/fp8_projection_cuda.h"

namespace kiln::cuda {
namespace {

constexpr int kVector = 8;  // elements per load and per FP8 pack
constexpr int kTile = 64;   // the transposing kernel's tile (kTile x kTile)
constexpr int kThreads = 256;
constexpr unsigned kMaxBlocks = 2048;  // a grid's blocks loop over the rest (fewer amax atomics)
enum class Pass { Measure, Record, Reuse };  // amax only; cast and record; cast at the last scale

template <typename T>
__device__ __forceinline__ void load8(const T* p, float (&v)[kVector]) {
#pragma unroll
  for (int i = 0; i < kVector; ++i) v[i] = static_cast<float>(load(p[i]));
}
template <>
__device__ __forceinline__ void load8(const __nv_bfloat16* p, float (&v)[kVector]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const auto* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < kVector / 2; ++i) {
    const float2 f = __bfloat1622float2(pairs[i]);
    v[2 * i] = f.x;
    v[2 * i + 1] = f.y;
  }
}
template <>
__device__ __forceinline__ void load8(const __half* p, float (&v)[kVector]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const auto* pairs = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
  for (int i = 0; i < kVector / 2; ++i) {
    const float2 f = __half22float2(pairs[i]);
    v[2 * i] = f.x;
    v[2 * i + 1] = f.y;
  }
}
template <>
__device__ __forceinline__ void load8(const float* p, float (&v)[kVector]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

__device__ __forceinline__ unsigned largest_bits(unsigned largest, const float (&v)[kVector]) {
#pragma unroll
  for (int i = 0; i < kVector; ++i) largest = max(largest, __float_as_uint(v[i]) & 0x7fffffffu);
  return largest;
}

// fp8(v * scale), element i in byte i (CUDA's saturating conversion, as the scalar one rounds).
__device__ __forceinline__ std::uint64_t pack8(const float (&v)[kVector], float scale,
                                               __nv_fp8_interpretation_t kind) {
  std::uint64_t out = 0;
#pragma unroll
  for (int i = 0; i < kVector / 2; ++i) {
    const __nv_fp8x2_storage_t two = __nv_cvt_float2_to_fp8x2(
        make_float2(v[2 * i] * scale, v[2 * i + 1] * scale), __NV_SATFINITE, kind);
    out |= static_cast<std::uint64_t>(two) << (16 * i);
  }
  return out;
}

__device__ __forceinline__ bool unrecorded(const float* slot) {
  const float* state = slot + kFp8RowState;
  return state[2] == 0.0f && state[kFp8StateHeader] == 0.0f;
}

// Folds the block's largest |x| bits into the slot's scratch (the float bits' integer order is
// the magnitudes', NaN above infinity); the block that finishes last then has every block's
// maximum and, for Measure, sets the next cast's scale from it, for Record, records it with the
// scale this cast used. Every thread of the block calls it.
__device__ void finish(float* slot, unsigned largest, Pass pass, float scale,
                       const Fp8ScalingOptions& options, Fp8Format format) {
  __shared__ bool last;
  __shared__ unsigned warps[kThreads / 32];
  auto* scratch = reinterpret_cast<unsigned*>(slot + kFp8RowScratch);
  largest = __reduce_max_sync(0xffffffffu, largest);
  if ((threadIdx.x & 31u) == 0) warps[threadIdx.x / 32] = largest;
  __syncthreads();
  if (threadIdx.x == 0) {  // one atomic per block: same-address atomics serialise in L2
    for (int w = 1; w < kThreads / 32; ++w) largest = max(largest, warps[w]);
    atomicMax(scratch, largest);
    __threadfence();
    last = atomicAdd(scratch + 1, 1u) == gridDim.x * gridDim.y - 1;
  }
  __syncthreads();
  if (!last || threadIdx.x != 0) return;
  __threadfence();
  const float amax = __uint_as_float(*reinterpret_cast<volatile unsigned*>(scratch));
  scratch[0] = 0;
  scratch[1] = 0;
  float* state = slot + kFp8RowState;
  if (pass == Pass::Measure) {
    state[0] = fp8_scale_for(amax, format, options.margin, state[0]);
    return;
  }
  slot[kFp8RowScale] = scale;
  slot[kFp8RowInverse] = 1.0f / scale;
  fp8_scaling_record(state, options, format, amax);
}

__device__ __forceinline__ float scale_of(const float* slot, Pass pass) {
  return pass == Pass::Reuse ? slot[kFp8RowScale] : slot[kFp8RowState];
}

// x as n / 8 vectors -> out (the rows layout; null for Measure).
template <typename T>
__global__ void fp8_rows_kernel(const T* x, std::int64_t vectors, std::uint8_t* out, float* slot,
                                Fp8ScalingOptions options, Fp8Format format, Pass pass,
                                bool only_unrecorded) {
  if (only_unrecorded && !unrecorded(slot)) return;  // the same answer in every block
  const float scale = scale_of(slot, pass);
  const __nv_fp8_interpretation_t kind = format == Fp8Format::E4M3 ? __NV_E4M3 : __NV_E5M2;
  unsigned largest = 0;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       i < vectors; i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    float v[kVector];
    load8(x + i * kVector, v);
    largest = largest_bits(largest, v);
    if (out) reinterpret_cast<std::uint64_t*>(out)[i] = pack8(v, scale, kind);
  }
  if (pass != Pass::Reuse) finish(slot, largest, pass, scale, options, format);
}

// x (rows, cols) -> out_t (cols, rows), and out_rows (rows, cols) unless null, by 64 x 64 tiles.
template <typename T>
__global__ void fp8_transpose_kernel(const T* x, std::int64_t rows, std::int64_t cols,
                                     std::uint8_t* out_rows, std::uint8_t* out_t, float* slot,
                                     Fp8ScalingOptions options, Fp8Format format, Pass pass) {
  __shared__ float tile[kTile][kTile + 1];
  const float scale = scale_of(slot, pass);
  const __nv_fp8_interpretation_t kind = format == Fp8Format::E4M3 ? __NV_E4M3 : __NV_E5M2;
  constexpr int kChunks = kTile * kTile / kVector;  // 8-element runs per tile
  unsigned largest = 0;
  const std::int64_t c0 = static_cast<std::int64_t>(blockIdx.x) * kTile;
  for (std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * kTile; r0 < rows;
       r0 += static_cast<std::int64_t>(gridDim.y) * kTile) {
    for (int q = threadIdx.x; q < kChunks; q += kThreads) {  // runs along a row of x
      const int lr = q / (kTile / kVector), lc = (q % (kTile / kVector)) * kVector;
      const std::int64_t r = r0 + lr, c = c0 + lc;
      float v[kVector] = {};
      if (r < rows && c < cols) {
        load8(x + r * cols + c, v);
        largest = largest_bits(largest, v);
        if (out_rows)
          *reinterpret_cast<std::uint64_t*>(out_rows + r * cols + c) = pack8(v, scale, kind);
      }
#pragma unroll
      for (int i = 0; i < kVector; ++i) tile[lr][lc + i] = v[i];
    }
    __syncthreads();
    for (int q = threadIdx.x; q < kChunks; q += kThreads) {  // runs along a row of x^T
      const int lc = q / (kTile / kVector), lr = (q % (kTile / kVector)) * kVector;
      const std::int64_t c = c0 + lc, r = r0 + lr;
      if (c < cols && r < rows) {
        float v[kVector];
#pragma unroll
        for (int i = 0; i < kVector; ++i) v[i] = tile[lr + i][lc];
        *reinterpret_cast<std::uint64_t*>(out_t + c * rows + r) = pack8(v, scale, kind);
      }
    }
    __syncthreads();
  }
  if (pass != Pass::Reuse) finish(slot, largest, pass, scale, options, format);
}

void check_vectors(const Tensor& x) {
  KILN_CHECK(x.dim() == 2 && x.is_contiguous() && x.size(0) % kVector == 0 &&
                 x.size(1) % kVector == 0 && aligned16({x.data()}),
             "FP8 cast: expected a contiguous, 16-byte aligned (R, C) tensor with R and C "
             "multiples of 8, got " +
                 x.str());
}

__global__ void scales_from_history_kernel(float* rows, int count, int row_length,
                                           Fp8ScalingOptions options, Fp8Format gradient_format) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= count) return;
  const Fp8Format format = i % 3 == 2 ? gradient_format : Fp8Format::E4M3;
  fp8_scale_from_history(rows + static_cast<std::int64_t>(i) * row_length + kFp8RowState, options,
                         format);
}

}  // namespace

void fp8_projection_scales_from_history(Tensor& rows, const Fp8ScalingOptions& options,
                                        Fp8Format gradient_format) {
  KILN_CHECK(rows.dim() == 2 && rows.dtype() == DType::F32 && rows.is_contiguous() &&
                 rows.size(0) % 3 == 0,
             "FP8 scales from history: expected (3 x projections, row) f32, got " + rows.str());
  const int count = static_cast<int>(rows.size(0));
  if (count == 0) return;
  auto stream = static_cast<cudaStream_t>(current_stream(rows.device()));
  scales_from_history_kernel<<<(count + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
      rows.data<float>(), count, static_cast<int>(rows.size(1)), options, gradient_format);
  KILN_CUDA_LAUNCH_CHECK();
}

void fp8_projection_amax(const Tensor& x, float* slot, const Fp8ScalingOptions& options,
                         Fp8Format format, bool only_unrecorded) {
  check_vectors(x);
  const std::int64_t vectors = x.numel() / kVector;
  auto stream = static_cast<cudaStream_t>(current_stream(x.device()));
  KILN_CUDA_DISPATCH_FLOATING(x.dtype(), T, {
    fp8_rows_kernel<T><<<grid_for(vectors, kThreads, kMaxBlocks), kThreads, 0, stream>>>(
        static_cast<const T*>(x.data()), vectors, nullptr, slot, options, format, Pass::Measure,
        only_unrecorded);
    KILN_CUDA_LAUNCH_CHECK();
  });
}

void fp8_projection_cast(const Tensor& x, float* slot, const Fp8ScalingOptions& options,
                         Fp8Format format, bool record, Tensor* rows, Tensor* transposed) {
  check_vectors(x);
  const std::int64_t r = x.size(0), c = x.size(1);
  if (r == 0 || c == 0) return;
  const Pass pass = record ? Pass::Record : Pass::Reuse;
  auto stream = static_cast<cudaStream_t>(current_stream(x.device()));
  auto bytes = [](Tensor* t) { return t ? static_cast<std::uint8_t*>(t->data()) : nullptr; };
  KILN_CUDA_DISPATCH_FLOATING(x.dtype(), T, {
    if (transposed == nullptr) {
      const std::int64_t vectors = x.numel() / kVector;
      fp8_rows_kernel<T><<<grid_for(vectors, kThreads, kMaxBlocks), kThreads, 0, stream>>>(
          static_cast<const T*>(x.data()), vectors, bytes(rows), slot, options, format, pass,
          false);
      KILN_CUDA_LAUNCH_CHECK();
    } else {
      const unsigned col_tiles = static_cast<unsigned>((c + kTile - 1) / kTile);
      const std::int64_t row_tiles = (r + kTile - 1) / kTile;
      const dim3 grid(col_tiles,
                      static_cast<unsigned>(std::max<std::int64_t>(
                          1, std::min<std::int64_t>(row_tiles, kMaxBlocks / col_tiles))));
      fp8_transpose_kernel<T><<<grid, kThreads, 0, stream>>>(static_cast<const T*>(x.data()), r, c,
                                                             bytes(rows), bytes(transposed), slot,
                                                             options, format, pass);
      KILN_CUDA_LAUNCH_CHECK();
    }
  });
}

}  // namespace kiln::cuda
