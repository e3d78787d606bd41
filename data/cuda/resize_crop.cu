// The batch's crop, resize, mirror, normalise and padded shift in one kernel (data/cuda/
// resize_crop_cuda.h). A block is a 32 x 8 tile of one sample's output: its 32 column taps and
// 8 row taps are computed once into shared memory, then each thread blends its pixel's three
// channels. Taps in double and the blend in float use explicitly rounded operations (__dadd_rn,
// __fmul_rn, ...): nvcc contracts a * b + c into an FMA by default, the CPU build does not, and
// one FMA changes the last bit. The order of operations is resize_crop_hwc's, so equal pixels
// give the CPU's output bit for bit.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/cuda/cuda_check.h"
#include "data/cuda/resize_crop_cuda.h"

namespace kiln::data {
namespace {

constexpr int kTileWidth = 32;  // one warp across a row: the stores of a channel coalesce
constexpr int kTileHeight = 8;

struct Tap {
  int i0, i1;  // i0 < 0: the shift moved this row or column outside the image (fill)
  float w1;
};

// The CPU's `taps` lambda for output index i of `out`: half-pixel centres, clamped to the image.
__device__ Tap resize_tap(int i, int out, int start, int extent, int limit) {
  const double step = __ddiv_rn(static_cast<double>(extent), static_cast<double>(out));
  // start + (i + 0.5) * step - 0.5, rounded after each operation as on the CPU.
  double s = __dsub_rn(__dadd_rn(static_cast<double>(start),
                                 __dmul_rn(__dadd_rn(static_cast<double>(i), 0.5), step)),
                       0.5);
  const double high = static_cast<double>(limit - 1);
  s = s < 0.0 ? 0.0 : (high < s ? high : s);  // std::clamp(s, 0.0, high)
  const int i0 = static_cast<int>(s);
  return Tap{i0, min(i0 + 1, limit - 1), __double2float_rn(__dsub_rn(s, static_cast<double>(i0)))};
}

// a + (b - a) * w on uint8 pixels: the difference in int, converted for the product, as on the CPU.
__device__ float blend_pixels(int a, int b, float w) {
  return __fadd_rn(static_cast<float>(a), __fmul_rn(static_cast<float>(b - a), w));
}

// grid (ceil(out_width / 32), ceil(out_height / 8), count), block (32, 8).
__global__ void resize_crop_kernel(const std::uint8_t* __restrict__ pixels,
                                   const ResizeCropSample* __restrict__ samples, ResizeCropParams p,
                                   float* __restrict__ dst) {
  __shared__ Tap column_taps[kTileWidth];
  __shared__ Tap row_taps[kTileHeight];
  const ResizeCropSample s = samples[blockIdx.z];
  const int x = blockIdx.x * kTileWidth + threadIdx.x;
  const int y = blockIdx.y * kTileHeight + threadIdx.y;
  // shift_image_chw: output (x, y) is the resized image's (x + shift_x, y + shift_y); flip
  // reverses the resized image's column taps.
  if (threadIdx.y == 0) {
    const int sx = x + s.shift_x;
    Tap t{-1, -1, 0.0f};
    if (x < p.out_width && sx >= 0 && sx < p.out_width) {
      t = resize_tap(s.flip ? p.out_width - 1 - sx : sx, p.out_width, s.box.x, s.box.width,
                     s.width);
    }
    column_taps[threadIdx.x] = t;
  } else if (threadIdx.y == 1 && threadIdx.x < kTileHeight) {
    const int row = blockIdx.y * kTileHeight + threadIdx.x;
    const int sy = row + s.shift_y;
    Tap t{-1, -1, 0.0f};
    if (row < p.out_height && sy >= 0 && sy < p.out_height) {
      t = resize_tap(sy, p.out_height, s.box.y, s.box.height, s.height);
    }
    row_taps[threadIdx.x] = t;
  }
  __syncthreads();
  if (x >= p.out_width || y >= p.out_height) return;

  const std::size_t plane = static_cast<std::size_t>(p.out_width) * p.out_height;
  float* out = dst + static_cast<std::size_t>(blockIdx.z) * 3 * plane +
               static_cast<std::size_t>(y) * p.out_width + x;
  const Tap tx = column_taps[threadIdx.x];
  const Tap ty = row_taps[threadIdx.y];
  if (tx.i0 < 0 || ty.i0 < 0) {
    for (int c = 0; c < 3; ++c) out[c * plane] = p.fill[c];
    return;
  }
  const std::size_t row_bytes = static_cast<std::size_t>(s.width) * 3;
  const std::uint8_t* r0 = pixels + s.offset + ty.i0 * row_bytes;
  const std::uint8_t* r1 = pixels + s.offset + ty.i1 * row_bytes;
  const std::uint8_t* a = r0 + tx.i0 * 3;
  const std::uint8_t* b = r0 + tx.i1 * 3;
  const std::uint8_t* c0 = r1 + tx.i0 * 3;
  const std::uint8_t* d = r1 + tx.i1 * 3;
  constexpr float kScale = 1.0f / 255.0f;
  for (int c = 0; c < 3; ++c) {
    const float top = blend_pixels(a[c], b[c], tx.w1);
    const float bottom = blend_pixels(c0[c], d[c], tx.w1);
    const float value = __fmul_rn(__fadd_rn(top, __fmul_rn(__fsub_rn(bottom, top), ty.w1)), kScale);
    out[c * plane] = __fmul_rn(__fsub_rn(value, p.mean[c]), p.inv_std[c]);
  }
}

}  // namespace

void resize_crop_batch_cuda(const std::uint8_t* pixels, const ResizeCropSample* samples, int count,
                            const ResizeCropParams& params, float* dst, void* stream) {
  if (count <= 0 || params.out_width <= 0 || params.out_height <= 0) return;
  KILN_CHECK(count <= 65535, "resize_crop_batch_cuda: " + std::to_string(count) +
                                 " samples in one launch; the grid's z holds at most 65535");
  const dim3 block(kTileWidth, kTileHeight);
  const dim3 grid((params.out_width + kTileWidth - 1) / kTileWidth,
                  (params.out_height + kTileHeight - 1) / kTileHeight, count);
  resize_crop_kernel<<<grid, block, 0, static_cast<cudaStream_t>(stream)>>>(pixels, samples, params,
                                                                            dst);
  KILN_CUDA_LAUNCH_CHECK();
}

}  // namespace kiln::data
