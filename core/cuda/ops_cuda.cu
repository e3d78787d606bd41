// CUDA implementations of the core ops: grid-stride elementwise kernels, two-pass deterministic
// reductions, cuBLAS GEMM with fp32 accumulation, Philox random fills.

#include <math_constants.h>

#include <algorithm>
#include <cfloat>
#include <type_traits>

#include "core/backend.h"
#include "core/cuda/cublaslt_gemm.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/element.cuh"
#include "core/cuda/handles.h"
#include "core/random.h"
#include "core/stream.h"

namespace kiln::cuda {
namespace {

constexpr int kMaxDims = 8;

struct StridedLayout {
  int dims;
  std::int64_t shape[kMaxDims];
  std::int64_t src_stride[kMaxDims];
  std::int64_t dst_stride[kMaxDims];
};

cudaStream_t stream_of(const Tensor& t) {
  return static_cast<cudaStream_t>(current_stream(t.device()));
}

template <typename S, typename D>
__global__ void copy_contiguous_kernel(const S* src, D* dst, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = store<D>(load(src[i]));
  }
}

template <typename S, typename D>
__global__ void copy_strided_kernel(const S* src, D* dst, std::int64_t n, StridedLayout layout) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t rest = i, os = 0, od = 0;
    for (int d = layout.dims - 1; d >= 0; --d) {
      std::int64_t idx = rest % layout.shape[d];
      rest /= layout.shape[d];
      os += idx * layout.src_stride[d];
      od += idx * layout.dst_stride[d];
    }
    dst[od] = store<D>(load(src[os]));
  }
}

template <typename T>
__global__ void fill_kernel(T* x, std::int64_t n, T value) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    x[i] = value;
  }
}

enum class Binary { Add, Mul };

template <typename T>
__global__ void binary_kernel(const T* a, const T* b, T* out, std::int64_t n, Binary op) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    auto x = load(a[i]), y = load(b[i]);
    out[i] = store<T>(op == Binary::Add ? x + y : x * y);
  }
}

// The same with a Pack per thread and step (16-byte accesses), for aligned whole packs.
template <typename T>
__global__ void binary_packed_kernel(const Pack<T>* a, const Pack<T>* b, Pack<T>* out,
                                     std::int64_t packs, Binary op) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < packs;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    Pack<T> x = a[i], y = b[i], r;
#pragma unroll
    for (int k = 0; k < Pack<T>::kSize; ++k) {
      auto u = load(x.v[k]), v = load(y.v[k]);
      r.v[k] = store<T>(op == Binary::Add ? u + v : u * v);
    }
    out[i] = r;
  }
}

template <typename T>
__global__ void axpy_packed_kernel(typename Compute<T>::type alpha, const Pack<T>* x, Pack<T>* y,
                                   std::int64_t packs) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < packs;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    Pack<T> a = x[i], b = y[i];
#pragma unroll
    for (int k = 0; k < Pack<T>::kSize; ++k) b.v[k] = store<T>(load(b.v[k]) + alpha * load(a.v[k]));
    y[i] = b;
  }
}

template <typename T>
__global__ void axpy_kernel(typename Compute<T>::type alpha, const T* x, T* y, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    y[i] = store<T>(load(y[i]) + alpha * load(x[i]));
  }
}

template <typename T>
__global__ void scale_kernel(T* x, typename Compute<T>::type alpha, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    x[i] = store<T>(alpha * load(x[i]));
  }
}

__global__ void increment_kernel(std::int64_t* counter) {
  *counter += 1;
}

template <typename C>
__device__ __forceinline__ C combine(C a, C b, ops::Reduction r) {
  if (r == ops::Reduction::Max) return (b > a || b != b) ? b : a;
  return a + b;
}

template <typename C>
__device__ __forceinline__ C identity(ops::Reduction r) {
  return r == ops::Reduction::Max ? -CUDART_INF_F : C(0);
}

