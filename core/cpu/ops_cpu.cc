// CPU implementations of the core ops: plain loops, OpenBLAS for GEMM.

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "core/backend.h"
#include "core/cpu/element.h"
#include "core/random.h"

namespace kiln::cpu {
namespace {

// Visits every element of `shape` in row-major order, tracking two strided offsets.
template <typename Fn>
void for_each_strided(const Shape& shape, const Shape& s1, const Shape& s2, Fn fn) {
  std::int64_t n = shape_numel(shape);
  if (n == 0) return;
  std::size_t dims = shape.size();
  std::vector<std::int64_t> index(dims, 0);
  std::int64_t o1 = 0, o2 = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    fn(o1, o2);
    for (std::size_t d = dims; d-- > 0;) {
      if (++index[d] < shape[d]) {
        o1 += s1[d];
        o2 += s2[d];
        break;
      }
      o1 -= s1[d] * (shape[d] - 1);
      o2 -= s2[d] * (shape[d] - 1);
      index[d] = 0;
    }
  }
}

template <typename S, typename D>
void copy_typed(const Tensor& src, Tensor& dst) {
  const S* s = static_cast<const S*>(src.data());
  D* d = static_cast<D*>(dst.data());
  if (src.is_contiguous() && dst.is_contiguous()) {
    std::int64_t n = src.numel();
    for (std::int64_t i = 0; i < n; ++i) d[i] = store<D>(load(s[i]));
    return;
  }
  for_each_strided(dst.shape(), src.strides(), dst.strides(),
                   [&](std::int64_t os, std::int64_t od) { d[od] = store<D>(load(s[os])); });
}

}  // namespace

void copy(const Tensor& src, Tensor& dst) {
  if (src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous()) {
    if (src.data() != dst.data()) std::memmove(dst.data(), src.data(), src.nbytes());
    return;
  }
  KILN_DISPATCH_ALL(src.dtype(), S, KILN_DISPATCH_ALL(dst.dtype(), D, copy_typed<S, D>(src, dst)));
}

void fill(Tensor& x, double value) {
  KILN_DISPATCH_ALL(x.dtype(), T, {
    T v = store<T>(value);
    std::fill_n(static_cast<T*>(x.data()), x.numel(), v);
  });
}

void add(const Tensor& a, const Tensor& b, Tensor& out) {
  KILN_DISPATCH_FLOATING(a.dtype(), T, {
    const T* pa = static_cast<const T*>(a.data());
    const T* pb = static_cast<const T*>(b.data());
    T* po = static_cast<T*>(out.data());
    for (std::int64_t i = 0, n = a.numel(); i < n; ++i) po[i] = store<T>(load(pa[i]) + load(pb[i]));
  });
}

void mul(const Tensor& a, const Tensor& b, Tensor& out) {
  KILN_DISPATCH_FLOATING(a.dtype(), T, {
    const T* pa = static_cast<const T*>(a.data());
    const T* pb = static_cast<const T*>(b.data());
    T* po = static_cast<T*>(out.data());
    for (std::int64_t i = 0, n = a.numel(); i < n; ++i) po[i] = store<T>(load(pa[i]) * load(pb[i]));
  });
}

void axpy(double alpha, const Tensor& x, Tensor& y) {
  KILN_DISPATCH_FLOATING(x.dtype(), T, {
    using C = typename Compute<T>::type;
    const T* px = static_cast<const T*>(x.data());
    T* py = static_cast<T*>(y.data());
    C a = static_cast<C>(alpha);
    for (std::int64_t i = 0, n = x.numel(); i < n; ++i)
      py[i] = store<T>(load(py[i]) + a * load(px[i]));
  });
}

void scale(Tensor& x, double alpha) {
  KILN_DISPATCH_FLOATING(x.dtype(), T, {
    using C = typename Compute<T>::type;
    T* p = static_cast<T*>(x.data());
    C a = static_cast<C>(alpha);
    for (std::int64_t i = 0, n = x.numel(); i < n; ++i) p[i] = store<T>(a * load(p[i]));
  });
}

void increment(Tensor& counter) {
  *static_cast<std::int64_t*>(counter.data()) += 1;
}

void reduce(const Tensor& x, ops::Reduction r, std::int64_t rows, std::int64_t cols, bool over_rows,
            Tensor& out) {
  KILN_DISPATCH_FLOATING(x.dtype(), T, {
    using C = typename Compute<T>::type;
    using A = double;  // accumulate in double: the CPU result is the reference for the GPU's
    const T* p = static_cast<const T*>(x.data());
    std::int64_t outputs = over_rows ? cols : rows;
    std::int64_t count = over_rows ? rows : cols;
    std::vector<A> acc(outputs,
                       r == ops::Reduction::Max ? -std::numeric_limits<A>::infinity() : A(0));
    for (std::int64_t i = 0; i < rows; ++i) {
      for (std::int64_t j = 0; j < cols; ++j) {
        A v = load(p[i * cols + j]);
        A& a = acc[over_rows ? j : i];
        switch (r) {
          case ops::Reduction::Sum:
          case ops::Reduction::Mean:
            a += v;
            break;
          case ops::Reduction::Max:
            a = (v > a || std::isnan(v)) ? v : a;
            break;
          case ops::Reduction::L2Norm:
            a += v * v;
            break;
        }
      }
    }
    C* po = static_cast<C*>(out.data());
    for (std::int64_t k = 0; k < outputs; ++k) {
      A v = acc[k];
      if (r == ops::Reduction::Mean) v = count > 0 ? v / static_cast<A>(count) : A(0);
      if (r == ops::Reduction::L2Norm) v = std::sqrt(v);
      po[k] = static_cast<C>(v);
    }
  });
}

