#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "core/ops.h"
#include "core/random.h"

namespace kiln {
namespace {

Tensor random_tensor(const Shape& shape, DType dtype, std::uint64_t seed) {
  Tensor t = Tensor::empty(shape, DType::F64);
  ops::fill_uniform(t, -1.0, 1.0, seed);
  return t.to(dtype);
}

class OpsByDtype : public ::testing::TestWithParam<DType> {};

double tolerance(DType t) {
  switch (t) {
    case DType::F64:
      return 1e-12;
    case DType::F32:
      return 1e-5;
    case DType::F16:
      return 2e-3;
    default:
      return 1.6e-2;
  }
}

TEST_P(OpsByDtype, ElementwiseMatchesLoops) {
  DType dt = GetParam();
  Tensor a = random_tensor({7, 13}, dt, 1), b = random_tensor({7, 13}, dt, 2);
  auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  auto sum = ops::add(a, b).to_vector<double>();
  auto prod = ops::mul(a, b).to_vector<double>();
  Tensor y = b.clone();
  ops::axpy(0.5, a, y);
  auto vy = y.to_vector<double>();
  Tensor s = a.clone();
  ops::scale(s, -3.0);
  auto vs = s.to_vector<double>();
  double tol = tolerance(dt);
  for (std::size_t i = 0; i < va.size(); ++i) {
    EXPECT_NEAR(sum[i], va[i] + vb[i], tol * 2);
    EXPECT_NEAR(prod[i], va[i] * vb[i], tol * 2);
    EXPECT_NEAR(vy[i], vb[i] + 0.5 * va[i], tol * 2);
    EXPECT_NEAR(vs[i], -3.0 * va[i], tol * 4);
  }
}

TEST_P(OpsByDtype, ReductionsMatchLoops) {
  DType dt = GetParam();
  Tensor x = random_tensor({5, 37}, dt, 3);
  auto v = x.to_vector<double>();
  double sum = 0, mx = -1e300, sq = 0;
  std::vector<double> row_sum(5, 0), col_sum(37, 0), row_max(5, -1e300);
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 37; ++j) {
      double e = v[i * 37 + j];
      sum += e, sq += e * e, mx = std::max(mx, e);
      row_sum[i] += e, col_sum[j] += e, row_max[i] = std::max(row_max[i], e);
    }
  double tol = dt == DType::F64 ? 1e-12 : 1e-4;
  EXPECT_NEAR(ops::reduce(x, ops::Reduction::Sum).item(), sum, tol);
  EXPECT_NEAR(ops::reduce(x, ops::Reduction::Mean).item(), sum / v.size(), tol);
  EXPECT_NEAR(ops::reduce(x, ops::Reduction::Max).item(), mx, tol);
  EXPECT_NEAR(ops::reduce(x, ops::Reduction::L2Norm).item(), std::sqrt(sq), tol);
  EXPECT_EQ(ops::reduce(x, ops::Reduction::Sum).dtype(),
            dt == DType::F64 ? DType::F64 : DType::F32);
  auto rs = ops::reduce_rows(x, ops::Reduction::Sum).to_vector<double>();
  auto rm = ops::reduce_rows(x, ops::Reduction::Max).to_vector<double>();
  auto cs = ops::reduce_cols(x, ops::Reduction::Sum).to_vector<double>();
  ASSERT_EQ(rs.size(), 5u);
  ASSERT_EQ(cs.size(), 37u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_NEAR(rs[i], row_sum[i], tol);
    EXPECT_NEAR(rm[i], row_max[i], tol);
  }
  for (int j = 0; j < 37; ++j) EXPECT_NEAR(cs[j], col_sum[j], tol);
}

TEST_P(OpsByDtype, GemmMatchesLoopsForEveryTranspose) {
  DType dt = GetParam();
  const int m = 5, n = 7, k = 9;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      Tensor a = random_tensor(ta ? Shape{k, m} : Shape{m, k}, dt, 10 + ta);
      Tensor b = random_tensor(tb ? Shape{n, k} : Shape{k, n}, dt, 20 + tb);
      Tensor c = random_tensor({m, n}, is_half(dt) ? DType::F32 : dt, 30);
      auto va = a.to_vector<double>(), vb = b.to_vector<double>(), vc = c.to_vector<double>();
      ops::gemm(ta, tb, 1.5, a, b, 0.5, c);
      auto out = c.to_vector<double>();
      for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j) {
          double acc = 0;
          for (int p = 0; p < k; ++p)
            acc += (ta ? va[p * m + i] : va[i * k + p]) * (tb ? vb[j * k + p] : vb[p * n + j]);
          EXPECT_NEAR(out[i * n + j], 1.5 * acc + 0.5 * vc[i * n + j],
                      dt == DType::F64 ? 1e-12 : 1e-4)
              << "ta=" << ta << " tb=" << tb;
        }
    }
  }
}

TEST_P(OpsByDtype, BatchedGemmAndBroadcast) {
  DType dt = GetParam();
  Tensor a = random_tensor({3, 4, 6}, dt, 40), b = random_tensor({1, 6, 5}, dt, 41);
  Tensor c = Tensor::zeros({3, 4, 5}, dt);
  ops::gemm_batched(false, false, 1.0, a, b, 0.0, c);
  for (int i = 0; i < 3; ++i) {
    Tensor ci = Tensor::zeros({4, 5}, dt);
    ops::gemm(false, false, 1.0, a.select(0, i), b.select(0, 0), 0.0, ci);
    auto want = ci.to_vector<double>(), got = c.select(0, i).contiguous().to_vector<double>();
    for (std::size_t e = 0; e < want.size(); ++e) EXPECT_NEAR(got[e], want[e], 1e-12);
  }
}

