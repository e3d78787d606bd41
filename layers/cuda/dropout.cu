// Dropout kernel: each thread regenerates the Philox mask for its elements (nothing stored).

#include "core/cuda/cuda_check.h"
#include "core/cuda/element.cuh"
#include "core/stream.h"
#include "layers/cuda/dropout_cuda.h"

namespace kiln::cuda {
namespace {

template <typename TI, typename TO>
__global__ void dropout_kernel(const TI* in, TO* out, std::int64_t n, std::uint64_t key,
                               std::uint64_t step_value, const std::uint64_t* step_source, double p,
                               double scale) {
  using C = typename Compute<TI>::type;
  const std::uint64_t step = step_source != nullptr ? *step_source : step_value;
  C s = static_cast<C>(scale);
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    bool keep = dropout_keep(key, step, static_cast<std::uint64_t>(i), p);
    out[i] = store<TO>(keep ? static_cast<C>(load(in[i])) * s : C(0));
  }
}

}  // namespace

void dropout_apply(const Tensor& in, Tensor& out, std::uint64_t key, std::uint64_t step,
                   const std::uint64_t* step_source, double p, double scale) {
  std::int64_t n = in.numel();
  if (n == 0) return;
  auto stream = static_cast<cudaStream_t>(current_stream(in.device()));
  KILN_CUDA_DISPATCH_FLOATING(in.dtype(), TI, {
    KILN_CUDA_DISPATCH_FLOATING(out.dtype(), TO, {
      dropout_kernel<TI, TO><<<grid_for(n), 256, 0, stream>>>(static_cast<const TI*>(in.data()),
                                                              static_cast<TO*>(out.data()), n, key,
                                                              step, step_source, p, scale);
      KILN_CUDA_LAUNCH_CHECK();
    });
  });
}

}  // namespace kiln::cuda
