#pragma once
// Shared by the GPU test suites: the device, fresh seeds for every run, the dtype epsilons of
// the tolerance rule (absolute + relative x epsilon) and the comparison that applies it, the
// precision settings layers are compared in, and NaN-poisoning of the caching allocator's free
// blocks, so that a layer output left unwritten shows up as NaN.

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "core/stream.h"
#include "core/tensor.h"

namespace kiln::testing {

inline const Device kGpu = Device::cuda(0);

inline std::uint64_t fresh_seed() {
  return static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
}

inline double eps_of(DType t) {
  switch (t) {
    case DType::F64:
      return 2.2e-16;
    case DType::F32:
      return 1.2e-7;
    case DType::F16:
      return 9.8e-4;
    default:
      return 7.8e-3;
  }
}

// Fills the GPU caching allocator's free blocks with NaN: layer outputs allocated next reuse them.
inline void poison_gpu_cache() {
  for (std::int64_t n : {1 << 10, 1 << 14, 1 << 18, 1 << 22}) {
    std::vector<Tensor> blocks;
    for (int i = 0; i < 4; ++i) {
      blocks.push_back(Tensor::full({n}, NAN, DType::F32, kGpu));
      blocks.push_back(Tensor::full({n / 2 + 3}, NAN, DType::F16, kGpu));
    }
  }
  device_synchronize(kGpu);
}

// One precision setting of a layer comparison: parameter storage, tensors between layers, GEMM
// and convolution inputs.
struct Precision {
  const char* name;
  DType parameters, activation, matmul;
};

// The tolerance's dtype: the least precise storage a value passed through.
inline DType worst(const Precision& p) {
  if (p.matmul == DType::BF16 || p.activation == DType::BF16) return DType::BF16;
  if (p.matmul == DType::F16 || p.activation == DType::F16) return DType::F16;
  return DType::F32;
}

// |gpu - cpu| <= factor * eps(dtype) * (max|cpu| + |cpu|) for every element (NaN fails). A failing
// comparison writes both tensors to <file_prefix><what>.txt in the working directory.
inline void expect_close(const Tensor& gpu, const Tensor& cpu, DType dtype, const std::string& what,
                         double factor, const std::string& file_prefix) {
  ASSERT_TRUE(gpu.device().is_cuda()) << what << " is not on the GPU: " << gpu.str();
  ASSERT_EQ(gpu.shape(), cpu.shape()) << what;
  std::vector<double> g = gpu.to_vector<double>(), c = cpu.to_vector<double>();
  double max_ref = 0;
  for (double v : c) max_ref = std::max(max_ref, std::fabs(v));
  EXPECT_GT(max_ref, 0.0) << what << ": the reference is all zeros, the test proves nothing";
  const double eps = eps_of(dtype);
  int bad = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    double tol = factor * eps * (max_ref + std::fabs(c[i]));
    if (!(std::fabs(g[i] - c[i]) <= tol)) {  // also catches NaN
      if (++bad <= 5) ADD_FAILURE() << what << "[" << i << "]: gpu " << g[i] << " cpu " << c[i];
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << g.size() << " elements differ";
  if (bad > 0) {
    std::string file = file_prefix + what + ".txt";
    for (char& ch : file) {
      if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '_' && ch != '-' && ch != '.') {
        ch = '_';
      }
    }
    std::ofstream out(file);
    out << "# index gpu cpu\n";
    for (std::size_t i = 0; i < g.size(); ++i) out << i << " " << g[i] << " " << c[i] << "\n";
  }
}

}  // namespace kiln::testing
