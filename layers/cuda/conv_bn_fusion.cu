// The per-channel and elementwise kernels around cuDNN's fused convolution + batch norm patterns
// (layers/cuda/conv_bn_fusion.cc): the statistics' finalisation into the next convolution's
// prologue coefficients, the prologue itself where a pattern falls back (scale, bias, ReLU), and
// the batch-norm backward's last elementwise step from cuDNN's equivalent coefficients. All on
// NHWC activations, whose channel is the fastest index.

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/cuda/cuda_check.h"
#include "core/cuda/element.cuh"
#include "core/stream.h"
#include "layers/cuda/conv_bn_fusion_cuda.h"

namespace kiln::conv_bn_fusion {
namespace {

template <typename T>
__global__ void finalize_kernel(const float* sum, const float* sq_sum, const float* gamma,
                                const float* beta, std::int64_t channels, float count, float eps,
                                float momentum, bool update_running, float* running_mean,
                                float* running_var, float* mean, float* invstd, float* var,
                                T* scale, T* bias) {
  const std::int64_t c = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (c >= channels) return;
  const float m = sum[c] / count;
  const float v = fmaxf(sq_sum[c] / count - m * m, 0.f);  // biased, as batch norm normalises by
  const float is = 1.f / sqrtf(v + eps);
  mean[c] = m;
  invstd[c] = is;
  var[c] = v;
  const float s = gamma[c] * is;
  scale[c] = cuda::store<T>(s);
  bias[c] = cuda::store<T>(beta[c] - m * s);
  if (update_running) {  // PyTorch's rule: the unbiased variance goes into the running one
    const float unbiased = count > 1.f ? v * count / (count - 1.f) : v;
    running_mean[c] = (1.f - momentum) * running_mean[c] + momentum * m;
    running_var[c] = (1.f - momentum) * running_var[c] + momentum * unbiased;
  }
}

// out = relu(x * scale[c] + bias[c]) (the prologue, rounded as cuDNN's: coefficients in T).
template <typename T>
__device__ __forceinline__ T prologue(T x, T scale, T bias) {
  const float v = __fmaf_rn(cuda::load(x), cuda::load(scale), cuda::load(bias));
  return cuda::store<T>(v > 0.f ? v : 0.f);
}

template <typename T>
__global__ void scale_bias_relu_kernel(const cuda::Pack<T>* x, const T* scale, const T* bias,
                                       std::int64_t channels, cuda::Pack<T>* out,
                                       std::int64_t packs) {
  constexpr int K = cuda::Pack<T>::kSize;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < packs;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    cuda::Pack<T> p = x[i];
    const std::int64_t c0 = (i * K) % channels;  // channels is a multiple of K
#pragma unroll
    for (int k = 0; k < K; ++k) p.v[k] = prologue(p.v[k], scale[c0 + k], bias[c0 + k]);
    out[i] = p;
  }
}

// dx = eq_dy[c] * g + eq_x[c] * x + eq_bias[c]
template <typename T>
__global__ void apply_backward_kernel(const cuda::Pack<T>* g, const cuda::Pack<T>* x,
                                      const float* eq_dy, const float* eq_x, const float* eq_bias,
                                      std::int64_t channels, cuda::Pack<T>* dx,
                                      std::int64_t packs) {
  constexpr int K = cuda::Pack<T>::kSize;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < packs;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const cuda::Pack<T> pg = g[i], px = x[i];
    cuda::Pack<T> out;
    const std::int64_t c0 = (i * K) % channels;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const std::int64_t c = c0 + k;
      out.v[k] = cuda::store<T>(eq_dy[c] * cuda::load(pg.v[k]) + eq_x[c] * cuda::load(px.v[k]) +
                                eq_bias[c]);
    }
    dx[i] = out;
  }
}

void check_vector(const Tensor& t, std::int64_t channels, DType dtype, const char* what) {
  KILN_CHECK(
      t.device().is_cuda() && t.dtype() == dtype && t.numel() == channels && t.is_contiguous(),
      std::string("conv_bn_fusion: ") + what + " must be " + dtype_name(dtype) + " (" +
          std::to_string(channels) + ") on the GPU, got " + t.str());
}

// The channel count of an NHWC activation and a check that it can be walked in Packs.
template <typename T>
std::int64_t packed_channels(const Tensor& x, std::initializer_list<const void*> pointers,
                             const char* who) {
  const std::int64_t channels = x.shape().back();
  KILN_CHECK(x.dim() == 4 && x.is_contiguous() && channels % cuda::Pack<T>::kSize == 0 &&
                 cuda::aligned16(pointers),
             std::string("conv_bn_fusion::") + who +
                 ": needs a contiguous NHWC tensor with a multiple of " +
                 std::to_string(cuda::Pack<T>::kSize) + " channels, 16-byte aligned; got " +
                 x.str());
  return channels;
}

}  // namespace

