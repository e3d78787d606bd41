// Embedding kernels: a gather forward; a deterministic backward that radix-sorts (id, position)
// pairs (stable, so equal ids keep position order), sums the rows of each id in pieces of at most
// kChunk rows, then gives each distinct id one block that adds its pieces in order into the
// gradient: no atomics, and a frequent id ([PAD], token type 0) is not one thread's long loop.

#include <cub/device/device_radix_sort.cuh>

#include <cmath>

#include "core/cuda/cuda_check.h"
#include "core/cuda/element.cuh"
#include "core/stream.h"
#include "layers/cuda/embedding_cuda.h"

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

// Rows of dy in sorted order are cut into pieces: a piece ends where the id changes or at a
// chunk boundary, so no thread adds more than kChunk rows. Each piece's column sums go to
// partial[piece start].
constexpr std::int64_t kChunk = 32;
constexpr int kColumns = 128;

template <typename T, typename P>
__global__ void embedding_piece_sums_kernel(const std::int64_t* __restrict__ sorted_ids,
                                            const std::int64_t* __restrict__ positions,
                                            const T* __restrict__ dy, std::int64_t n,
                                            std::int64_t dim, P* __restrict__ partial) {
  std::int64_t col = static_cast<std::int64_t>(blockIdx.y) * kColumns + threadIdx.x;
  if (col >= dim) return;
  std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * kChunk;
  std::int64_t last = min(first + kChunk, n);
  P sum = 0;
  std::int64_t piece = first;
  for (std::int64_t j = first; j < last; ++j) {
    if (j > first && sorted_ids[j] != sorted_ids[j - 1]) {
      partial[piece * dim + col] = sum;
      sum = 0;
      piece = j;
    }
    sum += static_cast<P>(load(dy[positions[j] * dim + col]));
  }
  partial[piece * dim + col] = sum;
}

// One block per distinct id (the block at its first sorted position): adds its pieces in order,
// then adds the total into the gradient once.
template <typename P, typename G>
__global__ void embedding_segment_sums_kernel(const std::int64_t* __restrict__ sorted_ids,
                                              const P* __restrict__ partial, std::int64_t n,
                                              std::int64_t num, std::int64_t dim,
                                              std::int64_t padding_idx, G* __restrict__ grad) {
  std::int64_t start = blockIdx.x;
  std::int64_t id = sorted_ids[start];
  if (start > 0 && sorted_ids[start - 1] == id) return;  // not the first of its id
  if (id == padding_idx || id < 0 || id >= num) return;
  std::int64_t end = start + 1;  // ids are sorted: skip ahead a chunk at a time, then singly
  while (end + kChunk <= n && sorted_ids[end + kChunk - 1] == id) end += kChunk;
  while (end < n && sorted_ids[end] == id) ++end;
  for (std::int64_t col = threadIdx.x; col < dim; col += blockDim.x) {
    P sum = partial[start * dim + col];
    for (std::int64_t p = (start / kChunk + 1) * kChunk; p < end; p += kChunk)
      sum += partial[p * dim + col];
    grad[id * dim + col] = store<G>(static_cast<P>(load(grad[id * dim + col])) + sum);
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
  // Partial sums in fp32 (f64 for f64 gradients).
  Tensor partial =
      Tensor::empty({n, dim}, dy.dtype() == DType::F64 ? DType::F64 : DType::F32, device);
  dim3 pieces(static_cast<unsigned>((n + kChunk - 1) / kChunk),
              static_cast<unsigned>((dim + kColumns - 1) / kColumns));
  KILN_CUDA_DISPATCH_FLOATING(dy.dtype(), T, {
    using P = typename Compute<T>::type;
    embedding_piece_sums_kernel<T, P><<<pieces, kColumns, 0, stream>>>(
        static_cast<const std::int64_t*>(sorted_ids.data()), values_out,
        static_cast<const T*>(dy.data()), n, dim, static_cast<P*>(partial.data()));
    KILN_CUDA_LAUNCH_CHECK();
    KILN_CUDA_DISPATCH_FLOATING(weight_grad.dtype(), G, {
      embedding_segment_sums_kernel<P, G><<<static_cast<unsigned>(n), kColumns, 0, stream>>>(
          static_cast<const std::int64_t*>(sorted_ids.data()),
          static_cast<const P*>(partial.data()), n, num, dim, padding_idx,
          static_cast<G*>(weight_grad.data()));
      KILN_CUDA_LAUNCH_CHECK();
    });
  });
}

}  // namespace kiln::cuda
