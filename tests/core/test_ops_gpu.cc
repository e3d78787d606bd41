// Every core op on the GPU against the CPU, on fresh random inputs, with outputs poisoned first.

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>

#include "core/allocator.h"
#include "core/ops.h"
#include "core/stream.h"
#include "tests/gpu_test_util.h"

namespace kiln {
namespace {

using kiln::testing::fresh_seed;
using kiln::testing::kGpu;

Tensor random_cpu(const Shape& shape, DType dtype, std::uint64_t seed) {
  Tensor t = Tensor::empty(shape, DType::F32);
  ops::fill_uniform(t, -1.0, 1.0, seed);
  return t.to(dtype);
}

// |got - want| <= atol + rtol * |want| elementwise, rtol a multiple of the dtype's epsilon.
void expect_close(const Tensor& got, const Tensor& want, DType dtype, const std::string& what,
                  double factor = 4.0) {
  double eps = dtype == DType::F64   ? 2.2e-16
               : dtype == DType::F32 ? 1.2e-7
               : dtype == DType::F16 ? 9.8e-4
                                     : 7.8e-3;
  auto g = got.to_vector<double>(), w = want.to_vector<double>();
  ASSERT_EQ(g.size(), w.size()) << what;
  int bad = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    double tol = factor * eps * (1.0 + std::fabs(w[i]));
    if (!(std::fabs(g[i] - w[i]) <= tol)) {
      if (++bad < 5) ADD_FAILURE() << what << "[" << i << "]: gpu " << g[i] << " cpu " << w[i];
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

Tensor poisoned(const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype, kGpu);
  t.fill(NAN);
  return t;
}

class GpuOps : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_FAIL() << "no GPU visible: the gpu suite needs one";
  }
};

TEST_P(GpuOps, ElementwiseMatchesCpu) {
  DType dt = GetParam();
  std::uint64_t seed = fresh_seed();
  Tensor a = random_cpu({1000, 37}, dt, seed), b = random_cpu({1000, 37}, dt, seed + 1);
  Tensor ga = a.to(kGpu), gb = b.to(kGpu);
  Tensor out = poisoned(a.shape(), dt);
  ops::add(ga, gb, out);
  expect_close(out, ops::add(a, b), dt, "add");
  ops::mul(ga, gb, out);
  expect_close(out, ops::mul(a, b), dt, "mul");
  Tensor y = b.clone(), gy = gb.clone();
  ops::axpy(-0.75, a, y);
  ops::axpy(-0.75, ga, gy);
  expect_close(gy, y, dt, "axpy");
  ops::scale(y, 3.0);
  ops::scale(gy, 3.0);
  expect_close(gy, y, dt, "scale");
}

TEST_P(GpuOps, ReductionsMatchCpu) {
  DType dt = GetParam();
  std::uint64_t seed = fresh_seed();
  for (Shape shape : {Shape{3, 100001}, Shape{257, 129}, Shape{1, 7}}) {
    Tensor x = random_cpu(shape, dt, seed), gx = x.to(kGpu);
    for (auto r :
         {ops::Reduction::Sum, ops::Reduction::Max, ops::Reduction::Mean, ops::Reduction::L2Norm}) {
      std::string name = std::string(ops::reduction_name(r)) + shape_str(shape);
      expect_close(ops::reduce(gx, r), ops::reduce(x, r), DType::F32, name + " all", 2000);
      expect_close(ops::reduce_rows(gx, r), ops::reduce_rows(x, r), DType::F32, name + " rows",
                   200);
      expect_close(ops::reduce_cols(gx, r), ops::reduce_cols(x, r), DType::F32, name + " cols",
                   200);
    }
  }
}

TEST_P(GpuOps, GemmMatchesCpu) {
  DType dt = GetParam();
  std::uint64_t seed = fresh_seed();
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      int m = 67, n = 45, k = 129;
      Tensor a = random_cpu(ta ? Shape{k, m} : Shape{m, k}, dt, seed + 1);
      Tensor b = random_cpu(tb ? Shape{n, k} : Shape{k, n}, dt, seed + 2);
      DType cdt = is_half(dt) ? DType::F32 : dt;
      Tensor c = random_cpu({m, n}, cdt, seed + 3);
      Tensor gc = c.to(kGpu);
      ops::gemm(ta, tb, 1.25, a, b, -0.5, c);
      ops::gemm(ta, tb, 1.25, a.to(kGpu), b.to(kGpu), -0.5, gc);
      expect_close(gc, c, DType::F32, "gemm", 200);
      if (is_half(dt)) {  // half output too
        Tensor ch = Tensor::zeros({m, n}, dt, kGpu);
        ops::gemm(ta, tb, 1.0, a.to(kGpu), b.to(kGpu), 0.0, ch);
        Tensor ref = Tensor::zeros({m, n}, DType::F32);
        ops::gemm(ta, tb, 1.0, a, b, 0.0, ref);
        expect_close(ch, ref.to(dt), dt, "gemm half out", 4);
      }
    }
  }
  Tensor a = random_cpu({4, 16, 32}, dt, seed + 4), b = random_cpu({4, 32, 8}, dt, seed + 5);
  DType cdt = is_half(dt) ? DType::F32 : dt;
  Tensor c = Tensor::zeros({4, 16, 8}, cdt), gc = poisoned({4, 16, 8}, cdt);
  ops::gemm_batched(false, false, 1.0, a, b, 0.0, c);
  ops::gemm_batched(false, false, 1.0, a.to(kGpu), b.to(kGpu), 0.0, gc);
  expect_close(gc, c, DType::F32, "gemm_batched", 200);
}

