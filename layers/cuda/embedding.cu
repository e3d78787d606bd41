// Embedding kernels: a gather forward; a deterministic backward that radix-sorts (id, position)
// pairs (stable, so equal ids keep position order) and gives each distinct id one block that adds
// its rows in that order, then adds the sum into the gradient once: no atomics.

#include <cub/device/device_radix_sort.cuh>

#include <cmath>

#include "core/cuda/cuda_check.h"
#include "core/cuda/element.cuh"
#include "core/stream.h"
#include "layers/embedding.h"

namespace kiln::cuda {
namespace {

template <typename W, typename T>
__global__ void embedding_forward_kernel(const std::int64_t* __restrict__ ids,
                                         const W* __restrict__ weight, std::int64_t n,
                                         std::int64_t num, std::int64_t dim, T* __restrict__ y) {
  std::int64_t total = n * dim;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t row = i / dim, col = i % dim;
    std::int64_t id = ids[row];
    y[i] = (id >= 0 && id < num) ? store<T>(load(weight[id * dim + col])) : store<T>(NAN);
  }
}

template <typename T, typename G>
__global__ void embedding_backward_kernel(const std::int64_t* __restrict__ sorted_ids,
                                          const std::int64_t* __restrict__ positions,
                                          const T* __restrict__ dy, std::int64_t n,
                                          std::int64_t num, std::int64_t dim,
                                          std::int64_t padding_idx, G* __restrict__ grad) {
  std::int64_t start = blockIdx.x;
  std::int64_t id = sorted_ids[start];
  if (start > 0 && sorted_ids[start - 1] == id) return;  // not the first of its id
  if (id == padding_idx || id < 0 || id >= num) return;
  std::int64_t end = start + 1;
  while (end < n && sorted_ids[end] == id) ++end;
  using C = typename Compute<G>::type;
  for (std::int64_t col = threadIdx.x; col < dim; col += blockDim.x) {
    C sum = 0;
    for (std::int64_t j = start; j < end; ++j)
      sum += static_cast<C>(load(dy[positions[j] * dim + col]));
    grad[id * dim + col] = store<G>(static_cast<C>(load(grad[id * dim + col])) + sum);
  }
}

__global__ void iota_kernel(std::int64_t* out, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    out[i] = i;
}

}  // namespace

void embedding_forward(const Tensor& ids, const Tensor& weight, Tensor& y) {
  std::int64_t n = ids.numel(), dim = weight.size(1), num = weight.size(0);
  if (n == 0) return;
  cudaStream_t stream = static_cast<cudaStream_t>(current_stream(ids.device()));
  KILN_CUDA_DISPATCH_FLOATING(weight.dtype(), W, {
    KILN_CUDA_DISPATCH_FLOATING(y.dtype(), T, {
      embedding_forward_kernel<W, T><<<grid_for(n * dim), 256, 0, stream>>>(
          static_cast<const std::int64_t*>(ids.data()), static_cast<const W*>(weight.data()), n,
          num, dim, static_cast<T*>(y.data()));
      KILN_CUDA_LAUNCH_CHECK();
    });
  });
}

void embedding_backward(const Tensor& ids, const Tensor& dy, std::int64_t padding_idx,
                        Tensor& weight_grad) {
  std::int64_t n = ids.numel(), dim = weight_grad.size(1), num = weight_grad.size(0);
  if (n == 0) return;
  KILN_CHECK(n < (std::int64_t{1} << 31), "Embedding backward: too many ids for one sort");
  Device device = ids.device();
  cudaStream_t stream = static_cast<cudaStream_t>(current_stream(device));
  // Ids are sorted as unsigned 64-bit keys: negative (invalid) ids sort last and are skipped.
  Tensor positions = Tensor::empty({n}, DType::I64, device);
  Tensor sorted_ids = Tensor::empty({n}, DType::I64, device);
  Tensor sorted_positions = Tensor::empty({n}, DType::I64, device);
  iota_kernel<<<grid_for(n), 256, 0, stream>>>(static_cast<std::int64_t*>(positions.data()), n);
  KILN_CUDA_LAUNCH_CHECK();
  const auto* keys_in = static_cast<const unsigned long long*>(ids.data());
  auto* keys_out = static_cast<unsigned long long*>(sorted_ids.data());
  const auto* values_in = static_cast<const std::int64_t*>(positions.data());
  auto* values_out = static_cast<std::int64_t*>(sorted_positions.data());
  int items = static_cast<int>(n);
  // All 64 bits: sorting fewer would let an invalid id split a valid id's run in two, and two
  // blocks would then write the same row. The sort is small next to the GEMMs.
  int end_bit = 64;
  std::size_t temp_bytes = 0;
  KILN_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys_out, values_in,
                                                  values_out, items, 0, end_bit, stream));
  Tensor temp = Tensor::empty({static_cast<std::int64_t>(std::max<std::size_t>(temp_bytes, 1))},
                              DType::U8, device);
  KILN_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.data(), temp_bytes, keys_in, keys_out,
                                                  values_in, values_out, items, 0, end_bit,
                                                  stream));
  KILN_CUDA_DISPATCH_FLOATING(dy.dtype(), T, {
    KILN_CUDA_DISPATCH_FLOATING(weight_grad.dtype(), G, {
      embedding_backward_kernel<T, G><<<static_cast<unsigned>(n), 128, 0, stream>>>(
          static_cast<const std::int64_t*>(sorted_ids.data()), values_out,
          static_cast<const T*>(dy.data()), n, num, dim, padding_idx,
          static_cast<G*>(weight_grad.data()));
      KILN_CUDA_LAUNCH_CHECK();
    });
  });
}

}  // namespace kiln::cuda