namespace {

// Half GEMM on the CPU: widen to f32, multiply with fp32 accumulation, narrow the result.
void gemm_via_f32(bool ta, bool tb, double alpha, const Tensor& a, const Tensor& b, double beta,
                  Tensor& c, std::int64_t batch) {
  Tensor a32 = a.to(DType::F32).contiguous(), b32 = b.to(DType::F32).contiguous();
  Tensor c32 = c.to(DType::F32).contiguous();
  if (c32.data() == c.data()) c32 = c.clone();
  gemm(ta, tb, alpha, a32, b32, beta, c32, batch);
  c.copy_from(c32);
}

}  // namespace

void gemm(bool ta, bool tb, double alpha, const Tensor& a, const Tensor& b, double beta, Tensor& c,
          std::int64_t batch) {
  if (is_half(a.dtype())) {
    gemm_via_f32(ta, tb, alpha, a, b, beta, c, batch);
    return;
  }
  std::int64_t m = c.size(-2), n = c.size(-1), k = ta ? a.size(-2) : a.size(-1);
  int lda = static_cast<int>(std::max<std::int64_t>(a.size(-1) > 1 ? a.stride(-2) : a.size(-1), 1));
  int ldb = static_cast<int>(std::max<std::int64_t>(b.size(-1) > 1 ? b.stride(-2) : b.size(-1), 1));
  int ldc = static_cast<int>(std::max<std::int64_t>(c.size(-1) > 1 ? c.stride(-2) : c.size(-1), 1));
  lda = std::max<int>(lda, static_cast<int>(a.size(-1)));
  ldb = std::max<int>(ldb, static_cast<int>(b.size(-1)));
  ldc = std::max<int>(ldc, static_cast<int>(c.size(-1)));
  std::int64_t sa = (batch > 1 && a.dim() == 3 && a.size(0) > 1) ? a.stride(0) : 0;
  std::int64_t sb = (batch > 1 && b.dim() == 3 && b.size(0) > 1) ? b.stride(0) : 0;
  std::int64_t sc = batch > 1 ? c.stride(0) : 0;
  CBLAS_TRANSPOSE opa = ta ? CblasTrans : CblasNoTrans, opb = tb ? CblasTrans : CblasNoTrans;
  if (m == 0 || n == 0) return;
  for (std::int64_t i = 0; i < batch; ++i) {
    if (a.dtype() == DType::F64) {
      cblas_dgemm(CblasRowMajor, opa, opb, static_cast<int>(m), static_cast<int>(n),
                  static_cast<int>(k), alpha, static_cast<const double*>(a.data()) + i * sa, lda,
                  static_cast<const double*>(b.data()) + i * sb, ldb, beta,
                  static_cast<double*>(c.data()) + i * sc, ldc);
    } else {
      cblas_sgemm(CblasRowMajor, opa, opb, static_cast<int>(m), static_cast<int>(n),
                  static_cast<int>(k), static_cast<float>(alpha),
                  static_cast<const float*>(a.data()) + i * sa, lda,
                  static_cast<const float*>(b.data()) + i * sb, ldb, static_cast<float>(beta),
                  static_cast<float*>(c.data()) + i * sc, ldc);
    }
  }
}

namespace {

// fn(begin, end) over [0, n) in contiguous chunks on the machine's cores. Element i's value
// depends on i alone (counter-based RNG), so the result does not depend on the split: GPT-2
// XL's 1.5 billion initial weights in seconds instead of a minute.
template <typename Fn>
void for_chunks(std::int64_t n, Fn fn) {
  constexpr std::int64_t kMinChunk = std::int64_t{1} << 20;
  const std::int64_t cores = std::max<std::int64_t>(1, std::thread::hardware_concurrency());
  const std::int64_t parts = std::min(cores, std::max<std::int64_t>(1, n / kMinChunk));
  if (parts <= 1) {
    fn(std::int64_t{0}, n);
    return;
  }
  const std::int64_t chunk = (n + parts - 1) / parts;
  std::vector<std::thread> threads;
  for (std::int64_t begin = chunk; begin < n; begin += chunk) {
    threads.emplace_back(fn, begin, std::min(n, begin + chunk));
  }
  fn(std::int64_t{0}, std::min(n, chunk));
  for (std::thread& t : threads) t.join();
}

}  // namespace

void fill_uniform(Tensor& x, double low, double high, std::uint64_t seed, std::uint64_t offset) {
  KILN_DISPATCH_FLOATING(x.dtype(), T, {
    T* p = static_cast<T*>(x.data());
    const bool wide = x.dtype() == DType::F64;
    for_chunks(x.numel(), [=](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) {
        double u = philox_uniform(philox_word(seed, offset, static_cast<std::uint64_t>(i)));
        p[i] = store<T>(wide ? low + (high - low) * u : static_cast<float>(low + (high - low) * u));
      }
    });
  });
}

void fill_normal(Tensor& x, double mean, double stddev, std::uint64_t seed, std::uint64_t offset) {
  KILN_DISPATCH_FLOATING(x.dtype(), T, {
    T* p = static_cast<T*>(x.data());
    const bool wide = x.dtype() == DType::F64;
    for_chunks(x.numel(), [=](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) {
        double v = mean + stddev * philox_normal(seed, offset, static_cast<std::uint64_t>(i));
        p[i] = store<T>(wide ? v : static_cast<float>(v));
      }
    });
  });
}

}  // namespace kiln::cpu