TEST_P(GpuOps, CopiesCastsAndViews) {
  DType dt = GetParam();
  Tensor a = random_cpu({6, 5, 4}, DType::F32, fresh_seed());
  Tensor ga = a.to(kGpu);
  Tensor want = a.permute({2, 0, 1}).contiguous().to(dt);
  Tensor got = poisoned({4, 6, 5}, dt);
  got.copy_from(ga.permute({2, 0, 1}));
  expect_close(got, want, dt, "strided cast copy", 0);
  // A strided GPU view copied to the host.
  Tensor host = ga.slice(1, 1, 4).to(Device::cpu());
  EXPECT_EQ(host.to_vector<float>(), a.slice(1, 1, 4).contiguous().to_vector<float>());
}

TEST_P(GpuOps, RandomMatchesCpuExactly) {
  DType dt = GetParam();
  std::uint64_t seed = fresh_seed();
  Tensor c = Tensor::empty({100003}, dt), g = poisoned({100003}, dt);
  ops::fill_normal(c, 0.5, 2.0, seed, 17);
  ops::fill_normal(g, 0.5, 2.0, seed, 17);
  expect_close(g, c, dt, "normal", 2);  // same Philox words; libm and libdevice may differ by 1 ulp
  ops::fill_uniform(c, -3, 5, seed, 3);
  ops::fill_uniform(g, -3, 5, seed, 3);
  EXPECT_EQ(g.to_vector<double>(), c.to_vector<double>());
}

INSTANTIATE_TEST_SUITE_P(AllFloating, GpuOps,
                         ::testing::Values(DType::F32, DType::F64, DType::F16, DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(GpuAllocator, OutOfMemoryIsRecoverable) {
  if (cuda_device_count() == 0) GTEST_FAIL() << "no GPU visible";
  CachingAllocator& gpu = cuda_allocator(0);
  std::size_t total = 1ull << 40;  // 1 TiB: more than any GPU
  try {
    Tensor t = Tensor::empty({static_cast<std::int64_t>(total / 4)}, DType::F32, kGpu);
    FAIL() << "expected out of memory";
  } catch (const OutOfMemoryError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("CUDA device 0 out of memory allocating 1.0 TiB"), std::string::npos) << m;
    EXPECT_NE(m.find("total"), std::string::npos) << m;
  }
  Tensor ok = Tensor::empty({1 << 20}, DType::F32, kGpu);
  ok.fill(1.0);
  EXPECT_EQ(ops::reduce(ok, ops::Reduction::Sum).item(), 1 << 20);
  AllocatorStats s = gpu.stats();
  EXPECT_GE(s.out_of_memory, 1u);
  EXPECT_GT(s.reserved_bytes, 0u);
}

TEST(GpuAllocator, MemoryLimitEmulatesASmallerGpu) {
  if (cuda_device_count() == 0) GTEST_FAIL() << "no GPU visible";
  CachingAllocator& gpu = cuda_allocator(0);
  gpu.empty_cache();
  gpu.set_memory_limit(gpu.stats().reserved_bytes + (64u << 20));
  EXPECT_THROW(Tensor::empty({32 << 20}, DType::F32, kGpu), OutOfMemoryError);  // 128 MiB
  gpu.set_memory_limit(0);
}

TEST(GpuStreams, OpsRunOnTheCurrentStream) {
  if (cuda_device_count() == 0) GTEST_FAIL() << "no GPU visible";
  Stream s = Stream::create(kGpu);
  Tensor x = Tensor::empty({1 << 22}, DType::F32, kGpu);
  Event start(kGpu, true), end(kGpu, true);
  {
    StreamGuard guard(kGpu, s.handle());
    start.record(s.handle());
    x.fill(2.0);
    ops::scale(x, 0.5);
    end.record(s.handle());
  }
  end.synchronize();
  EXPECT_GE(start.elapsed_ms(end), 0.0f);
  EXPECT_EQ(ops::reduce(x, ops::Reduction::Max).item(), 1.0);
}

TEST(GpuStreams, IncrementRunsOnTheCurrentStream) {
  if (cuda_device_count() == 0) GTEST_FAIL() << "no GPU visible";
  // On a side stream, as a captured graph runs it: the counter never visits the host in between.
  Stream s = Stream::create(kGpu);
  Tensor counter = Tensor::from_vector<std::int64_t>({(std::int64_t{1} << 40) - 2}, {1}).to(kGpu);
  {
    StreamGuard guard(kGpu, s.handle());
    for (int i = 0; i < 5; ++i) ops::increment(counter);
  }
  s.synchronize();
  EXPECT_EQ(counter.to(Device::cpu()).to_vector<std::int64_t>(),
            std::vector<std::int64_t>{(std::int64_t{1} << 40) + 3});
  Tensor wrong = Tensor::zeros({1}, DType::I32, kGpu);
  EXPECT_THROW(ops::increment(wrong), Error);
}

}  // namespace
}  // namespace kiln
