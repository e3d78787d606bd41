// ReLU on CUDA: forward, forward of a sum (a residual block's) and backward are one grid-stride
// elementwise kernel each, on 16-byte packs when the tensors are aligned (the common case), else
// element by element.

#include <initializer_list>
#include <string>

#include "core/cuda/cuda_check.h"
#include "core/cuda/element.cuh"
#include "core/stream.h"
#include "layers/cuda/relu_cuda.h"

namespace kiln::relu_cuda {
namespace {

// out = op(a, b) elementwise: relu(a) (b unused), relu(a + b) with the sum rounded to T first
// (as an addition kernel then ReLU), or the gradient of ReLU with a = y, b = dy.
enum class Op { Relu, ReluOfSum, ReluGrad };

template <typename T>
__device__ __forceinline__ T relu_of(T v) {
  return static_cast<float>(cuda::load(v)) > 0.f ? v : cuda::store<T>(0.f);
}

template <Op op, typename T>
__device__ __forceinline__ T apply(T a, T b) {
  if constexpr (op == Op::Relu) {
    return relu_of(a);
  } else if constexpr (op == Op::ReluOfSum) {
    return relu_of(cuda::store<T>(cuda::load(a) + cuda::load(b)));
  } else {
    return static_cast<float>(cuda::load(a)) > 0.f ? b : cuda::store<T>(0.f);
  }
}

// Elements [begin, n) one at a time, from one grid-stride loop (the tail after the packs).
template <Op op, typename T>
__global__ void elementwise_kernel(const T* a, const T* b, T* out, std::int64_t begin,
                                   std::int64_t n) {
  for (std::int64_t i = begin + blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       i < n; i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    out[i] = apply<op>(a[i], op == Op::Relu ? a[i] : b[i]);
  }
}

template <Op op, typename T>
__global__ void packed_kernel(const cuda::Pack<T>* a, const cuda::Pack<T>* b, cuda::Pack<T>* out,
                              std::int64_t packs) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < packs;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    cuda::Pack<T> p = a[i];
    const cuda::Pack<T> q = op == Op::Relu ? p : b[i];
#pragma unroll
    for (int k = 0; k < cuda::Pack<T>::kSize; ++k) p.v[k] = apply<op>(p.v[k], q.v[k]);
    out[i] = p;
  }
}

// b may be null for Op::Relu; out may alias a or b.
template <Op op>
void launch(const Tensor& a, const Tensor* b, Tensor& out, const char* who) {
  bool ok = a.is_contiguous() && out.is_contiguous() && a.dtype() == out.dtype() &&
            a.numel() == out.numel();
  if (b) ok = ok && b->is_contiguous() && b->dtype() == a.dtype() && b->numel() == a.numel();
  KILN_CHECK(ok, std::string("relu_cuda::") + who + ": " + a.str() + ", " +
                     (b ? b->str() + ", " : std::string()) + out.str());
  const std::int64_t n = a.numel();
  if (n == 0) return;
  cudaStream_t stream = static_cast<cudaStream_t>(current_stream(a.device()));
  KILN_CUDA_DISPATCH_FLOATING(a.dtype(), T, {
    const T* pa = static_cast<const T*>(a.data());
    const T* pb = b ? static_cast<const T*>(b->data()) : nullptr;
    T* po = static_cast<T*>(out.data());
    std::int64_t packs = cuda::aligned16({pa, pb, po}) ? n / cuda::Pack<T>::kSize : 0;
    if (packs > 0) {
      packed_kernel<op, T><<<cuda::grid_for(packs), 256, 0, stream>>>(
          reinterpret_cast<const cuda::Pack<T>*>(pa), reinterpret_cast<const cuda::Pack<T>*>(pb),
          reinterpret_cast<cuda::Pack<T>*>(po), packs);
      KILN_CUDA_LAUNCH_CHECK();
    }
    std::int64_t done = packs * cuda::Pack<T>::kSize;
    if (done < n) {
      elementwise_kernel<op, T><<<cuda::grid_for(n - done), 256, 0, stream>>>(pa, pb, po, done, n);
      KILN_CUDA_LAUNCH_CHECK();
    }
  });
}

}  // namespace

void forward(const Tensor& x, Tensor& y) {
  launch<Op::Relu>(x, nullptr, y, "forward");
}

void forward_add(const Tensor& x, const Tensor& r, Tensor& y) {
  launch<Op::ReluOfSum>(x, &r, y, "forward_add");
}

void backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  launch<Op::ReluGrad>(y, &dy, dx, "backward");
}

}  // namespace kiln::relu_cuda
