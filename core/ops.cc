#include "core/ops.h"

#include "core/backend.h"
#include "core/gemm_tally.h"
#include "core/stream.h"

namespace kiln::ops {
namespace {

void same_device(const Tensor& a, const Tensor& b, const char* op) {
  KILN_CHECK(a.device() == b.device(),
             std::string(op) + ": operands on " + a.device().str() + " and " + b.device().str());
}

void same_layout(const Tensor& a, const Tensor& b, const char* op) {
  same_device(a, b, op);
  KILN_CHECK(a.shape() == b.shape() && a.dtype() == b.dtype(),
             std::string(op) + ": operands " + a.str() + " and " + b.str() + " differ");
  KILN_CHECK(a.is_contiguous() && b.is_contiguous(),
             std::string(op) + ": operands must be contiguous");
}

void floating(const Tensor& a, const char* op) {
  KILN_CHECK(is_floating(a.dtype()),
             std::string(op) + " needs a floating-point tensor, got " + a.str());
}

// Runs the CPU or the CUDA implementation for `device`.
template <typename CpuFn, typename CudaFn>
void dispatch(Device device, CpuFn cpu_fn, CudaFn cuda_fn) {
  if (device.is_cpu()) {
    cpu_fn();
    return;
  }
  KILN_CHECK(cuda_built(), "a CUDA tensor reached an op in a build without CUDA");
  DeviceGuard guard(device);
  cuda_fn();
}

}  // namespace

void add(const Tensor& a, const Tensor& b, Tensor& out) {
  same_layout(a, b, "add");
  same_layout(a, out, "add");
  floating(a, "add");
  dispatch(
      a.device(), [&] { cpu::add(a, b, out); }, [&] { cuda::add(a, b, out); });
}

void mul(const Tensor& a, const Tensor& b, Tensor& out) {
  same_layout(a, b, "mul");
  same_layout(a, out, "mul");
  floating(a, "mul");
  dispatch(
      a.device(), [&] { cpu::mul(a, b, out); }, [&] { cuda::mul(a, b, out); });
}

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  add(a, b, out);
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  mul(a, b, out);
  return out;
}

void axpy(double alpha, const Tensor& x, Tensor& y) {
  same_layout(x, y, "axpy");
  floating(x, "axpy");
  dispatch(
      x.device(), [&] { cpu::axpy(alpha, x, y); }, [&] { cuda::axpy(alpha, x, y); });
}

void scale(Tensor& x, double alpha) {
  KILN_CHECK(x.is_contiguous(), "scale: tensor must be contiguous");
  floating(x, "scale");
  dispatch(
      x.device(), [&] { cpu::scale(x, alpha); }, [&] { cuda::scale(x, alpha); });
}

void increment(Tensor& counter) {
  KILN_CHECK(counter.dtype() == DType::I64 && counter.numel() == 1,
             "increment: expected a one-element i64 counter, got " + counter.str());
  dispatch(
      counter.device(), [&] { cpu::increment(counter); }, [&] { cuda::increment(counter); });
}

const char* reduction_name(Reduction r) {
  switch (r) {
    case Reduction::Sum:
      return "sum";
    case Reduction::Max:
      return "max";
    case Reduction::Mean:
      return "mean";
    case Reduction::L2Norm:
      return "l2norm";
  }
  return "?";
}

namespace {

DType accumulation_dtype(DType t) {
  return t == DType::F64 ? DType::F64 : DType::F32;
}

Tensor reduce_impl(const Tensor& x, Reduction r, std::int64_t rows, std::int64_t cols,
                   bool over_rows, const Shape& out_shape) {
  floating(x, reduction_name(r));
  KILN_CHECK(x.is_contiguous(), "reductions need a contiguous tensor");
  KILN_CHECK(rows * cols > 0 || r != Reduction::Max, "max of an empty tensor");
  Tensor out = Tensor::empty(out_shape, accumulation_dtype(x.dtype()), x.device());
  dispatch(
      x.device(), [&] { cpu::reduce(x, r, rows, cols, over_rows, out); },
      [&] { cuda::reduce(x, r, rows, cols, over_rows, out); });
  return out;
}

}  // namespace

Tensor reduce(const Tensor& x, Reduction r) {
  return reduce_impl(x, r, 1, x.numel(), false, {});
}

Tensor reduce_rows(const Tensor& x, Reduction r) {
  KILN_CHECK(x.dim() >= 1, "reduce_rows of a scalar");
  std::int64_t cols = x.size(-1);
  std::int64_t rows = cols == 0 ? 0 : x.numel() / cols;
  return reduce_impl(x, r, rows, cols, false, {rows});
}

Tensor reduce_cols(const Tensor& x, Reduction r) {
  KILN_CHECK(x.dim() >= 1, "reduce_cols of a scalar");
  std::int64_t cols = x.size(-1);
  std::int64_t rows = cols == 0 ? 0 : x.numel() / cols;
  return reduce_impl(x, r, rows, cols, true, {cols});
}

