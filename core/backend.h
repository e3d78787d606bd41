#pragma once
// The per-device implementations behind Tensor and ops. ops.cc and tensor.cc dispatch to them;
// nothing else should call them. Every function takes tensors already checked for device,
// dtype and shape agreement.

#include <cstdint>

#include "core/cuda_op.h"
#include "core/ops.h"
#include "core/tensor.h"

// The ops every backend implements, declared alike in each backend's namespace: OP(signature)
// declares one. Tensors may have any strides where noted; otherwise they are contiguous.
#define KILN_BACKEND_OPS_(OP)                                                                    \
  OP(void copy(const Tensor& src, Tensor& dst)) /* any strides, casting (CUDA: on one device) */ \
  OP(void fill(Tensor& x, double value))                                                         \
  OP(void add(const Tensor& a, const Tensor& b, Tensor& out))                                    \
  OP(void mul(const Tensor& a, const Tensor& b, Tensor& out))                                    \
  OP(void axpy(double alpha, const Tensor& x, Tensor& y))                                        \
  OP(void scale(Tensor& x, double alpha))                                                        \
  OP(void increment(Tensor& counter)) /* one I64 element */                                      \
  OP(void reduce(const Tensor& x, ops::Reduction r, std::int64_t rows, std::int64_t cols,        \
                 bool over_rows, Tensor& out))                                                   \
  OP(void gemm(bool ta, bool tb, double alpha, const Tensor& a, const Tensor& b, double beta,    \
               Tensor& c, std::int64_t batch))                                                   \
  OP(void fill_uniform(Tensor& x, double low, double high, std::uint64_t seed,                   \
                       std::uint64_t offset))                                                    \
  OP(void fill_normal(Tensor& x, double mean, double stddev, std::uint64_t seed,                 \
                      std::uint64_t offset))

#define KILN_CPU_OP_(...) __VA_ARGS__;
#define KILN_CUDA_TENSOR_OP_(...) KILN_CUDA_OP("a tensor op", __VA_ARGS__);

namespace kiln::cpu {
KILN_BACKEND_OPS_(KILN_CPU_OP_)
}  // namespace kiln::cpu

namespace kiln::cuda {
KILN_BACKEND_OPS_(KILN_CUDA_TENSOR_OP_)
KILN_CUDA_OP("a device copy", void memcpy_async(void* dst, Device dst_device, const void* src,
                                                Device src_device, std::size_t bytes));
}  // namespace kiln::cuda

#undef KILN_CUDA_TENSOR_OP_
#undef KILN_CPU_OP_
#undef KILN_BACKEND_OPS_
