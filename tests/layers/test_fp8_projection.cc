// FP8 projections' CPU twin (layers/fp8_projection.h): the casts' scales follow the recipes
// (a Delayed scaling's first cast is primed from its own amax, later ones use the history and
// saturate a tensor that grew; Current follows each tensor), backward's second look at forward's
// operands neither measures nor records, overflows are counted, and a Linear's FP8 forward and
// backward are the f32 GEMMs of exactly those casts.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/fp8.h"
#include "core/ops.h"
#include "layers/cuda/fp8_projection_cuda.h"
#include "layers/fp8_projection.h"
#include "layers/linear.h"

namespace kiln {
namespace {

Tensor random_matrix(std::int64_t rows, std::int64_t cols, double bound, std::uint64_t seed) {
  Tensor t = Tensor::empty({rows, cols}, DType::F32);
  ops::fill_uniform(t, -bound, bound, seed);
  return t;
}

float amax_of(const Tensor& t) {
  float a = 0;
  for (float v : t.to_vector<float>()) a = std::max(a, std::fabs(v));
  return a;
}

// fp8(x * scale) / scale, element by element: what the GEMM sees.
Tensor cast_at(const Tensor& x, float scale, Fp8Format f) {
  std::vector<float> v = x.to_vector<float>();
  for (float& e : v) e = fp8_decode(fp8_encode(e * scale, f), f) / scale;
  return Tensor::from_vector(v, x.shape());
}

struct Projection {
  explicit Projection(Fp8Settings s) : settings(s) {
    state.value = Tensor::zeros(Fp8Projection::state_shape(s), DType::F32);
    fp8 = std::make_unique<Fp8Projection>(state, s);
  }
  Fp8Settings settings;
  Buffer state;
  std::unique_ptr<Fp8Projection> fp8;
};

Fp8Settings settings(Fp8Recipe recipe, int history) {
  Fp8Settings s;
  s.enabled = true;
  s.scaling.recipe = recipe;
  s.scaling.history = history;
  return s;
}

void expect_equal(const Tensor& got, const Tensor& want, const char* what) {
  auto g = got.to_vector<float>(), w = want.to_vector<float>();
  ASSERT_EQ(g.size(), w.size()) << what;
  for (std::size_t i = 0; i < g.size(); ++i) ASSERT_EQ(g[i], w[i]) << what << "[" << i << "]";
}

TEST(Fp8Projection, DelayedScalingPrimesThenFollowsTheHistory) {
  Projection p(settings(Fp8Recipe::Delayed, 4));
  const Tensor a = random_matrix(16, 32, 1.0, 1);
  const float amax = amax_of(a);
  // The first cast: its own amax (no history yet), so the largest element lands on 448.
  expect_equal(p.fp8->emulate(Fp8Projection::Input, a, true),
               cast_at(a, 448.0f / amax, Fp8Format::E4M3), "first cast");
  // A tensor 4x larger is cast at the history's scale: it saturates at the old amax.
  Tensor big = a.clone();
  ops::scale(big, 4.0);
  const Tensor got = p.fp8->emulate(Fp8Projection::Input, big, true);
  expect_equal(got, cast_at(big, 448.0f / amax, Fp8Format::E4M3), "delayed cast");
  EXPECT_NEAR(amax_of(got), amax, 1e-6 * amax);
  // ... and recorded, so the next cast of it does not saturate.
  expect_equal(p.fp8->emulate(Fp8Projection::Input, big, true),
               cast_at(big, 448.0f / amax_of(big), Fp8Format::E4M3), "after the record");
  // The weight and the gradient keep scales of their own (the gradient in E5M2).
  expect_equal(p.fp8->emulate(Fp8Projection::Gradient, a, true),
               cast_at(a, 57344.0f / amax, Fp8Format::E5M2), "gradient");
}

TEST(Fp8Projection, SecondLookUsesTheLastScaleAndRecordsNothing) {
  Projection p(settings(Fp8Recipe::Delayed, 4));
  const Tensor a = random_matrix(16, 16, 2.0, 2), b = random_matrix(16, 16, 0.25, 3);
  const Tensor first = p.fp8->emulate(Fp8Projection::Weight, a, true);
  const std::vector<float> state = p.state.value.to_vector<float>();
  expect_equal(p.fp8->emulate(Fp8Projection::Weight, a, false), first, "the same tensor again");
  expect_equal(p.fp8->emulate(Fp8Projection::Weight, b, false),
               cast_at(b, 448.0f / amax_of(a), Fp8Format::E4M3), "another tensor, the last scale");
  EXPECT_EQ(p.state.value.to_vector<float>(), state);
}

TEST(Fp8Projection, CurrentScalingFollowsEachTensor) {
  Projection p(settings(Fp8Recipe::Current, 1));
  for (double bound : {1.0, 8.0, 0.01}) {
    const Tensor a = random_matrix(16, 16, bound, 4);
    expect_equal(p.fp8->emulate(Fp8Projection::Input, a, true),
                 cast_at(a, 448.0f / amax_of(a), Fp8Format::E4M3), "current");
  }
}

TEST(Fp8Projection, AnOverflowIsCountedAndKeepsTheScale) {
  Projection p(settings(Fp8Recipe::Delayed, 2));
  const Tensor a = random_matrix(16, 16, 1.0, 5);
  p.fp8->emulate(Fp8Projection::Input, a, true);
  std::vector<float> v = a.to_vector<float>();
  v[7] = INFINITY;
  p.fp8->emulate(Fp8Projection::Input, Tensor::from_vector(v, a.shape()), true);
  const std::vector<float> state = p.state.value.to_vector<float>();
  EXPECT_EQ(state[kFp8RowState + 1], 1.0f);                 // one overflow
  EXPECT_EQ(state[kFp8RowState + 0], 448.0f / amax_of(a));  // the scale of before
}

TEST(Fp8Projection, OverflowsAreReadFromTheScalingBuffers) {
  Projection p(settings(Fp8Recipe::Delayed, 2));
  p.state.name = "h.0.mlp.c_fc.fp8_scaling";
  std::vector<float> v = random_matrix(16, 16, 1.0, 6).to_vector<float>();
  p.fp8->emulate(Fp8Projection::Input, Tensor::from_vector(v, {16, 16}), true);
  v[3] = NAN;
  const Tensor bad = Tensor::from_vector(v, {16, 16});
  p.fp8->emulate(Fp8Projection::Input, bad, true);
  p.fp8->emulate(Fp8Projection::Gradient, bad, true);  // primed from a NaN amax: counted too
  Buffer other;
  other.name = "bn1.running_mean";
  other.value = Tensor::full({3, 4}, 7.0, DType::F32);
  EXPECT_EQ(fp8_overflows({&p.state, &other}), 2.0);
}

TEST(Fp8Projection, LinearIsTheGemmOfTheCasts) {
  const std::int64_t rows = 32, in = 48, out = 16;
  Linear linear(in, out, /*bias=*/true);
  linear.use_fp8(settings(Fp8Recipe::Delayed, 16));
  linear.reset_parameters(7);
  const Tensor x = random_matrix(rows, in, 1.0, 8), dy = random_matrix(rows, out, 1e-3, 9);
  const Tensor w = linear.weight().value.clone(), b = linear.bias()->value.clone();
  Context ctx;
  const Tensor y = linear.forward(ctx, x);
  const Tensor xq = cast_at(x, 448.0f / amax_of(x), Fp8Format::E4M3),
               wq = cast_at(w, 448.0f / amax_of(w), Fp8Format::E4M3);
  Tensor want = Tensor::empty({rows, out}, DType::F32);
  ops::gemm(false, true, 1.0, xq, wq, 0.0, want);
  auto yv = y.to_vector<float>(), wv = want.to_vector<float>(), bv = b.to_vector<float>();
  double plain_diff = 0;
  Tensor plain = Tensor::empty({rows, out}, DType::F32);
  ops::gemm(false, true, 1.0, x, w, 0.0, plain);
  auto pv = plain.to_vector<float>();
  for (std::int64_t i = 0; i < rows * out; ++i) {
    ASSERT_NEAR(yv[i], wv[i] + bv[i % out], 1e-5) << i;
    plain_diff = std::max(plain_diff, std::fabs(static_cast<double>(yv[i] - pv[i] - bv[i % out])));
  }
  EXPECT_GT(plain_diff, 1e-4);  // FP8 did round

  const Tensor dx = linear.backward(ctx, dy);
  const Tensor dyq = cast_at(dy, 57344.0f / amax_of(dy), Fp8Format::E5M2);
  Tensor want_dx = Tensor::empty({rows, in}, DType::F32),
         want_dw = Tensor::empty({out, in}, DType::F32);
  ops::gemm(false, false, 1.0, dyq, wq, 0.0, want_dx);
  ops::gemm(true, false, 1.0, dyq, xq, 0.0, want_dw);
  auto close = [](const Tensor& got, const Tensor& want, const char* what) {
    auto g = got.to_vector<float>(), w = want.to_vector<float>();
    for (std::size_t i = 0; i < g.size(); ++i)
      ASSERT_NEAR(g[i], w[i], 1e-6 + 1e-5 * std::fabs(w[i])) << what << "[" << i << "]";
  };
  close(dx, want_dx, "dx");
  close(linear.weight().grad, want_dw, "weight grad");
  // The bias gradient is the column sums of dy itself, as on CUDA.
  Tensor want_db = ops::reduce_cols(dy, ops::Reduction::Sum);
  close(linear.bias()->grad, want_db, "bias grad");
}

TEST(Fp8Projection, EvaluationRunsInTheGemmDtype) {
  Linear linear(16, 16, /*bias=*/false);
  linear.use_fp8(settings(Fp8Recipe::Delayed, 16));
  const Tensor x = random_matrix(16, 16, 1.0, 10);
  Context ctx;
  ctx.training = false;
  const Tensor y = linear.forward(ctx, x);
  Tensor want = Tensor::empty({16, 16}, DType::F32);
  ops::gemm(false, true, 1.0, x, linear.weight().value, 0.0, want);
  expect_equal(y, want, "eval");
}

}  // namespace
}  // namespace kiln
