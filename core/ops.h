#pragma once
// Device-dispatched tensor ops: each runs on the device of its operands (all on one device) on
// the current stream. Half inputs compute in fp32; f64 computes in f64.

#include <cstdint>

#include "core/tensor.h"

namespace kiln::ops {

// Elementwise; operands have the same shape and dtype; `out` may alias an input.
void add(const Tensor& a, const Tensor& b, Tensor& out);  // out = a + b
void mul(const Tensor& a, const Tensor& b, Tensor& out);  // out = a * b
void axpy(double alpha, const Tensor& x, Tensor& y);      // y += alpha * x
void scale(Tensor& x, double alpha);                      // x *= alpha
// counter += 1 for a one-element I64 tensor, on its device without a host read (a CUDA graph
// node): the step counter that dropout reads through Context::step_source.
void increment(Tensor& counter);
Tensor add(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);

enum class Reduction { Sum, Max, Mean, L2Norm };
const char* reduction_name(Reduction r);

// Accumulate in f32 (f64 for f64 input); the result is F32 (F64 for f64 input).
Tensor reduce(const Tensor& x, Reduction r);       // () over every element
Tensor reduce_rows(const Tensor& x, Reduction r);  // (rows): over the last dimension
Tensor reduce_cols(const Tensor& x, Reduction r);  // (cols): over all but the last dimension

// C = alpha * op(A) * op(B) + beta * C for row-major matrices whose last dimension has stride 1.
// A and B share a dtype; C has that dtype, or F32 when A and B are half (fp32 accumulation).
void gemm(bool trans_a, bool trans_b, double alpha, const Tensor& a, const Tensor& b, double beta,
          Tensor& c);
// The same over a batch: 3-D tensors (batch, rows, cols); a batch of 1 in A or B broadcasts.
void gemm_batched(bool trans_a, bool trans_b, double alpha, const Tensor& a, const Tensor& b,
                  double beta, Tensor& c);

// Parameter-gradient accumulation (the layers' "gradients +=" contract).
// grad += src, src cast to grad's device and dtype (any floating dtypes, same number of elements).
void accumulate(Tensor& grad, const Tensor& src);
// grad += alpha * op(A) op(B): straight into grad when it is contiguous and has A's dtype (or f32
// for half A), else through a temporary in A's dtype (f32 for half A) that is then accumulated.
void gemm_accumulate(bool trans_a, bool trans_b, const Tensor& a, const Tensor& b, Tensor& grad,
                     double alpha = 1.0);

// Counter-based random numbers: element i of a contiguous tensor draws from Philox4x32-10 with
// key `seed` and counter offset + i / 4, so CPU and GPU give the same values.
void fill_uniform(Tensor& x, double low, double high, std::uint64_t seed, std::uint64_t offset = 0);
void fill_normal(Tensor& x, double mean, double stddev, std::uint64_t seed,
                 std::uint64_t offset = 0);

}  // namespace kiln::ops
