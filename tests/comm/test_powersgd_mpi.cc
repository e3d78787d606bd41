// PowerSGD (comm/powersgd.h) under mpirun with 2 ranks on the CPU (label mpi): exact for gradients
// of rank r, error feedback keeps the sum of compressed gradients on the sum of the true ones,
// every rank gets bitwise the same result, half gradients go through f32, and DataParallel
// compresses from its start step on.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "comm/data_parallel.h"
#include "comm/mpi_communicator.h"
#include "comm/powersgd.h"
#include "comm/world.h"
#include "core/ops.h"
#include "tests/comm/dp_training.h"

namespace kiln {
namespace {

MpiCommunicator& comm() {
  static MpiCommunicator* c = [] {
    CommunicatorOptions options;
    options.timeout_s = 120;  // a rank stuck in a test fails the job instead of hanging CI
    return new MpiCommunicator(world(), options);
  }();
  return *c;
}

Tensor random_matrix(std::int64_t rows, std::int64_t cols, std::uint64_t seed) {
  Tensor t = Tensor::empty({rows, cols}, DType::F64);
  ops::fill_normal(t, 0.0, 1.0, seed);
  return t;
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  Tensor c = Tensor::empty({a.size(0), b.size(1)}, a.dtype());
  ops::gemm(false, false, 1.0, a, b, 0.0, c);
  return c;
}

// The average over ranks of each rank's `mine` (exact enough for f64 comparisons).
Tensor average_over_ranks(const Tensor& mine) {
  Tensor avg = mine.clone();
  comm().all_reduce(avg, ReduceOp::Average);
  return avg;
}

double max_abs_difference(const Tensor& a, const Tensor& b) {
  std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  double d = 0;
  for (std::size_t i = 0; i < x.size(); ++i) d = std::max(d, std::abs(x[i] - y[i]));
  return d;
}

double norm(const Tensor& t) {
  double s = 0;
  for (double v : t.to_vector<double>()) s += v * v;
  return std::sqrt(s);
}

TEST(PowerSgd, OrthogonalizeColumnsGivesOrthonormalColumnsAndKeepsZeroColumnsZero) {
  Tensor a = random_matrix(37, 5, 3);
  for (std::int64_t k = 0; k < 37; ++k) a.data<double>()[k * 5 + 2] = 0;  // a zero column
  orthogonalize_columns(a);
  const double* p = a.data<double>();
  for (int i = 0; i < 5; ++i) {
    for (int j = 0; j < 5; ++j) {
      double dot = 0;
      for (int k = 0; k < 37; ++k) dot += p[k * 5 + i] * p[k * 5 + j];
      const double expected = (i == j && i != 2) ? 1.0 : 0.0;
      EXPECT_NEAR(dot, expected, 1e-12) << i << "," << j;
    }
  }
  for (int k = 0; k < 37; ++k) EXPECT_FALSE(std::isnan(p[k * 5 + 2]));
}

TEST(PowerSgd, ExactForRankRGradientsAndVectorsTravelUncompressed) {
  const int r = comm().rank();
  const std::int64_t n = 64, m = 48, rank = 4;
  // Every rank's gradient is A B_r: rank 4 with one column space, as is their average.
  Tensor a = random_matrix(n, rank, 1);
  Tensor weight = matmul(a, random_matrix(rank, m, 100 + r));
  Tensor bias = random_matrix(1, m, 200 + r).view({m});
  const Tensor weight_avg = average_over_ranks(weight);
  const Tensor bias_avg = average_over_ranks(bias);
  PowerSgdOptions options;
  options.rank = rank;
  PowerSgdBucket bucket({weight, bias}, options);
  EXPECT_EQ(bucket.compressed_elements(), n * m);
  EXPECT_EQ(bucket.uncompressed_elements(), m);
  bucket.all_reduce(comm());
  EXPECT_LT(max_abs_difference(weight, weight_avg), 1e-10 * norm(weight_avg));
  EXPECT_EQ(max_abs_difference(bias, bias_avg), 0.0);
  std::vector<double> values = weight.to_vector<double>();
  EXPECT_TRUE(testing::bitwise_equal_on_all_ranks(comm(), values));
  // Each rank's error is its own gradient minus the average; their average is rounding only.
  EXPECT_LT(norm(average_over_ranks(bucket.state()[0].second)), 1e-10 * norm(weight_avg));
}

TEST(PowerSgd, HalfGradientsAreCompressedInF32) {
  // The same values as bf16 and as f32: the bf16 bucket computes in f32, so its result is the f32
  // bucket's rounded to bf16, step after step (error feedback and warm start included).
  const int r = comm().rank();
  const std::int64_t n = 40, m = 30;
  Tensor half = Tensor::empty({n, m}, DType::BF16);
  Tensor single = Tensor::empty({n, m}, DType::F32);
  Tensor half_bias = Tensor::empty({m}, DType::BF16);
  Tensor single_bias = Tensor::empty({m}, DType::F32);
  PowerSgdOptions options;
  options.rank = 2;
  PowerSgdBucket half_bucket({half, half_bias}, options);
  PowerSgdBucket single_bucket({single, single_bias}, options);
  EXPECT_EQ(half_bucket.state()[0].second.dtype(), DType::F32);  // the error
  for (int step = 0; step < 3; ++step) {
    half.copy_from(random_matrix(n, m, 400 + 10 * step + r));
    half_bias.copy_from(random_matrix(1, m, 500 + 10 * step + r).view({m}));
    single.copy_from(half);
    single_bias.copy_from(half_bias);
    half_bucket.all_reduce(comm());
    single_bucket.all_reduce(comm());
    EXPECT_EQ(max_abs_difference(half, single.to(DType::BF16)), 0.0) << "step " << step;
    EXPECT_EQ(max_abs_difference(half_bucket.state()[0].second, single_bucket.state()[0].second),
              0.0)
        << "step " << step;
  }
  EXPECT_TRUE(testing::bitwise_equal_on_all_ranks(comm(), half.to_vector<double>()));
}

TEST(PowerSgd, ErrorFeedbackKeepsTheSumOfCompressedGradientsOnTheTrueSum) {
  const int r = comm().rank();
  const std::int64_t n = 32, m = 24;
  const Tensor mean = random_matrix(n, m, 7);  // full rank: rank 2 cannot carry one step's worth
  Tensor grad = Tensor::zeros({n, m}, DType::F64);
  PowerSgdOptions options;
  options.rank = 2;
  PowerSgdBucket bucket({grad}, options);
  Tensor true_sum = Tensor::zeros({n, m}, DType::F64);
  Tensor compressed_sum = Tensor::zeros({n, m}, DType::F64);
  std::vector<double> relative;
  for (int step = 1; step <= 200; ++step) {
    Tensor noise = random_matrix(n, m, 1000 * step + r);
    grad.copy_from(mean);
    ops::axpy(0.5, noise, grad);
    ops::axpy(1.0, average_over_ranks(grad), true_sum);
    bucket.all_reduce(comm());
    ops::axpy(1.0, grad, compressed_sum);
    // What is missing from the compressed sum is exactly the ranks' average error.
    Tensor missing = true_sum.clone();
    ops::axpy(-1.0, compressed_sum, missing);
    const Tensor error_avg = average_over_ranks(bucket.state()[0].second.view({n, m}));
    ASSERT_LT(max_abs_difference(missing, error_avg), 1e-9 * norm(true_sum)) << "step " << step;
    if (step == 10 || step == 200) relative.push_back(norm(missing) / norm(true_sum));
  }
  // The error stays bounded, so the relative gap closes as the sums grow.
  EXPECT_LT(relative[1], 0.1);
  EXPECT_LT(relative[1], relative[0] / 4);
  EXPECT_TRUE(testing::bitwise_equal_on_all_ranks(comm(), compressed_sum.to_vector<double>()));
}

TEST(PowerSgd, DataParallelCompressesFromTheStartStepAndResets) {
  const int r = comm().rank();
  auto model = testing::make_tiny_model(5, Device::cpu(), DType::F64);
  DataParallelOptions options;
  options.compression = GradientCompression::PowerSgd;
  options.powersgd.rank = 1;
  options.powersgd_start_step = 1;
  DataParallel dp(model->parameters(), model->buffers(), comm(), options);
  // fc1.weight (16, 6) gains from rank 1; fc2.weight (5, 16) too; biases do not.
  NamedTensors state = dp.compression_state();
  ASSERT_FALSE(state.empty());
  const auto fill_grads = [&](std::uint64_t step) {
    std::uint64_t i = 0;
    for (Parameter* p : model->parameters()) ops::fill_normal(p->grad, 0, 1, 31 * step + r, i++);
  };
  const auto averaged = [&] {
    std::vector<Tensor> out;
    for (Parameter* p : model->parameters()) out.push_back(average_over_ranks(p->grad));
    return out;
  };
  // Step 0: before the start step, a plain average.
  fill_grads(0);
  std::vector<Tensor> expected = averaged();
  dp.finish();
  for (std::size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(max_abs_difference(model->parameters()[i]->grad, expected[i]), 0.0);
  }
  // Step 1: matrices compressed (rank 1 of random ones: not the average), biases exact.
  fill_grads(1);
  expected = averaged();
  dp.finish();
  for (std::size_t i = 0; i < expected.size(); ++i) {
    Parameter* p = model->parameters()[i];
    const double d = max_abs_difference(p->grad, expected[i]);
    if (p->grad.dim() >= 2) {
      EXPECT_GT(d, 1e-3) << p->name;
    } else {
      EXPECT_LT(d, 1e-15) << p->name;
    }
  }
  double error_norm = 0;
  for (auto& [name, t] : dp.compression_state()) {
    if (name.find("error") != std::string::npos) error_norm += norm(t);
  }
  EXPECT_GT(error_norm, 0.0);
  // A skipped step starts the state afresh; a saved state loads back.
  NamedTensors saved;
  for (auto& [name, t] : dp.compression_state()) saved.emplace_back(name, t.clone());
  dp.reset_compression_state();
  for (auto& [name, t] : dp.compression_state()) {
    if (name.find("error") != std::string::npos) {
      EXPECT_EQ(norm(t), 0.0) << name;
    }
  }
  dp.load_compression_state(saved, "saved");
  for (std::size_t i = 0; i < saved.size(); ++i) {
    EXPECT_EQ(max_abs_difference(dp.compression_state()[i].second, saved[i].second), 0.0);
  }
  saved.pop_back();
  EXPECT_THROW(dp.load_compression_state(saved, "short"), InputError);
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const kiln::World& w = kiln::init_world(&argc, &argv);
  if (w.rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int status = RUN_ALL_TESTS();
  const bool all_passed =
      kiln::comm().all_reduce_host(static_cast<std::int64_t>(status), kiln::HostReduceOp::Max) == 0;
  if (w.rank == 0 && !all_passed) std::fprintf(stderr, "a test failed on some rank\n");
  kiln::finalize_world();
  return all_passed ? 0 : 1;
}
