// Softmax cross-entropy on CUDA: one block per row for the forward (max, argmax, logsumexp, the
// smoothed loss, fp32 math) and one for the backward; a single-block pass reduces the per-row
// results in a fixed order, so the loss is deterministic and never read on the host.

#include <cmath>
#include <cstdint>

#include "core/cuda/cuda_check.h"
#include "core/cuda/element.cuh"
#include "core/stream.h"
#include "layers/cuda/softmax_cross_entropy_cuda.h"

namespace kiln::cuda {
namespace {

constexpr int kRowThreads = 256;
constexpr int kFinalThreads = 1024;
constexpr int kCounted = 1, kCorrect = 2, kInvalid = 4;

// The (value, index) maximum, the first index winning ties (torch.argmax).
__device__ __forceinline__ void max_merge(float& v, std::int64_t& i, float ov, std::int64_t oi) {
  if (ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

// A row's smoothed loss and flags from its log-sum-exp, its sum of logits and its argmax.
template <typename T>
__device__ __forceinline__ void write_row_loss(const T* x, std::int64_t t, std::int64_t classes,
                                               float smoothing, std::int64_t ignore_index,
                                               float lse, float sum_x, std::int64_t argmax,
                                               float* row_loss, int* row_flags) {
  float loss = 0;
  int flags = 0;
  if (t != ignore_index) {
    if (t < 0 || t >= classes) {
      flags = kInvalid;
    } else {
      const float nll = lse - static_cast<float>(load(x[t]));
      const float smooth = lse - sum_x / static_cast<float>(classes);
      loss = (1.0f - smoothing) * nll + smoothing * smooth;
      flags = kCounted | (argmax == t ? kCorrect : 0);
    }
  }
  *row_loss = loss;
  *row_flags = flags;
}

// Lane 0 ends with the warp's (first) maximum and its index, and the warp's sum of sum_x.
__device__ __forceinline__ void warp_max_and_sum(float& max, std::int64_t& arg, float& sum_x) {
  for (int off = 16; off > 0; off /= 2) {
    const float ov = __shfl_down_sync(0xffffffffu, max, off);
    const std::int64_t oi = __shfl_down_sync(0xffffffffu, arg, off);
    max_merge(max, arg, ov, oi);
    sum_x += __shfl_down_sync(0xffffffffu, sum_x, off);
  }
}

template <typename T>
__global__ void cross_entropy_forward_kernel(const T* logits, std::int64_t ld,
                                             const std::int64_t* targets, std::int64_t classes,
                                             float smoothing, std::int64_t ignore_index,
                                             float* row_lse, float* row_loss, int* row_flags) {
  __shared__ float s_max[kRowThreads / 32], s_sum[kRowThreads / 32];
  __shared__ std::int64_t s_arg[kRowThreads / 32];
  __shared__ float s_row_max, s_row_sum_x;
  __shared__ std::int64_t s_row_arg;
  const std::int64_t row = blockIdx.x;
  const T* x = logits + row * ld;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

  // Pass 1: maximum, its first index, and the sum of the logits (for label smoothing).
  float max = -INFINITY, sum_x = 0;
  std::int64_t arg = classes;
  for (std::int64_t c = threadIdx.x; c < classes; c += blockDim.x) {
    float v = load(x[c]);
    max_merge(max, arg, v, c);
    sum_x += v;
  }
  warp_max_and_sum(max, arg, sum_x);
  if (lane == 0) {
    s_max[warp] = max;
    s_arg[warp] = arg;
    s_sum[warp] = sum_x;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = s_max[0], sx = s_sum[0];
    std::int64_t a = s_arg[0];
    for (int w = 1; w < kRowThreads / 32; ++w) {
      max_merge(m, a, s_max[w], s_arg[w]);
      sx += s_sum[w];
    }
    s_row_max = m;
    s_row_arg = a;
    s_row_sum_x = sx;
  }
  __syncthreads();
  const float row_max = s_row_max;

  // Pass 2: sum of exp(x - max).
  float sum_exp = 0;
  for (std::int64_t c = threadIdx.x; c < classes; c += blockDim.x) {
    sum_exp += expf(static_cast<float>(load(x[c])) - row_max);
  }
  for (int off = 16; off > 0; off /= 2) sum_exp += __shfl_down_sync(0xffffffffu, sum_exp, off);
  __syncthreads();  // s_sum is reused
  if (lane == 0) s_sum[warp] = sum_exp;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0;
    for (int w = 0; w < kRowThreads / 32; ++w) total += s_sum[w];
    float lse = row_max + logf(total);
    row_lse[row] = lse;
    write_row_loss(x, targets[row], classes, smoothing, ignore_index, lse, s_row_sum_x, s_row_arg,
                   &row_loss[row], &row_flags[row]);
  }
}

// One block: the batch's loss, counted and correct rows, in a fixed summation order.
__global__ void cross_entropy_finish_kernel(const float* row_loss, const int* row_flags,
                                            std::int64_t rows, float* loss, float* counted,
                                            float* correct, int* invalid) {
  __shared__ double s_loss[kFinalThreads];
  __shared__ int s_counted[kFinalThreads], s_correct[kFinalThreads], s_invalid[kFinalThreads];
  double l = 0;
  int n = 0, ok = 0, bad = 0;
  for (std::int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    int f = row_flags[r];
    l += row_loss[r];
    n += (f & kCounted) ? 1 : 0;
    ok += (f & kCorrect) ? 1 : 0;
    bad += (f & kInvalid) ? 1 : 0;
  }
  s_loss[threadIdx.x] = l;
  s_counted[threadIdx.x] = n;
  s_correct[threadIdx.x] = ok;
  s_invalid[threadIdx.x] = bad;
  __syncthreads();
  for (int half = kFinalThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      s_loss[threadIdx.x] += s_loss[threadIdx.x + half];
      s_counted[threadIdx.x] += s_counted[threadIdx.x + half];
      s_correct[threadIdx.x] += s_correct[threadIdx.x + half];
      s_invalid[threadIdx.x] += s_invalid[threadIdx.x + half];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    int c = s_counted[0];
    *loss = s_invalid[0] > 0 ? NAN : static_cast<float>(s_loss[0] / (c > 0 ? c : 1));
    *counted = static_cast<float>(c);
    *correct = static_cast<float>(s_correct[0]);
    *invalid += s_invalid[0];
  }
}

template <typename T>
__global__ void cross_entropy_backward_kernel(const T* logits, std::int64_t ld,
                                              const std::int64_t* targets, std::int64_t classes,
                                              float smoothing, std::int64_t ignore_index,
                                              const float* row_lse, const float* counted,
                                              float scale_value, const double* scale_source,
                                              std::int64_t scale_divisor, T* dlogits,
                                              std::int64_t ld_out) {
  const std::int64_t row = blockIdx.x;
  const T* x = logits + row * ld;
  T* dx = dlogits + row * ld_out;
  std::int64_t t = targets[row];
  bool skip = t == ignore_index || t < 0 || t >= classes;
  float n = *counted;
  // The host path's order: the double quotient, rounded to float, then over the counted rows.
  const float scale = scale_source != nullptr
                          ? static_cast<float>(*scale_source / static_cast<double>(scale_divisor))
                          : scale_value;
  float factor = scale / (n > 0.0f ? n : 1.0f);
  float lse = row_lse[row];
  float uniform = smoothing / static_cast<float>(classes);
  for (std::int64_t c = threadIdx.x; c < classes; c += blockDim.x) {
    float g = 0;
    if (!skip) {
      float p = expf(static_cast<float>(load(x[c])) - lse);
      g = factor * (p - (c == t ? 1.0f - smoothing : 0.0f) - uniform);
    }
    dx[c] = store<T>(g);
  }
}

// The rows whose gradient the fused pass scales by 1 / counted: targets neither ignored nor out of
// range, counted before the rows are (one block).
__global__ void cross_entropy_count_kernel(const std::int64_t* targets, std::int64_t rows,
                                           std::int64_t classes, std::int64_t ignore_index,
                                           float* counted) {
  __shared__ int s_count[kFinalThreads];
  int n = 0;
  for (std::int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    std::int64_t t = targets[r];
    n += (t != ignore_index && t >= 0 && t < classes) ? 1 : 0;
  }
  s_count[threadIdx.x] = n;
  __syncthreads();
  for (int half = kFinalThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) s_count[threadIdx.x] += s_count[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) *counted = static_cast<float>(s_count[0]);
}

// exp in the precision the logits deserve: the fast one for half logits.
template <typename T>
__device__ __forceinline__ float exp_for(float x) {
  if constexpr (sizeof(T) == 2) {
    return __expf(x);
  } else {
    return expf(x);
  }
}

// (max, sum of exp(x - max)) of two disjoint sets of logits, as one.
template <typename T>
__device__ __forceinline__ void softmax_merge(float& m, float& s, float om, float os) {
  const float nm = fmaxf(m, om);
  if (nm == -INFINITY) return;  // both empty
  s = s * exp_for<T>(m - nm) + os * exp_for<T>(om - nm);
  m = nm;
}

constexpr int kFusedThreads = 1024;

// One block per row, the row read as 16-byte packs: the maximum, its first index, the sum of the
// logits and the sum of exp(x - max) in one pass (online softmax); then, with a gradient, a second
// pass (the row is still in L2) writes dlogits, which may be the logits themselves: each element
// is read before it is written, by the same thread.
template <typename T>
__global__ void __launch_bounds__(kFusedThreads)
    cross_entropy_fused_kernel(const T* logits, std::int64_t ld, const std::int64_t* targets,
                               std::int64_t classes, float smoothing, std::int64_t ignore_index,
                               const float* counted, float scale_value, const double* scale_source,
                               std::int64_t scale_divisor, T* dlogits, std::int64_t ld_out,
                               float* row_lse, float* row_loss, int* row_flags) {
  constexpr int kPack = Pack<T>::kSize;
  constexpr int kWarps = kFusedThreads / 32;
  __shared__ float s_max[kWarps], s_sum[kWarps], s_sum_x[kWarps], s_best[kWarps];
  __shared__ std::int64_t s_arg[kWarps];
  __shared__ float s_lse;
  const std::int64_t row = blockIdx.x;
  const T* x = logits + row * ld;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const std::int64_t packs = classes / kPack;
  const Pack<T>* xp = reinterpret_cast<const Pack<T>*>(x);
  float m = -INFINITY, s = 0, sum_x = 0, best = -INFINITY;
  std::int64_t arg = classes;
  auto visit = [&](float v, std::int64_t c) {
    if (v > best) {  // this thread sees its columns in increasing order: the first maximum wins
      best = v;
      arg = c;
    }
    sum_x += v;
  };
  for (std::int64_t p = threadIdx.x; p < packs; p += kFusedThreads) {
    const Pack<T> pack = xp[p];
    float v[kPack];
    float local = -INFINITY;
#pragma unroll
    for (int k = 0; k < kPack; ++k) {
      v[k] = load(pack.v[k]);
      visit(v[k], p * kPack + k);
      local = fmaxf(local, v[k]);
    }
    if (local > m) {
      s *= exp_for<T>(m - local);
      m = local;
    }
#pragma unroll
    for (int k = 0; k < kPack; ++k) s += exp_for<T>(v[k] - m);
  }
  for (std::int64_t c = packs * kPack + threadIdx.x; c < classes; c += kFusedThreads) {
    const float v = load(x[c]);
    visit(v, c);
    softmax_merge<T>(m, s, v, 1.0f);
  }
  for (int off = 16; off > 0; off /= 2) {
    const float om = __shfl_down_sync(0xffffffffu, m, off);
    const float os = __shfl_down_sync(0xffffffffu, s, off);
    softmax_merge<T>(m, s, om, os);
  }
  warp_max_and_sum(best, arg, sum_x);
  if (lane == 0) {
    s_max[warp] = m;
    s_sum[warp] = s;
    s_sum_x[warp] = sum_x;
    s_arg[warp] = arg;
    s_best[warp] = best;
  }
  __syncthreads();
  const std::int64_t t = targets[row];
  const bool skip = t == ignore_index || t < 0 || t >= classes;
  if (threadIdx.x == 0) {
    float rm = s_max[0], rs = s_sum[0], rx = s_sum_x[0], rb = s_best[0];
    std::int64_t ra = s_arg[0];
    for (int w = 1; w < kWarps; ++w) {
      softmax_merge<T>(rm, rs, s_max[w], s_sum[w]);
      max_merge(rb, ra, s_best[w], s_arg[w]);
      rx += s_sum_x[w];
    }
    const float lse = rm + logf(rs);
    row_lse[row] = lse;
    s_lse = lse;
    write_row_loss(x, t, classes, smoothing, ignore_index, lse, rx, ra, &row_loss[row],
                   &row_flags[row]);
  }
  if (dlogits == nullptr) return;
  __syncthreads();
  const float lse = s_lse;
  const float n = *counted;
  // The host path's order: the double quotient, rounded to float, then over the counted rows.
  const float scale = scale_source != nullptr
                          ? static_cast<float>(*scale_source / static_cast<double>(scale_divisor))
                          : scale_value;
  const float factor = skip ? 0.0f : scale / (n > 0.0f ? n : 1.0f);
  const float uniform = smoothing / static_cast<float>(classes);
  auto grad = [&](float v, std::int64_t c) {
    if (skip) return 0.0f;
    return factor * (exp_for<T>(v - lse) - (c == t ? 1.0f - smoothing : 0.0f) - uniform);
  };
  T* dx = dlogits + row * ld_out;
  Pack<T>* dp = reinterpret_cast<Pack<T>*>(dx);
  for (std::int64_t p = threadIdx.x; p < packs; p += kFusedThreads) {
    const Pack<T> pack = xp[p];
    Pack<T> out;
#pragma unroll
    for (int k = 0; k < kPack; ++k) out.v[k] = store<T>(grad(load(pack.v[k]), p * kPack + k));
    dp[p] = out;
  }
  for (std::int64_t c = packs * kPack + threadIdx.x; c < classes; c += kFusedThreads)
    dx[c] = store<T>(grad(load(x[c]), c));
}

}  // namespace

void softmax_cross_entropy_forward(const Tensor& logits, const Tensor& targets, double smoothing,
                                   std::int64_t ignore_index, Tensor& row_lse, Tensor& loss,
                                   Tensor& counted, Tensor& correct, Tensor& invalid) {
  std::int64_t rows = logits.size(0), classes = logits.size(1);
  Device device = logits.device();
  auto stream = static_cast<cudaStream_t>(current_stream(device));
  Tensor row_loss = Tensor::empty({rows}, DType::F32, device);   // (N)
  Tensor row_flags = Tensor::empty({rows}, DType::I32, device);  // (N)
  if (rows > 0) {
    KILN_CUDA_DISPATCH_FLOATING(logits.dtype(), T, {
      cross_entropy_forward_kernel<T><<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(
          static_cast<const T*>(logits.data()), logits.stride(0),
          static_cast<const std::int64_t*>(targets.data()), classes, static_cast<float>(smoothing),
          ignore_index, static_cast<float*>(row_lse.data()), static_cast<float*>(row_loss.data()),
          static_cast<int*>(row_flags.data()));
      KILN_CUDA_LAUNCH_CHECK();
    });
  }
  cross_entropy_finish_kernel<<<1, kFinalThreads, 0, stream>>>(
      static_cast<const float*>(row_loss.data()), static_cast<const int*>(row_flags.data()), rows,
      static_cast<float*>(loss.data()), static_cast<float*>(counted.data()),
      static_cast<float*>(correct.data()), static_cast<int*>(invalid.data()));
  KILN_CUDA_LAUNCH_CHECK();
}

void softmax_cross_entropy_backward(const Tensor& logits, const Tensor& targets, double smoothing,
                                    std::int64_t ignore_index, const Tensor& row_lse,
                                    const Tensor& counted, double scale, const double* scale_source,
                                    std::int64_t scale_divisor, Tensor& dlogits) {
  std::int64_t rows = logits.size(0), classes = logits.size(1);
  if (rows == 0) return;
  auto stream = static_cast<cudaStream_t>(current_stream(logits.device()));
  KILN_CUDA_DISPATCH_FLOATING(logits.dtype(), T, {
    cross_entropy_backward_kernel<T><<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(
        static_cast<const T*>(logits.data()), logits.stride(0),
        static_cast<const std::int64_t*>(targets.data()), classes, static_cast<float>(smoothing),
        ignore_index, static_cast<const float*>(row_lse.data()),
        static_cast<const float*>(counted.data()), static_cast<float>(scale), scale_source,
        scale_divisor, static_cast<T*>(dlogits.data()), dlogits.stride(0));
    KILN_CUDA_LAUNCH_CHECK();
  });
}

bool softmax_cross_entropy_fusable(const Tensor& logits, const Tensor& dlogits) {
  const DType dtype = logits.dtype();
  if ((dtype != DType::F32 && dtype != DType::F16 && dtype != DType::BF16) ||
      dlogits.dtype() != dtype)
    return false;
  const std::int64_t pack = 16 / static_cast<std::int64_t>(dtype_size(logits.dtype()));
  return logits.stride(0) % pack == 0 && dlogits.stride(0) % pack == 0 &&
         aligned16({logits.data(), dlogits.data()});
}

void softmax_cross_entropy_count(const Tensor& targets, std::int64_t classes,
                                 std::int64_t ignore_index, Tensor& counted) {
  auto stream = static_cast<cudaStream_t>(current_stream(targets.device()));
  cross_entropy_count_kernel<<<1, kFinalThreads, 0, stream>>>(
      static_cast<const std::int64_t*>(targets.data()), targets.numel(), classes, ignore_index,
      static_cast<float*>(counted.data()));
  KILN_CUDA_LAUNCH_CHECK();
}

void softmax_cross_entropy_fused_rows(const Tensor& logits, const Tensor& targets,
                                      std::int64_t first_row, double smoothing,
                                      std::int64_t ignore_index, const double* scale_source,
                                      std::int64_t scale_divisor, const Tensor& counted,
                                      Tensor& row_lse, Tensor& row_loss, Tensor& row_flags,
                                      Tensor& dlogits) {
  KILN_CHECK(softmax_cross_entropy_fusable(logits, dlogits),
             "SoftmaxCrossEntropy: rows in chunks need 16-byte aligned half or f32 rows");
  const std::int64_t rows = logits.size(0), classes = logits.size(1);
  if (rows == 0) return;
  auto stream = static_cast<cudaStream_t>(current_stream(logits.device()));
  const float scale_value = static_cast<float>(1.0 / static_cast<double>(scale_divisor));
  auto launch = [&](auto type) {
    using T = decltype(type);
    cross_entropy_fused_kernel<T><<<static_cast<unsigned>(rows), kFusedThreads, 0, stream>>>(
        static_cast<const T*>(logits.data()), logits.stride(0),
        static_cast<const std::int64_t*>(targets.data()) + first_row, classes,
        static_cast<float>(smoothing), ignore_index, static_cast<const float*>(counted.data()),
        scale_value, scale_source, scale_divisor, static_cast<T*>(dlogits.data()),
        dlogits.stride(0), static_cast<float*>(row_lse.data()) + first_row,
        static_cast<float*>(row_loss.data()) + first_row,
        static_cast<int*>(row_flags.data()) + first_row);
    KILN_CUDA_LAUNCH_CHECK();
  };
  if (logits.dtype() == DType::BF16) {
    launch(__nv_bfloat16());
  } else if (logits.dtype() == DType::F16) {
    launch(__half());
  } else {
    launch(float());
  }
}

void softmax_cross_entropy_finish(const Tensor& row_loss, const Tensor& row_flags, Tensor& loss,
                                  Tensor& counted, Tensor& correct, Tensor& invalid) {
  auto stream = static_cast<cudaStream_t>(current_stream(row_loss.device()));
  cross_entropy_finish_kernel<<<1, kFinalThreads, 0, stream>>>(
      static_cast<const float*>(row_loss.data()), static_cast<const int*>(row_flags.data()),
      row_loss.numel(), static_cast<float*>(loss.data()), static_cast<float*>(counted.data()),
      static_cast<float*>(correct.data()), static_cast<int*>(invalid.data()));
  KILN_CUDA_LAUNCH_CHECK();
}

bool softmax_cross_entropy_fused(const Tensor& logits, const Tensor& targets, double smoothing,
                                 std::int64_t ignore_index, const double* scale_source,
                                 std::int64_t scale_divisor, Tensor& row_lse, Tensor& loss,
                                 Tensor& counted, Tensor& correct, Tensor& invalid,
                                 Tensor& dlogits) {
  if (!softmax_cross_entropy_fusable(logits, dlogits)) return false;
  const std::int64_t rows = logits.size(0);
  Tensor row_loss = Tensor::empty({rows}, DType::F32, logits.device());   // (N)
  Tensor row_flags = Tensor::empty({rows}, DType::I32, logits.device());  // (N)
  softmax_cross_entropy_count(targets, logits.size(1), ignore_index, counted);
  softmax_cross_entropy_fused_rows(logits, targets, 0, smoothing, ignore_index, scale_source,
                                   scale_divisor, counted, row_lse, row_loss, row_flags, dlogits);
  softmax_cross_entropy_finish(row_loss, row_flags, loss, counted, correct, invalid);
  return true;
}

}  // namespace kiln::cuda