namespace {

void check_gemm(bool ta, bool tb, const Tensor& a, const Tensor& b, const Tensor& c,
                std::int64_t dims) {
  same_device(a, b, "gemm");
  same_device(a, c, "gemm");
  KILN_CHECK(a.dim() == dims && b.dim() == dims && c.dim() == dims,
             "gemm: expected " + std::to_string(dims) + "-D operands, got " + a.str() + ", " +
                 b.str() + ", " + c.str());
  KILN_CHECK(a.dtype() == b.dtype(), "gemm: A is " + a.str() + " but B is " + b.str());
  KILN_CHECK(c.dtype() == a.dtype() || (is_half(a.dtype()) && c.dtype() == DType::F32),
             "gemm: C " + c.str() + " does not match A " + a.str());
  for (const Tensor* t : {&a, &b, &c}) {
    KILN_CHECK(t->stride(-1) == 1, "gemm: last dimension must have stride 1 in " + t->str());
    KILN_CHECK(t->size(-1) <= 1 || t->size(-2) <= 1 || t->stride(-2) >= t->size(-1),
               "gemm: overlapping rows in " + t->str());
  }
  std::int64_t m = ta ? a.size(-1) : a.size(-2), k = ta ? a.size(-2) : a.size(-1);
  std::int64_t kb = tb ? b.size(-1) : b.size(-2), n = tb ? b.size(-2) : b.size(-1);
  KILN_CHECK(k == kb && c.size(-2) == m && c.size(-1) == n,
             "gemm: shapes do not agree: " + a.str() + (ta ? "^T" : "") + " x " + b.str() +
                 (tb ? "^T" : "") + " -> " + c.str());
}

// 2 m n k per product of the batch: C's elements times the inner dimension.
double gemm_flops(bool ta, const Tensor& a, const Tensor& c) {
  return 2.0 * static_cast<double>(c.numel()) * static_cast<double>(ta ? a.size(-2) : a.size(-1));
}

}  // namespace

void gemm(bool ta, bool tb, double alpha, const Tensor& a, const Tensor& b, double beta,
          Tensor& c) {
  check_gemm(ta, tb, a, b, c, 2);
  floating(a, "gemm");
  GemmRecord record(gemm_flops(ta, a, c), false, a.device());
  dispatch(
      a.device(), [&] { cpu::gemm(ta, tb, alpha, a, b, beta, c, 1); },
      [&] { cuda::gemm(ta, tb, alpha, a, b, beta, c, 1); });
}

void gemm_batched(bool ta, bool tb, double alpha, const Tensor& a, const Tensor& b, double beta,
                  Tensor& c) {
  check_gemm(ta, tb, a, b, c, 3);
  floating(a, "gemm_batched");
  std::int64_t batch = c.size(0);
  KILN_CHECK((a.size(0) == batch || a.size(0) == 1) && (b.size(0) == batch || b.size(0) == 1),
             "gemm_batched: batch sizes " + a.str() + ", " + b.str() + ", " + c.str());
  GemmRecord record(gemm_flops(ta, a, c), false, a.device());
  dispatch(
      a.device(), [&] { cpu::gemm(ta, tb, alpha, a, b, beta, c, batch); },
      [&] { cuda::gemm(ta, tb, alpha, a, b, beta, c, batch); });
}

void accumulate(Tensor& grad, const Tensor& src) {
  KILN_CHECK(grad.numel() == src.numel(),
             "accumulate: gradient " + grad.str() + " and source " + src.str() + " differ");
  Tensor s = src.to(grad.device(), grad.dtype()).contiguous().view(grad.shape());
  axpy(1.0, s, grad);
}

void gemm_accumulate(bool trans_a, bool trans_b, const Tensor& a, const Tensor& b, Tensor& grad,
                     double alpha) {
  bool direct = grad.is_contiguous() &&
                (grad.dtype() == a.dtype() || (is_half(a.dtype()) && grad.dtype() == DType::F32));
  if (direct) {
    gemm(trans_a, trans_b, alpha, a, b, 1.0, grad);
    return;
  }
  DType wide = is_half(a.dtype()) ? DType::F32 : a.dtype();
  Tensor tmp = Tensor::empty(grad.shape(), wide, grad.device());
  gemm(trans_a, trans_b, alpha, a, b, 0.0, tmp);
  accumulate(grad, tmp);
}

void fill_uniform(Tensor& x, double low, double high, std::uint64_t seed, std::uint64_t offset) {
  KILN_CHECK(x.is_contiguous(), "fill_uniform needs a contiguous tensor");
  floating(x, "fill_uniform");
  dispatch(
      x.device(), [&] { cpu::fill_uniform(x, low, high, seed, offset); },
      [&] { cuda::fill_uniform(x, low, high, seed, offset); });
}

void fill_normal(Tensor& x, double mean, double stddev, std::uint64_t seed, std::uint64_t offset) {
  KILN_CHECK(x.is_contiguous(), "fill_normal needs a contiguous tensor");
  floating(x, "fill_normal");
  dispatch(
      x.device(), [&] { cpu::fill_normal(x, mean, stddev, seed, offset); },
      [&] { cuda::fill_normal(x, mean, stddev, seed, offset); });
}

}  // namespace kiln::ops