template <typename C>
__device__ C block_reduce(C v, ops::Reduction r) {
  __shared__ C shared[32];
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int o = 16; o > 0; o /= 2) v = combine(v, __shfl_down_sync(0xffffffffu, v, o), r);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  int warps = (blockDim.x + 31) / 32;
  v = threadIdx.x < warps ? shared[threadIdx.x] : identity<C>(r);
  if (warp == 0) {
    for (int o = 16; o > 0; o /= 2) v = combine(v, __shfl_down_sync(0xffffffffu, v, o), r);
  }
  __syncthreads();
  return v;
}

// One block per (row, chunk): partial[row * chunks + chunk] over columns of that chunk.
template <typename T, typename C>
__global__ void reduce_rows_kernel(const T* x, std::int64_t cols, std::int64_t chunk, int chunks,
                                   ops::Reduction r, C* partial) {
  std::int64_t row = blockIdx.x;
  std::int64_t begin = blockIdx.y * chunk;
  std::int64_t end = min(cols, begin + chunk);
  C acc = identity<C>(r);
  for (std::int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) {
    C v = static_cast<C>(load(x[row * cols + j]));
    acc = combine(acc, r == ops::Reduction::L2Norm ? v * v : v, r);
  }
  acc = block_reduce(acc, r);
  if (threadIdx.x == 0) partial[row * chunks + blockIdx.y] = acc;
}

template <typename C>
__global__ void finish_rows_kernel(const C* partial, int chunks, std::int64_t rows,
                                   std::int64_t count, ops::Reduction r, C* out) {
  std::int64_t row = blockIdx.x;
  if (row >= rows) return;
  C acc = identity<C>(r);
  for (int c = threadIdx.x; c < chunks; c += blockDim.x)
    acc = combine(acc, partial[row * chunks + c], r);
  acc = block_reduce(acc, r);
  if (threadIdx.x == 0) {
    if (r == ops::Reduction::Mean) acc = count > 0 ? acc / static_cast<C>(count) : C(0);
    if (r == ops::Reduction::L2Norm) acc = sqrt(acc);
    out[row] = acc;
  }
}

// Column reductions in a fixed order (deterministic): a block owns 32 columns; its 8 rows of
// threads each reduce a strided subset of the rows, then combine in a fixed order in shared
// memory. A second launch would only pay off for very tall, narrow inputs.
template <typename T, typename C>
__global__ void reduce_cols_kernel(const T* x, std::int64_t rows, std::int64_t cols,
                                   ops::Reduction r, C* out) {
  __shared__ C partial[8][33];
  std::int64_t col = blockIdx.x * 32 + threadIdx.x;
  C acc = identity<C>(r);
  if (col < cols) {
    for (std::int64_t i = threadIdx.y; i < rows; i += 8) {
      C v = static_cast<C>(load(x[i * cols + col]));
      acc = combine(acc, r == ops::Reduction::L2Norm ? v * v : v, r);
    }
  }
  partial[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    for (int k = 1; k < 8; ++k) acc = combine(acc, partial[k][threadIdx.x], r);
    if (r == ops::Reduction::Mean) acc = rows > 0 ? acc / static_cast<C>(rows) : C(0);
    if (r == ops::Reduction::L2Norm) acc = sqrt(acc);
    out[col] = acc;
  }
}

template <typename T>
__global__ void uniform_kernel(T* x, std::int64_t n, double low, double high, std::uint64_t seed,
                               std::uint64_t offset, bool wide) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    double u = philox_uniform(philox_word(seed, offset, static_cast<std::uint64_t>(i)));
    double v = low + (high - low) * u;
    x[i] = wide ? store<T>(v) : store<T>(static_cast<float>(v));
  }
}

template <typename T>
__global__ void normal_kernel(T* x, std::int64_t n, double mean, double stddev, std::uint64_t seed,
                              std::uint64_t offset, bool wide) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    double v = mean + stddev * philox_normal(seed, offset, static_cast<std::uint64_t>(i));
    x[i] = wide ? store<T>(v) : store<T>(static_cast<float>(v));
  }
}

