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
  for (int off = 16; off > 0; off /= 2) {
    float ov = __shfl_down_sync(0xffffffffu, max, off);
    std::int64_t oi = __shfl_down_sync(0xffffffffu, arg, off);
    max_merge(max, arg, ov, oi);
    sum_x += __shfl_down_sync(0xffffffffu, sum_x, off);
  }
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
    std::int64_t t = targets[row];
    float loss = 0;
    int flags = 0;
    if (t != ignore_index) {
      if (t < 0 || t >= classes) {
        flags = kInvalid;
      } else {
        float nll = lse - static_cast<float>(load(x[t]));
        float smooth = lse - s_row_sum_x / static_cast<float>(classes);
        loss = (1.0f - smoothing) * nll + smoothing * smooth;
        flags = kCounted | (s_row_arg == t ? kCorrect : 0);
      }
    }
    row_loss[row] = loss;
    row_flags[row] = flags;
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

}  // namespace kiln::cuda
