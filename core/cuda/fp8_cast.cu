// The FP8 cast on CUDA (core/fp8_cast.h): one pass that scales, converts with CUDA's own
// saturating conversion and measures the absolute maximum (a warp maximum, then one atomic per
// warp on the float's bits, whose integer order is the magnitudes').

#include <cuda_fp8.h>

#include "core/cuda/cuda_check.h"
#include "core/cuda/element.cuh"
#include "core/cuda/fp8_cast_cuda.h"
#include "core/stream.h"

namespace kiln::cuda {
namespace {

template <typename T>
__global__ void fp8_cast_kernel(const T* x, std::int64_t n, float scale,
                                __nv_fp8_interpretation_t kind, std::uint8_t* out,
                                unsigned* amax_bits) {
  unsigned largest = 0;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float v = static_cast<float>(load(x[i]));
    largest = max(largest, __float_as_uint(v) & 0x7fffffffu);
    out[i] = __nv_cvt_float_to_fp8(v * scale, __NV_SATFINITE, kind);
  }
  largest = __reduce_max_sync(0xffffffffu, largest);
  if ((threadIdx.x & 31) == 0) atomicMax(amax_bits, largest);
}

}  // namespace

void fp8_cast(const Tensor& x, float scale, Fp8Format format, Tensor& out, Tensor& amax) {
  auto stream = static_cast<cudaStream_t>(current_stream(x.device()));
  KILN_CUDA_CHECK(cudaMemsetAsync(amax.data(), 0, sizeof(float), stream));
  const std::int64_t n = x.numel();
  if (n == 0) return;
  const __nv_fp8_interpretation_t kind = format == Fp8Format::E4M3 ? __NV_E4M3 : __NV_E5M2;
  KILN_CUDA_DISPATCH_FLOATING(x.dtype(), T, {
    fp8_cast_kernel<T><<<grid_for(n, 256, 4096), 256, 0, stream>>>(
        static_cast<const T*>(x.data()), n, scale, kind, static_cast<std::uint8_t*>(out.data()),
        static_cast<unsigned*>(amax.data()));
    KILN_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace kiln::cuda
