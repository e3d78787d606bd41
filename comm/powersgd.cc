#include "comm/powersgd.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/ops.h"
#include "core/stream.h"

namespace kiln {
namespace {

// PyTorch's _should_compress with min_compression_rate 2.
bool worth_compressing(std::int64_t n, std::int64_t m, int rank) {
  const std::int64_t r = std::min<std::int64_t>({rank, n, m});
  return (n + m) * r * 2 < n * m;
}

bool is_matrix(const Tensor& grad) {
  return grad.dim() >= 2;
}

std::int64_t rows_of(const Tensor& grad) {
  return grad.size(0);
}

template <typename T>
void orthogonalize_columns_cpu(T* a, std::int64_t rows, std::int64_t cols) {
  for (std::int64_t i = 0; i < cols; ++i) {
    double sumsq = 0;
    for (std::int64_t k = 0; k < rows; ++k)
      sumsq += static_cast<double>(a[k * cols + i]) * a[k * cols + i];
    const double norm = std::sqrt(sumsq);
    const double inv = norm > 0 ? 1.0 / norm : 0.0;
    for (std::int64_t k = 0; k < rows; ++k) a[k * cols + i] = static_cast<T>(a[k * cols + i] * inv);
    for (std::int64_t j = i + 1; j < cols; ++j) {
      double dot = 0;
      for (std::int64_t k = 0; k < rows; ++k)
        dot += static_cast<double>(a[k * cols + i]) * a[k * cols + j];
      for (std::int64_t k = 0; k < rows; ++k) {
        a[k * cols + j] = static_cast<T>(a[k * cols + j] - dot * a[k * cols + i]);
      }
    }
  }
}

}  // namespace

void orthogonalize_columns(Tensor& matrix) {
  KILN_CHECK(matrix.dim() == 2 && matrix.is_contiguous(),
             "orthogonalize_columns needs a contiguous matrix, got " + matrix.str());
  KILN_CHECK(matrix.dtype() == DType::F32 || matrix.dtype() == DType::F64,
             "orthogonalize_columns needs f32 or f64, got " + matrix.str());
  const std::int64_t rows = matrix.size(0);
  const std::int64_t cols = matrix.size(1);
  if (matrix.numel() == 0) return;
  if (matrix.device().is_cuda()) {
#if KILN_WITH_CUDA
    detail::cuda_orthogonalize_columns(matrix.data(), matrix.dtype(), rows, cols,
                                       current_stream(matrix.device()));
    return;
#else
    throw Error("orthogonalize_columns on " + matrix.str() + " in a build without CUDA");
#endif
  }
  if (matrix.dtype() == DType::F32) {
    orthogonalize_columns_cpu(matrix.data<float>(), rows, cols);
  } else {
    orthogonalize_columns_cpu(matrix.data<double>(), rows, cols);
  }
}

bool PowerSgdBucket::compresses_any(const std::vector<Tensor>& grads, int rank) {
  for (const Tensor& g : grads) {
    if (!is_matrix(g)) continue;
    if (worth_compressing(rows_of(g), g.numel() / rows_of(g), rank)) return true;
  }
  return false;
}

PowerSgdBucket::PowerSgdBucket(std::vector<Tensor> grads, PowerSgdOptions options)
    : options_(options) {
  KILN_CHECK(options_.rank >= 1,
             "PowerSGD rank must be at least 1, got " + std::to_string(options_.rank));
  KILN_CHECK(!grads.empty(), "PowerSgdBucket got no gradients");
  const DType dtype = grads.front().dtype();
  const Device device = grads.front().device();
  KILN_CHECK(is_floating(dtype),
             std::string("PowerSGD compresses floating-point gradients, got ") + dtype_name(dtype));
  // Half gradients are compressed in f32 (as cuBLAS computes half GEMMs), through a copy.
  const DType compute = is_half(dtype) ? DType::F32 : dtype;
  std::int64_t error_numel = 0, p_numel = 0, q_numel = 0, rest_numel = 0;
  struct Shape2 {
    std::int64_t n, m, r;
  };
  std::vector<Shape2> shapes;
  std::vector<Tensor> compressed;
  for (Tensor& g : grads) {
    KILN_CHECK(g.dtype() == dtype && g.device() == device && g.is_contiguous(),
               "PowerSgdBucket: gradients of one bucket must be contiguous, of one dtype and "
               "device; got " +
                   g.str());
    const std::int64_t n = is_matrix(g) ? rows_of(g) : 0;
    const std::int64_t m = n > 0 ? g.numel() / n : 0;
    if (n > 0 && worth_compressing(n, m, options_.rank)) {
      const std::int64_t r = std::min<std::int64_t>({options_.rank, n, m});
      shapes.push_back({n, m, r});
      compressed.push_back(g.view({n, m}));
      error_numel += n * m;
      p_numel += n * r;
      q_numel += m * r;
    } else {
      uncompressed_.push_back(g);
      rest_numel += g.numel();
    }
  }
  KILN_CHECK(!compressed.empty(), "PowerSgdBucket: no gradient of the bucket is worth compressing");
  error_ = Tensor::zeros({error_numel}, compute, device);
  p_ = Tensor::zeros({p_numel}, compute, device);
  q_ = Tensor::zeros({q_numel}, compute, device);
  if (compute != dtype) work_ = Tensor::zeros({error_numel}, compute, device);
  if (rest_numel > 0) rest_ = Tensor::zeros({rest_numel}, dtype, device);
  std::int64_t e = 0, p = 0, q = 0;
  for (std::size_t i = 0; i < compressed.size(); ++i) {
    const Shape2 s = shapes[i];
    Matrix mat;
    mat.grad = compressed[i];
    mat.m = work_.defined() ? work_.slice(0, e, e + s.n * s.m).view({s.n, s.m}) : mat.grad;
    mat.error = error_.slice(0, e, e + s.n * s.m).view({s.n, s.m});
    mat.p = p_.slice(0, p, p + s.n * s.r).view({s.n, s.r});
    mat.q = q_.slice(0, q, q + s.m * s.r).view({s.m, s.r});
    e += s.n * s.m;
    p += s.n * s.r;
    q += s.m * s.r;
    matrices_.push_back(std::move(mat));
  }
  initialise_q();
}

void PowerSgdBucket::initialise_q() {
  // One draw over the bucket's Qs, then each Q orthonormalised (as PyTorch does before use).
  ops::fill_normal(q_, 0.0, 1.0, options_.seed);
  for (Matrix& mat : matrices_) orthogonalize_columns(mat.q);
}

void PowerSgdBucket::reset() {
  error_.zero();
  initialise_q();
}

void PowerSgdBucket::all_reduce(Communicator& comm) {
  if (rest_.defined()) {
    std::int64_t at = 0;
    for (const Tensor& g : uncompressed_) {
      Tensor slice = rest_.slice(0, at, at + g.numel());
      slice.copy_from(g.view({-1}));
      at += g.numel();
    }
    comm.all_reduce_on_comm_stream(rest_, ReduceOp::Average);
    at = 0;
    for (Tensor& g : uncompressed_) {
      Tensor view = g.view({-1});
      view.copy_from(rest_.slice(0, at, at + g.numel()));
      at += g.numel();
    }
  }
  for (Matrix& mat : matrices_) {
    if (work_.defined()) mat.m.copy_from(mat.grad);
    ops::add(mat.m, mat.error, mat.m);                       // M += e
    ops::gemm(false, false, 1.0, mat.m, mat.q, 0.0, mat.p);  // P = M Q
  }
  // The sum, not the mean: orthonormalisation removes the scale.
  comm.all_reduce_on_comm_stream(p_, ReduceOp::Sum);
  for (Matrix& mat : matrices_) {
    orthogonalize_columns(mat.p);
    ops::gemm(true, false, 1.0, mat.m, mat.p, 0.0, mat.q);  // Q = Mᵀ P
  }
  comm.all_reduce_on_comm_stream(q_, ReduceOp::Average);
  for (Matrix& mat : matrices_) {
    mat.error.copy_from(mat.m);
    ops::gemm(false, true, 1.0, mat.p, mat.q, 0.0, mat.m);  // M = P Qᵀ
    ops::axpy(-1.0, mat.m, mat.error);                      // e = M - P Qᵀ
    if (work_.defined()) mat.grad.copy_from(mat.m);
  }
}

NamedTensors PowerSgdBucket::state() const {
  return {{"error", error_}, {"q", q_}};
}

void PowerSgdBucket::load_state(const Tensor& error, const Tensor& q, const std::string& where) {
  if (error.numel() != error_.numel() || q.numel() != q_.numel()) {
    throw InputError(where + ": PowerSGD state of " + std::to_string(error.numel()) + " + " +
                     std::to_string(q.numel()) + " elements, the bucket has " +
                     std::to_string(error_.numel()) + " + " + std::to_string(q_.numel()) +
                     " (another model or parallel.powersgd_rank)");
  }
  error_.copy_from(error.reshape({-1}));
  q_.copy_from(q.reshape({-1}));
}

}  // namespace kiln
