// Convolutional layers on the CPU: f64 finite-difference gradient checks (NCHW and NHWC),
// forward results against direct loops and hand-computed values, batch-norm running statistics,
// the models' parameter counts, names and output shapes, and fashion_cnn's CPU step throughput.

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>

#include "core/gemm_algorithm.h"
#include "core/ops.h"
#include "layers/batchnorm.h"
#include "layers/conv2d.h"
#include "layers/gradient_check.h"
#include "layers/models/model.h"
#include "layers/pooling.h"
#include "layers/relu.h"

namespace kiln {
namespace {

using Pair = std::pair<std::int64_t, std::int64_t>;

Tensor random_tensor(const Shape& shape, std::uint64_t seed, DType dtype = DType::F64) {
  Tensor t = Tensor::empty(shape, dtype);
  ops::fill_uniform(t, -1.0, 1.0, seed);
  return t;
}

// ---- Algorithm options
// ---------------------------------------------------------------------------

// GEMMs have their own search switch; until it is set they follow the convolutions' (one
// cudnn.benchmark-like switch served both before).
TEST(GemmAlgorithmOptions, FollowConvolutionsUntilSet) {
  clear_default_gemm_algorithm_options();
  ConvAlgorithmOptions conv;
  conv.search = ConvAlgorithmSearch::Benchmark;
  set_default_conv_algorithm_options(conv);
  EXPECT_EQ(default_gemm_algorithm_options().search, GemmAlgorithmSearch::Benchmark);

  GemmAlgorithmOptions gemm;
  gemm.search = GemmAlgorithmSearch::Heuristic;
  set_default_gemm_algorithm_options(gemm);
  EXPECT_EQ(default_gemm_algorithm_options().search, GemmAlgorithmSearch::Heuristic);
  set_default_conv_algorithm_options(ConvAlgorithmOptions());
  gemm.search = GemmAlgorithmSearch::Benchmark;
  set_default_gemm_algorithm_options(gemm);
  EXPECT_EQ(default_gemm_algorithm_options().search, GemmAlgorithmSearch::Benchmark);

  clear_default_gemm_algorithm_options();
  EXPECT_EQ(default_gemm_algorithm_options().search, GemmAlgorithmSearch::Heuristic);
}

// ---- Conv2d ------------------------------------------------------------------------------------

struct ConvCase {
  std::string label;
  std::int64_t in, out;
  Pair kernel, stride, padding, dilation;
  std::int64_t groups;
  bool bias;
  Shape input;
};

std::vector<ConvCase> conv_cases() {
  return {
      {"basic3x3", 3, 4, {3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, true, {2, 3, 5, 6}},
      {"stride2_odd", 3, 4, {3, 3}, {2, 2}, {1, 1}, {1, 1}, 1, true, {2, 3, 7, 5}},
      {"dilation2", 2, 3, {3, 3}, {1, 1}, {2, 2}, {2, 2}, 1, true, {1, 2, 7, 6}},
      {"groups2", 4, 6, {3, 3}, {1, 1}, {0, 1}, {1, 1}, 2, true, {2, 4, 5, 5}},
      {"depthwise_stride2", 4, 4, {3, 3}, {2, 2}, {1, 1}, {1, 1}, 4, true, {2, 4, 7, 7}},
      {"pointwise_no_bias", 5, 3, {1, 1}, {2, 2}, {0, 0}, {1, 1}, 1, false, {2, 5, 5, 4}},
      {"rectangular", 2, 3, {3, 2}, {2, 1}, {1, 0}, {1, 2}, 1, false, {1, 2, 6, 7}},
  };
}

// y[n, k, oh, ow] by the definition, in double.
std::vector<double> direct_conv(const ConvCase& c, const std::vector<double>& x,
                                const std::vector<double>& w, const std::vector<double>& b,
                                Shape* out_shape) {
  const std::int64_t n_n = c.input[0], h_n = c.input[2], w_n = c.input[3];
  const std::int64_t oh_n =
      (h_n + 2 * c.padding.first - c.dilation.first * (c.kernel.first - 1) - 1) / c.stride.first +
      1;
  const std::int64_t ow_n =
      (w_n + 2 * c.padding.second - c.dilation.second * (c.kernel.second - 1) - 1) /
          c.stride.second +
      1;
  const std::int64_t cg = c.in / c.groups, kg = c.out / c.groups;
  *out_shape = {n_n, c.out, oh_n, ow_n};
  std::vector<double> y(static_cast<std::size_t>(n_n * c.out * oh_n * ow_n));
  for (std::int64_t n = 0; n < n_n; ++n)
    for (std::int64_t k = 0; k < c.out; ++k)
      for (std::int64_t oh = 0; oh < oh_n; ++oh)
        for (std::int64_t ow = 0; ow < ow_n; ++ow) {
          double s = c.bias ? b[k] : 0.0;
          const std::int64_t grp = k / kg;
          for (std::int64_t ci = 0; ci < cg; ++ci)
            for (std::int64_t r = 0; r < c.kernel.first; ++r)
              for (std::int64_t q = 0; q < c.kernel.second; ++q) {
                std::int64_t ih = oh * c.stride.first - c.padding.first + r * c.dilation.first;
                std::int64_t iw = ow * c.stride.second - c.padding.second + q * c.dilation.second;
                if (ih < 0 || ih >= h_n || iw < 0 || iw >= w_n) continue;
                s += x[((n * c.in + grp * cg + ci) * h_n + ih) * w_n + iw] *
                     w[((k * cg + ci) * c.kernel.first + r) * c.kernel.second + q];
              }
          y[((n * c.out + k) * oh_n + oh) * ow_n + ow] = s;
        }
  return y;
}

std::unique_ptr<Conv2d> make_conv(const ConvCase& c) {
  return std::make_unique<Conv2d>(c.in, c.out, c.kernel, c.stride, c.padding, c.dilation, c.groups,
                                  c.bias);
}

class ConvGradient : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(ConvGradient, MatchesFiniteDifferences) {
  const ConvCase c = conv_cases()[std::get<0>(GetParam())];
  auto conv = make_conv(c);
  conv->reset_parameters(3);
  conv->to(Device::cpu(), DType::F64);
  Context ctx;
  ctx.run.channels_last = std::get<1>(GetParam());
  GradientCheckResult r = check_layer_gradients(*conv, ctx, random_tensor(c.input, 5));
  EXPECT_TRUE(r.ok) << c.label << ": " << r.report;
  EXPECT_GT(r.checked, 20) << r.report;
  EXPECT_EQ(r.skipped, 0) << r.report;  // a convolution has no kinks
}

TEST_P(ConvGradient, ForwardMatchesDirectLoops) {
  const ConvCase c = conv_cases()[std::get<0>(GetParam())];
  const bool cl = std::get<1>(GetParam());
  for (DType dt : {DType::F64, DType::F32}) {
    auto conv = make_conv(c);
    conv->reset_parameters(9);
    conv->to(Device::cpu(), dt);
    Tensor x = random_tensor(c.input, 17, dt);
    Context ctx;
    ctx.run.channels_last = cl;
    Tensor y = conv->forward(ctx, x);
    EXPECT_EQ(is_channels_last(y), cl && y.size(1) > 1 && y.size(2) * y.size(3) > 1);
    Shape want_shape;
    std::vector<double> bias =
        c.bias ? conv->bias()->value.to_vector<double>() : std::vector<double>();
    std::vector<double> want = direct_conv(
        c, x.to_vector<double>(), conv->weight().value.to_vector<double>(), bias, &want_shape);
    ASSERT_EQ(y.shape(), want_shape);
    EXPECT_EQ(conv->output_shape(c.input), want_shape);
    std::vector<double> got = y.to_vector<double>();
    const double tol = dt == DType::F64 ? 1e-12 : 1e-5;
    for (std::size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], tol) << c.label << " element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, ConvGradient,
                         ::testing::Combine(::testing::Range(0, 7), ::testing::Bool()),
                         [](const auto& info) {
                           return conv_cases()[std::get<0>(info.param)].label +
                                  (std::get<1>(info.param) ? "_nhwc" : "_nchw");
                         });

TEST(Conv2d, WeightGradientsAccumulate) {
  ConvCase c = conv_cases()[1];
  auto conv = make_conv(c);
  conv->to(Device::cpu(), DType::F64);
  Context ctx;
  Tensor x = random_tensor(c.input, 1);
  Tensor y = conv->forward(ctx, x);
  Tensor dy = random_tensor(y.shape(), 2);
  conv->backward(ctx, dy);
  std::vector<double> once = conv->weight().grad.to_vector<double>();
  std::vector<double> bias_once = conv->bias()->grad.to_vector<double>();
  conv->forward(ctx, x);
  conv->backward(ctx, dy);
  std::vector<double> twice = conv->weight().grad.to_vector<double>();
  std::vector<double> bias_twice = conv->bias()->grad.to_vector<double>();
  double norm = 0;
  for (std::size_t i = 0; i < once.size(); ++i) {
    EXPECT_NEAR(twice[i], 2 * once[i], 1e-12);
    norm += std::fabs(once[i]);
  }
  for (std::size_t i = 0; i < bias_once.size(); ++i)
    EXPECT_NEAR(bias_twice[i], 2 * bias_once[i], 1e-12);
  EXPECT_GT(norm, 0);
}

TEST(Conv2d, PyTorchLayoutNamesAndInit) {
  Conv2d conv(6, 8, {3, 5}, {1, 1}, {0, 0}, {1, 1}, 2, true);
  conv.set_name("features.0");
  auto params = conv.parameters();
  ASSERT_EQ(params.size(), 2u);
  EXPECT_EQ(params[0]->name, "features.0.weight");
  EXPECT_EQ(params[0]->value.shape(), (Shape{8, 3, 3, 5}));
  EXPECT_EQ(params[1]->name, "features.0.bias");
  EXPECT_TRUE(params[1]->no_weight_decay);
  conv.reset_parameters(42);
  const double bound = 1.0 / std::sqrt(3.0 * 3 * 5);
  double max_abs = 0;
  for (double v : conv.weight().value.to_vector<double>())
    max_abs = std::max(max_abs, std::fabs(v));
  EXPECT_LE(max_abs, bound);
  EXPECT_GT(max_abs, 0.8 * bound);
  EXPECT_THROW(Conv2d(6, 8, {3, 3}, {1, 1}, {0, 0}, {1, 1}, 4, true), InputError);
  EXPECT_THROW(conv.output_shape({1, 6, 2, 2}), InputError);
  EXPECT_DOUBLE_EQ(conv.forward_flops({1, 6, 7, 9}), 2.0 * 8 * 5 * 5 * 3 * 3 * 5);
}

// ---- BatchNorm2d -------------------------------------------------------------------------------

class BatchNormGradient : public ::testing::TestWithParam<std::tuple<bool, bool, bool>> {};

TEST_P(BatchNormGradient, MatchesFiniteDifferences) {
  const bool training = std::get<0>(GetParam());
  BatchNorm2d bn(3);
  bn.set_fused_relu(std::get<2>(GetParam()));
  bn.to(Device::cpu(), DType::F64);
  ops::fill_uniform(bn.weight().value, 0.5, 1.5, 1);
  ops::fill_uniform(bn.bias().value, -0.5, 0.5, 2);
  ops::fill_uniform(bn.running_mean().value, -0.3, 0.3, 3);
  ops::fill_uniform(bn.running_var().value, 0.5, 2.0, 4);
  bn.set_training(training);
  Context ctx;
  ctx.run.channels_last = std::get<1>(GetParam());
  GradientCheckResult r = check_layer_gradients(bn, ctx, random_tensor({3, 3, 4, 5}, 6));
  EXPECT_TRUE(r.ok) << r.report;
  EXPECT_GT(r.checked, 100) << r.report;
}

INSTANTIATE_TEST_SUITE_P(Modes, BatchNormGradient,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool(),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "train" : "eval") +
                                  (std::get<1>(info.param) ? "_nhwc" : "_nchw") +
                                  (std::get<2>(info.param) ? "_relu" : "");
                         });

// ReLU with a residual gives bitwise relu(add(x, r)), in both memory orders; backward as ReLU's.
TEST(ReLU, ResidualEqualsAddThenRelu) {
  for (DType dt : {DType::F32, DType::BF16}) {
    for (bool cl : {false, true}) {
      Tensor x = random_tensor({2, 8, 3, 5}, 31, dt), r = random_tensor({2, 8, 3, 5}, 32, dt);
      Tensor dy = random_tensor({2, 8, 3, 5}, 33, dt);
      Context ctx;
      ctx.run.channels_last = cl;
      ReLU fused, plain;
      fused.set_residual(r);
      Tensor y_fused = fused.forward(ctx, x);
      Tensor y_plain = plain.forward(ctx, ops::add(x, r));
      EXPECT_EQ(y_fused.to_vector<double>(), y_plain.to_vector<double>());
      EXPECT_EQ(fused.backward(ctx, dy).to_vector<double>(),
                plain.backward(ctx, dy).to_vector<double>());
      // The residual is used once.
      EXPECT_EQ(fused.forward(ctx, x).to_vector<double>(),
                plain.forward(ctx, x).to_vector<double>());
    }
  }
  ReLU relu;
  relu.set_residual(Tensor::zeros({2, 3}, DType::F32));
  Context ctx;
  EXPECT_THROW(relu.forward(ctx, Tensor::zeros({3, 2}, DType::F32)), Error);
}

// A fused ReLU gives bitwise the results of BatchNorm2d followed by ReLU (f32 and a half dtype).
TEST(BatchNorm2d, FusedReluEqualsBatchNormThenRelu) {
  for (DType dt : {DType::F32, DType::BF16}) {
    for (bool cl : {false, true}) {
      Tensor x = random_tensor({4, 8, 5, 3}, 21, dt);
      Tensor dy = random_tensor({4, 8, 5, 3}, 22, dt);
      BatchNorm2d fused(8), plain(8);
      ReLU relu;
      for (BatchNorm2d* bn : {&fused, &plain}) {
        ops::fill_uniform(bn->weight().value, 0.5, 1.5, 23);
        ops::fill_uniform(bn->bias().value, -0.5, 0.5, 24);
      }
      fused.set_fused_relu(true);
      EXPECT_EQ(fused.type(), "BatchNorm2d+ReLU");
      Context ctx;
      ctx.run.channels_last = cl;
      Tensor y_fused = fused.forward(ctx, x);
      Tensor y_plain = relu.forward(ctx, plain.forward(ctx, x));
      Tensor dx_fused = fused.backward(ctx, dy);
      Tensor dx_plain = plain.backward(ctx, relu.backward(ctx, dy));
      const std::string what = std::string(dtype_name(dt)) + (cl ? " nhwc" : " nchw");
      EXPECT_EQ(y_fused.to_vector<double>(), y_plain.to_vector<double>()) << what;
      EXPECT_EQ(dx_fused.to_vector<double>(), dx_plain.to_vector<double>()) << what;
      EXPECT_EQ(fused.weight().grad.to_vector<double>(), plain.weight().grad.to_vector<double>());
      EXPECT_EQ(fused.bias().grad.to_vector<double>(), plain.bias().grad.to_vector<double>());
      double zeros = 0;
      for (double v : y_fused.to_vector<double>()) zeros += v == 0.0;
      EXPECT_GT(zeros, 0) << "the ReLU cut nothing: the test checks no mask";
    }
  }
}

TEST(BatchNorm2d, RunningStatisticsMatchHandComputedValues) {
  BatchNorm2d bn(2, 1e-5, 0.1);
  bn.set_name("bn1");
  // Channel 0 holds 1, 2, 3, 4 (mean 2.5, biased var 1.25, unbiased 5/3); channel 1 holds 10s.
  Tensor x = Tensor::from_vector<float>({1, 2, 10, 10, 3, 4, 10, 10}, {2, 2, 1, 2});
  Context ctx;
  Tensor y = bn.forward(ctx, x);
  std::vector<float> rm = bn.running_mean().value.to_vector<float>();
  std::vector<float> rv = bn.running_var().value.to_vector<float>();
  EXPECT_NEAR(rm[0], 0.25, 1e-6);
  EXPECT_NEAR(rv[0], 0.9 + 0.1 * 5.0 / 3.0, 1e-6);
  EXPECT_NEAR(rm[1], 1.0, 1e-6);
  EXPECT_NEAR(rv[1], 0.9, 1e-6);
  EXPECT_EQ(bn.num_batches_tracked().value.item(), 1.0);
  EXPECT_EQ(bn.num_batches_tracked().value.dim(), 0);
  // Training output: (x - 2.5) / sqrt(1.25 + eps).
  std::vector<float> yv = y.to_vector<float>();
  EXPECT_NEAR(yv[0], (1 - 2.5) / std::sqrt(1.25 + 1e-5), 1e-5);
  EXPECT_NEAR(yv[5], (4 - 2.5) / std::sqrt(1.25 + 1e-5), 1e-5);
  EXPECT_NEAR(yv[2], 0.0, 1e-5);
  // A second step moves the averages again.
  bn.forward(ctx, x);
  EXPECT_NEAR(bn.running_mean().value.to_vector<float>()[0], 0.9 * 0.25 + 0.25, 1e-6);
  EXPECT_EQ(bn.num_batches_tracked().value.item(), 2.0);
  // Eval uses the running statistics and leaves them alone.
  bn.set_training(false);
  const double m = 0.9 * 0.25 + 0.25, v = 0.9 * (0.9 + 0.1 * 5.0 / 3.0) + 0.1 * 5.0 / 3.0;
  EXPECT_NEAR(bn.running_var().value.to_vector<float>()[0], v, 1e-6);
  std::vector<float> ye = bn.forward(ctx, x).to_vector<float>();
  EXPECT_NEAR(ye[0], (1 - m) / std::sqrt(v + 1e-5), 1e-5);
  EXPECT_EQ(bn.num_batches_tracked().value.item(), 2.0);
  auto buffers = bn.buffers();
  ASSERT_EQ(buffers.size(), 3u);
  EXPECT_EQ(buffers[0]->name, "bn1.running_mean");
  EXPECT_EQ(buffers[1]->name, "bn1.running_var");
  EXPECT_EQ(buffers[2]->name, "bn1.num_batches_tracked");
  EXPECT_TRUE(bn.weight().fp32_in_half && bn.weight().no_weight_decay && bn.bias().fp32_in_half);
  EXPECT_THROW(bn.output_shape({2, 3, 1, 1}), InputError);
}

TEST(BatchNorm2d, NhwcMatchesNchw) {
  Tensor x = random_tensor({4, 3, 5, 2}, 8, DType::F32);
  Tensor dy = random_tensor({4, 3, 5, 2}, 9, DType::F32);
  std::vector<std::vector<double>> outs;
  for (bool cl : {false, true}) {
    BatchNorm2d bn(3);
    ops::fill_uniform(bn.weight().value, 0.5, 1.5, 1);
    Context ctx;
    ctx.run.channels_last = cl;
    Tensor y = bn.forward(ctx, x);
    EXPECT_EQ(is_channels_last(y), cl);
    outs.push_back(y.to_vector<double>());
    outs.push_back(bn.backward(ctx, dy).to_vector<double>());
    outs.push_back(bn.weight().grad.to_vector<double>());
    outs.push_back(bn.running_var().value.to_vector<double>());
  }
  for (std::size_t k = 0; k < 4; ++k) {
    for (std::size_t i = 0; i < outs[k].size(); ++i) EXPECT_NEAR(outs[k][i], outs[k + 4][i], 1e-5);
  }
}

// ---- Pooling and ReLU --------------------------------------------------------------------------

enum class PoolKind { Max3s2p1, Max2, Avg3s2p1, Avg2, Global };

std::unique_ptr<Layer> make_pool(PoolKind k) {
  switch (k) {
    case PoolKind::Max3s2p1:
      return std::make_unique<MaxPool2d>(3, 2, 1);
    case PoolKind::Max2:
      return std::make_unique<MaxPool2d>(2);
    case PoolKind::Avg3s2p1:
      return std::make_unique<AvgPool2d>(3, 2, 1);
    case PoolKind::Avg2:
      return std::make_unique<AvgPool2d>(2);
    case PoolKind::Global:
      return std::make_unique<GlobalAvgPool>();
  }
  return nullptr;
}

class PoolGradient : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(PoolGradient, MatchesFiniteDifferences) {
  auto pool = make_pool(static_cast<PoolKind>(std::get<0>(GetParam())));
  Context ctx;
  ctx.run.channels_last = std::get<1>(GetParam());
  GradientCheckResult r = check_layer_gradients(*pool, ctx, random_tensor({2, 3, 7, 6}, 12));
  EXPECT_TRUE(r.ok) << r.report;
  EXPECT_GT(r.checked, 200) << r.report;
}

INSTANTIATE_TEST_SUITE_P(Kinds, PoolGradient,
                         ::testing::Combine(::testing::Range(0, 5), ::testing::Bool()));

TEST(Pooling, ForwardMatchesHandComputedValues) {
  // One 4x4 plane 0..15: 2x2 max pool gives 5, 7, 13, 15; average 2.5, 4.5, 10.5, 12.5.
  std::vector<float> v(16);
  for (int i = 0; i < 16; ++i) v[i] = static_cast<float>(i);
  Tensor x = Tensor::from_vector(v, {1, 1, 4, 4});
  Context ctx;
  MaxPool2d max_pool(2);
  EXPECT_EQ(max_pool.forward(ctx, x).to_vector<float>(), (std::vector<float>{5, 7, 13, 15}));
  AvgPool2d avg_pool(2);
  EXPECT_EQ(avg_pool.forward(ctx, x).to_vector<float>(),
            (std::vector<float>{2.5, 4.5, 10.5, 12.5}));
  // 3x3 stride 2 padding 1 (ResNet's): corner windows see the padding; average counts it.
  MaxPool2d resnet_pool(3, 2, 1);
  EXPECT_EQ(resnet_pool.output_shape({1, 1, 4, 4}), (Shape{1, 1, 2, 2}));
  EXPECT_EQ(resnet_pool.forward(ctx, x).to_vector<float>(), (std::vector<float>{5, 7, 13, 15}));
  AvgPool2d padded_avg(3, 2, 1);
  EXPECT_NEAR(padded_avg.forward(ctx, x).to_vector<float>()[0], (0 + 1 + 4 + 5) / 9.0, 1e-6);
  GlobalAvgPool gap;
  Tensor g = gap.forward(ctx, x);
  EXPECT_EQ(g.shape(), (Shape{1, 1}));
  EXPECT_FLOAT_EQ(g.item(), 7.5f);
  // Max-pool backward routes each gradient to its window's maximum.
  Tensor dy = Tensor::from_vector<float>({1, 2, 3, 4}, {1, 1, 2, 2});
  std::vector<float> dx = max_pool.backward(ctx, dy).to_vector<float>();
  EXPECT_EQ(dx[5], 1);
  EXPECT_EQ(dx[7], 2);
  EXPECT_EQ(dx[13], 3);
  EXPECT_EQ(dx[15], 4);
  EXPECT_EQ(dx[0], 0);
  EXPECT_THROW(MaxPool2d(2, 2, 2), InputError);
}

TEST(ReLU, GradientAndInPlace) {
  ReLU relu;
  Context ctx;
  GradientCheckResult r = check_layer_gradients(relu, ctx, random_tensor({2, 3, 4, 5}, 21));
  EXPECT_TRUE(r.ok) << r.report;
  EXPECT_GT(r.checked, 100);
  // In place gives the same output and gradient, and really reuses x's memory; NHWC stays NHWC.
  for (bool cl : {false, true}) {
    Tensor x = random_tensor({2, 3, 4, 5}, 22, DType::F32);
    if (cl) x = from_physical(to_physical(x, true), true);
    Tensor dy = random_tensor({2, 3, 4, 5}, 23, DType::F32);
    ReLU copy_relu, inplace_relu(true);
    Tensor y = copy_relu.forward(ctx, x);
    Tensor dx = copy_relu.backward(ctx, dy);
    Tensor x2 = x.clone();
    if (cl) x2 = from_physical(to_physical(x, true).clone(), true);
    Tensor y2 = inplace_relu.forward(ctx, x2);
    EXPECT_EQ(y2.data(), x2.data());
    EXPECT_EQ(is_channels_last(y2), cl);
    EXPECT_EQ(y.to_vector<float>(), y2.to_vector<float>());
    EXPECT_EQ(dx.to_vector<float>(), inplace_relu.backward(ctx, dy).to_vector<float>());
    for (float v : y.to_vector<float>()) EXPECT_GE(v, 0.f);
  }
}

// ---- Residual block and models -----------------------------------------------------------------

Layer* child_named(Layer& parent, const std::string& full_name) {
  for (Layer* c : parent.children()) {
    if (c->name() == full_name) return c;
  }
  return nullptr;
}

TEST(ResNet, DownsamplingBlockGradient) {
  ModelOptions options;
  options.image_channels = 3;
  options.num_classes = 10;
  for (int depth : {18, 50}) {
    Model m = make_resnet(options, depth);
    Layer* layer2 = child_named(*m.net, "layer2");
    ASSERT_NE(layer2, nullptr);
    Layer* block = child_named(*layer2, "layer2.0");
    ASSERT_NE(block, nullptr);
    EXPECT_EQ(block->type(), depth == 18 ? "BasicBlock" : "Bottleneck");
    block->to(Device::cpu(), DType::F64);
    const std::int64_t in_planes = depth == 18 ? 64 : 256;
    for (bool cl : {false, true}) {
      Context ctx;
      ctx.run.channels_last = cl;
      GradientCheckOptions opt;
      opt.max_elements_per_tensor = depth == 18 ? 40 : 20;
      GradientCheckResult r =
          check_layer_gradients(*block, ctx, random_tensor({2, in_planes, 4, 4}, 31), opt);
      EXPECT_TRUE(r.ok) << "resnet" << depth << (cl ? " nhwc " : " nchw ") << r.report;
      EXPECT_GT(r.checked, 100) << r.report;
    }
  }
}

TEST(ResNet, ParameterCountsNamesAndShapes) {
  ModelOptions options;
  options.image_channels = 3;
  options.num_classes = 1000;
  options.image_size = 224;
  Model r50 = make_resnet(options, 50);
  EXPECT_EQ(r50.net->parameter_count(), 25557032);
  EXPECT_EQ(r50.net->output_shape({2, 3, 224, 224}), (Shape{2, 1000}));
  EXPECT_EQ(r50.sample_shape, (Shape{3, 224, 224}));
  EXPECT_EQ(r50.num_outputs, 1000);
  EXPECT_EQ(r50.input_dtype, DType::F32);
  EXPECT_EQ(r50.task, Task::Classification);
  auto params = r50.net->parameters();
  EXPECT_EQ(params.size(), 161u);  // torchvision's resnet50().parameters()
  EXPECT_EQ(params[0]->name, "conv1.weight");
  EXPECT_EQ(params[1]->name, "bn1.weight");
  EXPECT_EQ(params[3]->name, "layer1.0.conv1.weight");
  EXPECT_EQ(params.back()->name, "fc.bias");
  bool has_downsample = false;
  for (Parameter* p : params) {
    if (p->name == "layer1.0.downsample.0.weight") {
      has_downsample = true;
      EXPECT_EQ(p->value.shape(), (Shape{256, 64, 1, 1}));
    }
    if (p->name == "layer4.2.conv3.weight") {
      EXPECT_EQ(p->value.shape(), (Shape{2048, 512, 1, 1}));
    }
  }
  EXPECT_TRUE(has_downsample);
  auto buffers = r50.net->buffers();
  EXPECT_EQ(buffers.size(), 53u * 3);
  EXPECT_EQ(buffers[2]->name, "bn1.num_batches_tracked");

  Model r18 = make_resnet(options, 18);
  EXPECT_EQ(r18.net->parameter_count(), 11689512);
  EXPECT_EQ(r18.net->output_shape({1, 3, 224, 224}), (Shape{1, 1000}));
  // kaiming_normal(fan_out): conv1's std is sqrt(2 / (64 * 49)).
  std::vector<double> w = r18.net->parameters()[0]->value.to_vector<double>();
  double sq = 0;
  for (double v : w) sq += v * v;
  EXPECT_NEAR(std::sqrt(sq / w.size()), std::sqrt(2.0 / (64 * 49)), 0.01);
  EXPECT_THROW(make_resnet(options, 34), InputError);
}

TEST(ResNet, CifarStemAndForward) {
  ModelOptions options;
  options.image_channels = 3;
  options.num_classes = 10;
  options.image_size = 32;
  options.cifar_stem = true;
  Model m = make_resnet(options, 18);
  EXPECT_EQ(m.net->parameters()[0]->value.shape(), (Shape{64, 3, 3, 3}));
  EXPECT_EQ(m.net->output_shape({2, 3, 32, 32}), (Shape{2, 10}));
  Context ctx;
  Tensor x = random_tensor({2, 3, 32, 32}, 3, DType::F32);
  Tensor y = m.net->forward(ctx, x);
  EXPECT_EQ(y.shape(), (Shape{2, 10}));
  Tensor dx = m.net->backward(ctx, random_tensor({2, 10}, 4, DType::F32));
  EXPECT_EQ(dx.shape(), x.shape());
  double g = 0;
  for (double v : m.net->parameters()[0]->grad.to_vector<double>()) g += std::fabs(v);
  EXPECT_GT(g, 0);
  EXPECT_TRUE(std::isfinite(g));
  // NHWC gives the same logits.
  ctx.run.channels_last = true;
  m.net->set_training(false);
  Tensor y_nhwc = m.net->forward(ctx, x);
  ctx.run.channels_last = false;
  Tensor y_nchw = m.net->forward(ctx, x);
  auto a = y_nhwc.to_vector<float>(), b = y_nchw.to_vector<float>();
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-4);
}