// A fill value converted on the host, rounding halves exactly as the CPU backend does.
template <typename T>
T host_value(double value) {
  return static_cast<T>(value);
}
template <>
__half host_value<__half>(double value) {
  __half_raw raw;
  raw.x = to_half(static_cast<float>(value)).bits;
  return __half(raw);
}
template <>
__nv_bfloat16 host_value<__nv_bfloat16>(double value) {
  __nv_bfloat16_raw raw;
  raw.x = to_bf16(static_cast<float>(value)).bits;
  return __nv_bfloat16(raw);
}

std::int64_t leading_dim(const Tensor& t) {
  return t.size(-2) > 1 ? std::max(t.stride(-2), t.size(-1))
                        : std::max<std::int64_t>(t.size(-1), 1);
}

}  // namespace

void copy(const Tensor& src, Tensor& dst) {
  std::int64_t n = dst.numel();
  if (n == 0) return;
  cudaStream_t stream = stream_of(dst);
  if (src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous()) {
    if (src.data() != dst.data()) {
      // Default: either side may be pinned host memory the device addresses (optimizer state).
      KILN_CUDA_CHECK(
          cudaMemcpyAsync(dst.data(), src.data(), src.nbytes(), cudaMemcpyDefault, stream));
    }
    return;
  }
  bool contiguous = src.is_contiguous() && dst.is_contiguous();
  StridedLayout layout{};
  if (!contiguous) {
    KILN_CHECK(dst.dim() <= kMaxDims, "copy: more than 8 dimensions");
    layout.dims = static_cast<int>(dst.dim());
    for (int d = 0; d < layout.dims; ++d) {
      layout.shape[d] = dst.size(d);
      layout.src_stride[d] = src.stride(d);
      layout.dst_stride[d] = dst.stride(d);
    }
  }
  KILN_CUDA_DISPATCH_ALL(src.dtype(), S, KILN_CUDA_DISPATCH_ALL(dst.dtype(), D, {
                           const S* s = static_cast<const S*>(src.data());
                           D* d = static_cast<D*>(dst.data());
                           if (contiguous) {
                             copy_contiguous_kernel<S, D><<<grid_for(n), 256, 0, stream>>>(s, d, n);
                           } else {
                             copy_strided_kernel<S, D>
                                 <<<grid_for(n), 256, 0, stream>>>(s, d, n, layout);
                           }
                           KILN_CUDA_LAUNCH_CHECK();
                         }));
}

