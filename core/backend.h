#pragma once
// The per-device implementations behind Tensor and ops. ops.cc and tensor.cc dispatch to them;
// nothing else should call them. Every function takes tensors already checked for device,
// dtype and shape agreement.

#include <cstdint>

#include "core/ops.h"
#include "core/tensor.h"

// The ops every backend implements, declared alike in each backend's namespace. Tensors may have
// any strides where noted; otherwise they are contiguous.
#define KILN_BACKEND_OPS_                                                                          \
  void copy(const Tensor& src, Tensor& dst); /* any strides, casting (CUDA: on one device) */      \
  void fill(Tensor& x, double value);                                                              \
  void add(const Tensor& a, const Tensor& b, Tensor& out);                                         \
  void mul(const Tensor& a, const Tensor& b, Tensor& out);                                         \
  void axpy(double alpha, const Tensor& x, Tensor& y);                                             \
  void scale(Tensor& x, double alpha);                                                             \
  void increment(Tensor& counter); /* one I64 element */                                           \
  void reduce(const Tensor& x, ops::Reduction r, std::int64_t rows, std::int64_t cols,             \
              bool over_rows, Tensor& out);                                                        \
  void gemm(bool ta, bool tb, double alpha, const Tensor& a, const Tensor& b, double beta,         \
            Tensor& c, std::int64_t batch);                                                        \
  void fill_uniform(Tensor& x, double low, double high, std::uint64_t seed, std::uint64_t offset); \
  void fill_normal(Tensor& x, double mean, double stddev, std::uint64_t seed, std::uint64_t offset);

namespace kiln::cpu {
KILN_BACKEND_OPS_
}  // namespace kiln::cpu

namespace kiln::cuda {
KILN_BACKEND_OPS_
void memcpy_async(void* dst, Device dst_device, const void* src, Device src_device,
                  std::size_t bytes);
}  // namespace kiln::cuda

#undef KILN_BACKEND_OPS_