TEST(FashionCnn, ParametersShapesAndCpuStepThroughput) {
  ModelOptions options;
  options.name = "fashion_cnn";
  Model m = make_model(options);
  EXPECT_EQ(m.net->parameter_count(), 421738);
  EXPECT_EQ(m.sample_shape, (Shape{1, 28, 28}));
  EXPECT_EQ(m.num_outputs, 10);
  EXPECT_EQ(m.net->output_shape({128, 1, 28, 28}), (Shape{128, 10}));
  EXPECT_EQ(m.net->parameters()[0]->name, "conv1.weight");

  // A training step (forward + backward, batch 128) on the CPU; the figure goes to the log.
  Context ctx;
  const std::uint64_t micro_step = 0;  // dropout's
  ctx.step.step = &micro_step;
  Tensor x = random_tensor({128, 1, 28, 28}, 5, DType::F32);
  Tensor dy = random_tensor({128, 10}, 6, DType::F32);
  auto step = [&] {
    Tensor y = m.net->forward(ctx, x);
    m.net->backward(ctx, dy);
    return y;
  };
  Tensor y = step();
  EXPECT_EQ(y.shape(), (Shape{128, 10}));
  const int steps = 5;
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) step();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  double samples_per_second = steps * 128 / seconds;
  std::printf("fashion_cnn CPU training step (batch 128): %.1f ms, %.0f samples/s\n",
              1000 * seconds / steps, samples_per_second);
  RecordProperty("samples_per_second", std::to_string(samples_per_second));
  for (Parameter* p : m.net->parameters()) {
    double g = 0;
    for (double v : p->grad.to_vector<double>()) g += std::fabs(v);
    EXPECT_TRUE(std::isfinite(g) && g > 0) << p->name;
  }
}

}  // namespace
}  // namespace kiln