void finalize(const Tensor& sum, const Tensor& sq_sum, std::int64_t count, const Tensor& gamma,
              const Tensor& beta, double eps, double momentum, bool update_running,
              Tensor& running_mean, Tensor& running_var, Tensor& mean, Tensor& invstd, Tensor& var,
              Tensor& scale, Tensor& bias) {
  const std::int64_t channels = sum.numel();
  for (const Tensor* t : std::initializer_list<const Tensor*>{
           &sum, &sq_sum, &gamma, &beta, &running_mean, &running_var, &mean, &invstd, &var}) {
    check_vector(*t, channels, DType::F32, "a statistic");
  }
  check_vector(bias, channels, scale.dtype(), "the prologue's bias");
  KILN_CHECK(count > 0, "conv_bn_fusion::finalize: no values counted");
  cudaStream_t stream = static_cast<cudaStream_t>(current_stream(sum.device()));
  KILN_CUDA_DISPATCH_FLOATING(scale.dtype(), T, {
    finalize_kernel<T><<<static_cast<unsigned>((channels + 255) / 256), 256, 0, stream>>>(
        static_cast<const float*>(sum.data()), static_cast<const float*>(sq_sum.data()),
        static_cast<const float*>(gamma.data()), static_cast<const float*>(beta.data()), channels,
        static_cast<float>(count), static_cast<float>(eps), static_cast<float>(momentum),
        update_running, static_cast<float*>(running_mean.data()),
        static_cast<float*>(running_var.data()), static_cast<float*>(mean.data()),
        static_cast<float*>(invstd.data()), static_cast<float*>(var.data()),
        static_cast<T*>(scale.data()), static_cast<T*>(bias.data()));
    KILN_CUDA_LAUNCH_CHECK();
  });
}

void scale_bias_relu(const Tensor& x, const Tensor& scale, const Tensor& bias, Tensor& out) {
  KILN_CHECK(out.shape() == x.shape() && out.dtype() == x.dtype(),
             "conv_bn_fusion::scale_bias_relu: out " + out.str() + " for x " + x.str());
  cudaStream_t stream = static_cast<cudaStream_t>(current_stream(x.device()));
  KILN_CUDA_DISPATCH_FLOATING(x.dtype(), T, {
    const std::int64_t channels = packed_channels<T>(x, {x.data(), out.data()}, "scale_bias_relu");
    check_vector(scale, channels, x.dtype(), "the prologue's scale");
    check_vector(bias, channels, x.dtype(), "the prologue's bias");
    const std::int64_t packs = x.numel() / cuda::Pack<T>::kSize;
    if (packs == 0) return;
    scale_bias_relu_kernel<T><<<cuda::grid_for(packs), 256, 0, stream>>>(
        static_cast<const cuda::Pack<T>*>(x.data()), static_cast<const T*>(scale.data()),
        static_cast<const T*>(bias.data()), channels, static_cast<cuda::Pack<T>*>(out.data()),
        packs);
    KILN_CUDA_LAUNCH_CHECK();
  });
}

void apply_backward(const Tensor& g, const Tensor& x, const Tensor& eq_dy, const Tensor& eq_x,
                    const Tensor& eq_bias, Tensor& dx) {
  KILN_CHECK(
      g.shape() == x.shape() && g.dtype() == x.dtype() && dx.shape() == x.shape() &&
          dx.dtype() == x.dtype() && g.is_contiguous(),
      "conv_bn_fusion::apply_backward: g " + g.str() + ", x " + x.str() + ", dx " + dx.str());
  cudaStream_t stream = static_cast<cudaStream_t>(current_stream(x.device()));
  KILN_CUDA_DISPATCH_FLOATING(x.dtype(), T, {
    const std::int64_t channels =
        packed_channels<T>(x, {g.data(), x.data(), dx.data()}, "apply_backward");
    for (const Tensor* t : {&eq_dy, &eq_x, &eq_bias}) {
      check_vector(*t, channels, DType::F32, "an equivalent coefficient");
    }
    const std::int64_t packs = x.numel() / cuda::Pack<T>::kSize;
    if (packs == 0) return;
    apply_backward_kernel<T><<<cuda::grid_for(packs), 256, 0, stream>>>(
        static_cast<const cuda::Pack<T>*>(g.data()), static_cast<const cuda::Pack<T>*>(x.data()),
        static_cast<const float*>(eq_dy.data()), static_cast<const float*>(eq_x.data()),
        static_cast<const float*>(eq_bias.data()), channels, static_cast<cuda::Pack<T>*>(dx.data()),
        packs);
    KILN_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace kiln::conv_bn_fusion