INSTANTIATE_TEST_SUITE_P(AllFloating, OpsByDtype,
                         ::testing::Values(DType::F32, DType::F64, DType::F16, DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(Ops, GemmOnStridedRowsOfALargerMatrix) {
  Tensor big = random_tensor({6, 10}, DType::F64, 50);
  Tensor a = big.slice(1, 0, 4);  // (6, 4) with row stride 10
  Tensor b = random_tensor({4, 3}, DType::F64, 51);
  Tensor c = Tensor::zeros({6, 3}, DType::F64);
  ops::gemm(false, false, 1.0, a, b, 0.0, c);
  Tensor c2 = Tensor::zeros({6, 3}, DType::F64);
  ops::gemm(false, false, 1.0, a.contiguous(), b, 0.0, c2);
  EXPECT_EQ(c.to_vector<double>(), c2.to_vector<double>());
}

TEST(Ops, ShapeMismatchesAreReported) {
  Tensor a = Tensor::zeros({2, 3}, DType::F32), b = Tensor::zeros({3, 2}, DType::F32);
  EXPECT_THROW(ops::add(a, b), Error);
  Tensor c = Tensor::zeros({2, 2}, DType::F32);
  EXPECT_THROW(ops::gemm(false, false, 1, a, a, 0, c), Error);
  Tensor i = Tensor::zeros({3}, DType::I32);
  EXPECT_THROW(ops::scale(i, 2.0), Error);
}

TEST(Ops, IncrementAddsOneToAnI64Counter) {
  Tensor counter = Tensor::from_vector<std::int64_t>({41}, {1});
  ops::increment(counter);
  ops::increment(counter);
  EXPECT_EQ(counter.to_vector<std::int64_t>(), std::vector<std::int64_t>{43});
  // A one-element view of a larger tensor: only that element moves.
  Tensor steps = Tensor::from_vector<std::int64_t>({5, 9, 2}, {3});
  Tensor middle = steps.slice(0, 1, 2);
  ops::increment(middle);
  EXPECT_EQ(steps.to_vector<std::int64_t>(), (std::vector<std::int64_t>{5, 10, 2}));
  Tensor scalar = Tensor::zeros({}, DType::I64);
  ops::increment(scalar);
  EXPECT_EQ(scalar.to_vector<std::int64_t>(), std::vector<std::int64_t>{1});
  Tensor wide = Tensor::zeros({2}, DType::I64), floating = Tensor::zeros({1}, DType::F32);
  EXPECT_THROW(ops::increment(wide), Error);
  EXPECT_THROW(ops::increment(floating), Error);
}

TEST(Random, PhiloxKnownAnswer) {
  // Random123's published known-answer vector for philox4x32-10 with zero counter and key.
  Philox4x32 r = philox(0, 0, 0);
  EXPECT_EQ(r.v[0], 0x6627e8d5u);
  EXPECT_EQ(r.v[1], 0xe169c58du);
  EXPECT_EQ(r.v[2], 0xbc57ac4cu);
  EXPECT_EQ(r.v[3], 0x9b00dbd8u);
}

TEST(Random, UniformAndNormalStatistics) {
  Tensor u = Tensor::empty({200000}, DType::F32);
  ops::fill_uniform(u, 2.0, 4.0, 7);
  double mean = ops::reduce(u, ops::Reduction::Mean).item();
  EXPECT_NEAR(mean, 3.0, 0.01);
  EXPECT_GE(ops::reduce(u, ops::Reduction::Max).item(), 3.99);
  EXPECT_LE(ops::reduce(u, ops::Reduction::Max).item(), 4.0);
  Tensor n = Tensor::empty({200000}, DType::F64);
  ops::fill_normal(n, 1.0, 2.0, 9);
  auto v = n.to_vector<double>();
  double m = std::accumulate(v.begin(), v.end(), 0.0) / v.size(), var = 0;
  for (double x : v) var += (x - m) * (x - m);
  var /= v.size();
  EXPECT_NEAR(m, 1.0, 0.02);
  EXPECT_NEAR(std::sqrt(var), 2.0, 0.02);
}

TEST(Random, SeedOffsetAndDtypeBehaviour) {
  Tensor a = Tensor::empty({16}, DType::F32), b = Tensor::empty({16}, DType::F32);
  ops::fill_normal(a, 0, 1, 5);
  ops::fill_normal(b, 0, 1, 5);
  EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>());
  ops::fill_normal(b, 0, 1, 6);
  EXPECT_NE(a.to_vector<float>(), b.to_vector<float>());
  // An offset of one Philox block skips four elements.
  Tensor c = Tensor::empty({12}, DType::F32);
  ops::fill_normal(c, 0, 1, 5, 1);
  auto va = a.to_vector<float>(), vc = c.to_vector<float>();
  for (int i = 0; i < 12; ++i) EXPECT_EQ(vc[i], va[i + 4]);
  // Half fills are the f32 values rounded.
  Tensor h = Tensor::empty({16}, DType::BF16);
  ops::fill_normal(h, 0, 1, 5);
  EXPECT_EQ(h.to_vector<float>(), a.to(DType::BF16).to_vector<float>());
}

}  // namespace
}  // namespace kiln