void memcpy_async(void* dst, Device dst_device, const void* src, Device src_device,
                  std::size_t bytes) {
  if (bytes == 0) return;
  cudaMemcpyKind kind = dst_device.is_cuda() ? (src_device.is_cuda() ? cudaMemcpyDeviceToDevice
                                                                     : cudaMemcpyHostToDevice)
                                             : cudaMemcpyDeviceToHost;
  Device gpu = dst_device.is_cuda() ? dst_device : src_device;
  cudaStream_t stream = static_cast<cudaStream_t>(current_stream(gpu));
  if (kind == cudaMemcpyDeviceToDevice && dst_device.index != src_device.index) {
    KILN_CUDA_CHECK(
        cudaMemcpyPeerAsync(dst, dst_device.index, src, src_device.index, bytes, stream));
  } else {
    // The pointers tell where the bytes are: a "device" tensor may live in pinned host memory.
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
  }
  // The host reads what it copied back as soon as this returns.
  if (kind == cudaMemcpyDeviceToHost) KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void fill(Tensor& x, double value) {
  std::int64_t n = x.numel();
  if (n == 0) return;
  cudaStream_t stream = stream_of(x);
  KILN_CUDA_DISPATCH_ALL(x.dtype(), T, {
    T v = host_value<T>(value);
    fill_kernel<T><<<grid_for(n), 256, 0, stream>>>(static_cast<T*>(x.data()), n, v);
    KILN_CUDA_LAUNCH_CHECK();
  });
}

namespace {
void binary(const Tensor& a, const Tensor& b, Tensor& out, Binary op) {
  std::int64_t n = a.numel();
  if (n == 0) return;
  KILN_CUDA_DISPATCH_FLOATING(a.dtype(), T, {
    if (n % Pack<T>::kSize == 0 && aligned16({a.data(), b.data(), out.data()})) {
      std::int64_t packs = n / Pack<T>::kSize;
      binary_packed_kernel<T><<<grid_for(packs), 256, 0, stream_of(out)>>>(
          static_cast<const Pack<T>*>(a.data()), static_cast<const Pack<T>*>(b.data()),
          static_cast<Pack<T>*>(out.data()), packs, op);
      KILN_CUDA_LAUNCH_CHECK();
      return;
    }
    binary_kernel<T><<<grid_for(n), 256, 0, stream_of(out)>>>(static_cast<const T*>(a.data()),
                                                              static_cast<const T*>(b.data()),
                                                              static_cast<T*>(out.data()), n, op);
    KILN_CUDA_LAUNCH_CHECK();
  });
}
}  // namespace

void add(const Tensor& a, const Tensor& b, Tensor& out) {
  binary(a, b, out, Binary::Add);
}
void mul(const Tensor& a, const Tensor& b, Tensor& out) {
  binary(a, b, out, Binary::Mul);
}

void axpy(double alpha, const Tensor& x, Tensor& y) {
  std::int64_t n = x.numel();
  if (n == 0) return;
  KILN_CUDA_DISPATCH_FLOATING(x.dtype(), T, {
    using C = typename Compute<T>::type;
    if (n % Pack<T>::kSize == 0 && aligned16({x.data(), y.data()})) {
      std::int64_t packs = n / Pack<T>::kSize;
      axpy_packed_kernel<T><<<grid_for(packs), 256, 0, stream_of(y)>>>(
          static_cast<C>(alpha), static_cast<const Pack<T>*>(x.data()),
          static_cast<Pack<T>*>(y.data()), packs);
      KILN_CUDA_LAUNCH_CHECK();
      return;
    }
    axpy_kernel<T><<<grid_for(n), 256, 0, stream_of(y)>>>(
        static_cast<C>(alpha), static_cast<const T*>(x.data()), static_cast<T*>(y.data()), n);
    KILN_CUDA_LAUNCH_CHECK();
  });
}

void scale(Tensor& x, double alpha) {
  std::int64_t n = x.numel();
  if (n == 0) return;
  KILN_CUDA_DISPATCH_FLOATING(x.dtype(), T, {
    using C = typename Compute<T>::type;
    scale_kernel<T><<<grid_for(n), 256, 0, stream_of(x)>>>(static_cast<T*>(x.data()),
                                                           static_cast<C>(alpha), n);
    KILN_CUDA_LAUNCH_CHECK();
  });
}

void increment(Tensor& counter) {
  increment_kernel<<<1, 1, 0, stream_of(counter)>>>(static_cast<std::int64_t*>(counter.data()));
  KILN_CUDA_LAUNCH_CHECK();
}

void reduce(const Tensor& x, ops::Reduction r, std::int64_t rows, std::int64_t cols, bool over_rows,
            Tensor& out) {
  cudaStream_t stream = stream_of(x);
  std::int64_t outputs = over_rows ? cols : rows;
  if (outputs == 0) return;
  KILN_CUDA_DISPATCH_FLOATING(x.dtype(), T, {
    using C = typename Compute<T>::type;
    const T* px = static_cast<const T*>(x.data());
    C* po = static_cast<C*>(out.data());
    if (over_rows) {
      dim3 block(32, 8);
      reduce_cols_kernel<T, C>
          <<<static_cast<unsigned>((cols + 31) / 32), block, 0, stream>>>(px, rows, cols, r, po);
      KILN_CUDA_LAUNCH_CHECK();
    } else {
      // Long rows are split into chunks so that a whole-tensor reduction fills the GPU; the
      // partials are combined in a fixed order, so results do not vary between runs.
      std::int64_t chunk = 16384;
      int chunks = static_cast<int>(std::max<std::int64_t>(1, (cols + chunk - 1) / chunk));
      if (chunks > 1024) {
        chunks = 1024;
        chunk = (cols + chunks - 1) / chunks;
      }
      Tensor partial = Tensor::empty({rows * chunks}, out.dtype(), x.device());
      dim3 grid(static_cast<unsigned>(rows), chunks);
      reduce_rows_kernel<T, C>
          <<<grid, 256, 0, stream>>>(px, cols, chunk, chunks, r, static_cast<C*>(partial.data()));
      KILN_CUDA_LAUNCH_CHECK();
      std::int64_t count = cols;
      finish_rows_kernel<C><<<static_cast<unsigned>(rows), 256, 0, stream>>>(
          static_cast<const C*>(partial.data()), chunks, rows, count, r, po);
      KILN_CUDA_LAUNCH_CHECK();
    }
  });
}

void gemm(bool ta, bool tb, double alpha, const Tensor& a, const Tensor& b, double beta, Tensor& c,
          std::int64_t batch) {
  std::int64_t m = c.size(-2), n = c.size(-1), k = ta ? a.size(-2) : a.size(-1);
  if (m == 0 || n == 0) return;
  bool wide = a.dtype() == DType::F64;
  if (batch == 1 && !wide) {
    // One GEMM: cuBLASLt with a plan per shape (core/cuda/cublaslt_gemm.h), as the linear layers
    // use; cublasGemmEx picks markedly slower kernels for some shapes (GPT-2's LM head, a sixth
    // of the speed). In cuBLASLt's column-major terms, D^T = op(B)^T op(A)^T.
    LtGemm g;
    g.trans_a = tb;
    g.trans_b = ta;
    g.m = n;
    g.n = m;
    g.k = k;
    g.a = b.data();
    g.lda = leading_dim(b);
    g.b = a.data();
    g.ldb = leading_dim(a);
    g.ab_type = a.dtype();
    g.d = c.data();
    g.ldd = leading_dim(c);
    g.d_type = c.dtype();
    g.alpha = alpha;
    g.beta = beta;
    if (lt_matmul(g, c.device())) return;
  }
  cublasHandle_t handle = cublas_handle();
  double alpha64 = alpha, beta64 = beta;
  float alpha32 = static_cast<float>(alpha), beta32 = static_cast<float>(beta);
  const void* pa = wide ? static_cast<const void*>(&alpha64) : &alpha32;
  const void* pb = wide ? static_cast<const void*>(&beta64) : &beta32;
  cublasComputeType_t compute = wide ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F;
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
  cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  std::int64_t sa = (batch > 1 && a.dim() == 3 && a.size(0) > 1) ? a.stride(0) : 0;
  std::int64_t sb = (batch > 1 && b.dim() == 3 && b.size(0) > 1) ? b.stride(0) : 0;
  std::int64_t sc = batch > 1 ? c.stride(0) : 0;
  KILN_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      handle, opb, opa, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), pa, b.data(),
      cuda_data_type(b.dtype()), static_cast<int>(leading_dim(b)), sb, a.data(),
      cuda_data_type(a.dtype()), static_cast<int>(leading_dim(a)), sa, pb, c.data(),
      cuda_data_type(c.dtype()), static_cast<int>(leading_dim(c)), sc, static_cast<int>(batch),
      compute, CUBLAS_GEMM_DEFAULT));
}

void fill_uniform(Tensor& x, double low, double high, std::uint64_t seed, std::uint64_t offset) {
  std::int64_t n = x.numel();
  if (n == 0) return;
  KILN_CUDA_DISPATCH_FLOATING(x.dtype(), T, {
    uniform_kernel<T><<<grid_for(n), 256, 0, stream_of(x)>>>(
        static_cast<T*>(x.data()), n, low, high, seed, offset, x.dtype() == DType::F64);
    KILN_CUDA_LAUNCH_CHECK();
  });
}

void fill_normal(Tensor& x, double mean, double stddev, std::uint64_t seed, std::uint64_t offset) {
  std::int64_t n = x.numel();
  if (n == 0) return;
  KILN_CUDA_DISPATCH_FLOATING(x.dtype(), T, {
    normal_kernel<T><<<grid_for(n), 256, 0, stream_of(x)>>>(
        static_cast<T*>(x.data()), n, mean, stddev, seed, offset, x.dtype() == DType::F64);
    KILN_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace kiln::cuda
