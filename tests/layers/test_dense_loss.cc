// SoftmaxCrossEntropy on the CPU against closed forms (PyTorch's F.cross_entropy semantics) and
// finite differences in f64.

#include <gtest/gtest.h>

#include <cmath>

#include "core/ops.h"
#include "layers/softmax_cross_entropy.h"

namespace kiln {
namespace {

// The reference: mean over non-ignored rows of (1-eps) * nll + eps * mean_c(-log p_c).
double reference_loss(const std::vector<double>& x, std::int64_t classes,
                      const std::vector<std::int64_t>& t, double eps, std::int64_t ignore) {
  double total = 0;
  int counted = 0;
  for (std::size_t r = 0; r < t.size(); ++r) {
    if (t[r] == ignore) continue;
    double sum = 0;
    for (std::int64_t c = 0; c < classes; ++c) sum += std::exp(x[r * classes + c]);
    double lse = std::log(sum), smooth = 0;
    for (std::int64_t c = 0; c < classes; ++c) smooth += (lse - x[r * classes + c]) / classes;
    total += (1 - eps) * (lse - x[r * classes + t[r]]) + eps * smooth;
    ++counted;
  }
  return counted ? total / counted : 0.0;
}

TEST(SoftmaxCrossEntropy, ClosedFormWithoutSmoothing) {
  // Row 0: logits (0, 0, 0, 0), target 2: loss log 4. Row 1: (1, 2, 3, 4), target 3:
  // loss log(e + e^2 + e^3 + e^4) - 4.
  std::vector<float> x = {0, 0, 0, 0, 1, 2, 3, 4};
  SoftmaxCrossEntropy loss_fn;
  Context ctx;
  Tensor loss = loss_fn.forward(ctx, Tensor::from_vector<float>(x, {2, 4}),
                                Tensor::from_vector<std::int64_t>({2, 3}, {2}));
  EXPECT_EQ(loss.dtype(), DType::F32);
  EXPECT_EQ(loss.numel(), 1);
  double row1 = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0) + std::exp(4.0)) - 4.0;
  EXPECT_NEAR(loss.item(), (std::log(4.0) + row1) / 2, 1e-6);
  EXPECT_EQ(loss_fn.counted_rows().item(), 2.0);
  EXPECT_EQ(loss_fn.correct_count().item(), 1.0);  // row 0 ties: argmax is class 0, not 2
  std::vector<float> g = loss_fn.backward(ctx).to_vector<float>();
  // d/dx = (softmax - onehot) / rows
  EXPECT_NEAR(g[0], 0.25 / 2, 1e-7);
  EXPECT_NEAR(g[2], (0.25 - 1) / 2, 1e-7);
  double s4 = std::exp(4.0) / (std::exp(1.0) + std::exp(2.0) + std::exp(3.0) + std::exp(4.0));
  EXPECT_NEAR(g[7], (s4 - 1) / 2, 1e-6);
}

TEST(SoftmaxCrossEntropy, SmoothingAndIgnoreMatchReference) {
  const std::int64_t rows = 6, classes = 5;
  Tensor logits = Tensor::empty({rows, classes}, DType::F64);
  ops::fill_uniform(logits, -3, 3, 21);
  std::vector<std::int64_t> t = {0, 4, -100, 2, 1, -100};
  for (double eps : {0.0, 0.1, 0.5}) {
    SoftmaxCrossEntropy loss_fn(eps);
    Context ctx;
    double loss = loss_fn.forward(ctx, logits, Tensor::from_vector<std::int64_t>(t, {rows})).item();
    EXPECT_NEAR(loss, reference_loss(logits.to_vector<double>(), classes, t, eps, -100), 1e-6)
        << "eps " << eps;
    EXPECT_EQ(loss_fn.counted_rows().item(), 4.0);
    std::vector<double> g = loss_fn.backward(ctx).to_vector<double>();
    for (std::int64_t c = 0; c < classes; ++c) {
      EXPECT_EQ(g[2 * classes + c], 0.0);  // ignored rows get no gradient
      EXPECT_EQ(g[5 * classes + c], 0.0);
    }
  }
}

TEST(SoftmaxCrossEntropy, GradientMatchesFiniteDifferences) {
  const std::int64_t rows = 4, classes = 6;
  Tensor logits = Tensor::empty({rows, classes}, DType::F64);
  ops::fill_uniform(logits, -2, 2, 5);
  Tensor targets = Tensor::from_vector<std::int64_t>({3, 7, 0, 5}, {rows});
  const double scale = 3.0, h = 1e-2;
  SoftmaxCrossEntropy loss_fn(0.2, 7);
  Context ctx;
  ctx.step.loss_scale = &scale;
  loss_fn.forward(ctx, logits, targets);
  Tensor grad = loss_fn.backward(ctx);
  EXPECT_EQ(grad.dtype(), DType::F64);
  std::vector<double> analytic = grad.to_vector<double>();
  double* x = logits.data<double>();
  int nonzero = 0;
  for (std::int64_t i = 0; i < rows * classes; ++i) {
    double saved = x[i];
    x[i] = saved + h;
    double plus = loss_fn.forward(ctx, logits, targets).item();
    x[i] = saved - h;
    double minus = loss_fn.forward(ctx, logits, targets).item();
    x[i] = saved;
    // The loss comes back in f32: central differences are good to ~1e-5 here.
    double numeric = scale * (plus - minus) / (2 * h);
    EXPECT_NEAR(analytic[i], numeric, 2e-4) << "element " << i;
    nonzero += analytic[i] != 0;
  }
  EXPECT_EQ(nonzero, (rows - 1) * classes);  // the ignored row (target 7) has no gradient
}

TEST(SoftmaxCrossEntropy, AllIgnoredGivesZeroNotNaN) {
  SoftmaxCrossEntropy loss_fn(0.1);
  Context ctx;
  Tensor logits = Tensor::empty({3, 4}, DType::F32);
  ops::fill_uniform(logits, -1, 1, 2);
  Tensor loss =
      loss_fn.forward(ctx, logits, Tensor::from_vector<std::int64_t>({-100, -100, -100}, {3}));
  EXPECT_EQ(loss.item(), 0.0);
  EXPECT_EQ(loss_fn.counted_rows().item(), 0.0);
  for (float g : loss_fn.backward(ctx).to_vector<float>()) EXPECT_EQ(g, 0.0f);
}

TEST(SoftmaxCrossEntropy, OutOfRangeTargetIsAnError) {
  SoftmaxCrossEntropy loss_fn;
  Context ctx;
  Tensor logits = Tensor::zeros({2, 3}, DType::F32);
  EXPECT_THROW(loss_fn.forward(ctx, logits, Tensor::from_vector<std::int64_t>({0, 3}, {2})),
               InputError);
  EXPECT_THROW(loss_fn.forward(ctx, logits, Tensor::from_vector<std::int64_t>({-1, 0}, {2})),
               InputError);
  EXPECT_THROW(SoftmaxCrossEntropy(1.5), InputError);
}

TEST(SoftmaxCrossEntropy, SequenceLogitsAndScale) {
  // (B, T, C) logits: every position is a row; the gradient keeps the logits' shape.
  Tensor logits = Tensor::empty({2, 3, 4}, DType::F32);
  ops::fill_uniform(logits, -1, 1, 8);
  Tensor targets = Tensor::from_vector<std::int64_t>({0, 1, -100, 3, 2, 1}, {2, 3});
  SoftmaxCrossEntropy loss_fn;
  Context ctx;
  double loss = loss_fn.forward(ctx, logits, targets).item();
  std::vector<float> values = logits.to_vector<float>();
  std::vector<double> flat(values.begin(), values.end());
  EXPECT_NEAR(loss, reference_loss(flat, 4, {0, 1, -100, 3, 2, 1}, 0.0, -100), 1e-6);
  Tensor g1 = loss_fn.backward(ctx);
  EXPECT_EQ(g1.shape(), (Shape{2, 3, 4}));
  // Backward drops what forward saved (as autograd frees its graph): a second one needs a forward.
  const double four = 4.0;
  ctx.step.loss_scale = &four;
  EXPECT_THROW(loss_fn.backward(ctx), Error);
  loss_fn.forward(ctx, logits, targets);
  std::vector<float> a = g1.to_vector<float>(), b = loss_fn.backward(ctx).to_vector<float>();
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], 4 * a[i], 1e-6) << i;
}

TEST(SoftmaxCrossEntropy, LossScaleOverDivisorIsBitIdenticalToTheQuotient) {
  // Context::step (CUDA graphs replay it): (*loss_scale) / divisor, read when the pass runs, is
  // bit for bit the host's quotient S / M.
  Tensor targets = Tensor::from_vector<std::int64_t>({0, 4, -100, 3, 2, 1, 4}, {7});
  for (DType dtype : {DType::F32, DType::F64}) {
    Tensor logits = Tensor::empty({7, 5}, dtype);
    ops::fill_uniform(logits, -2, 2, 9);
    SoftmaxCrossEntropy loss_fn(0.1);
    const double loss_scale = 65536.0;
    const std::int64_t micro_steps = 3;
    Context quotient;
    const double host_quotient = loss_scale / micro_steps;
    quotient.step.loss_scale = &host_quotient;
    loss_fn.forward(quotient, logits, targets);
    Tensor want = loss_fn.backward(quotient);

    double source = loss_scale;
    Context ctx;
    ctx.step.loss_scale = &source;
    ctx.step.loss_scale_divisor = micro_steps;
    loss_fn.forward(ctx, logits, targets);
    Tensor got = loss_fn.backward(ctx);
    if (dtype == DType::F32) {
      EXPECT_EQ(got.to_vector<float>(), want.to_vector<float>());
    } else {
      EXPECT_EQ(got.to_vector<double>(), want.to_vector<double>());
    }
    // The value at the address acts: half the scale, half the gradient.
    source = loss_scale / 2;
    loss_fn.forward(ctx, logits, targets);
    std::vector<double> half = loss_fn.backward(ctx).to(DType::F64).to_vector<double>();
    std::vector<double> full = want.to(DType::F64).to_vector<double>();
    for (std::size_t i = 0; i < full.size(); ++i) EXPECT_EQ(half[i] * 2, full[i]) << i;
  }
}

TEST(SoftmaxCrossEntropy, NonPositiveLossScaleDivisorIsAnError) {
  Tensor logits = Tensor::empty({2, 3}, DType::F32);
  ops::fill_uniform(logits, -1, 1, 3);
  SoftmaxCrossEntropy loss_fn;
  Context ctx;
  double source = 4.0;
  ctx.step.loss_scale = &source;
  ctx.step.loss_scale_divisor = 0;
  loss_fn.forward(ctx, logits, Tensor::from_vector<std::int64_t>({0, 2}, {2}));
  EXPECT_THROW(loss_fn.backward(ctx), Error);
}

TEST(SoftmaxCrossEntropy, RowsInChunksEqualTheWholeBatchBitForBit) {
  // The chunked head's loss (train/loss_stage.h): the batch's rows in uneven chunks give the
  // whole batch's loss, counts and gradient to the bit, with smoothing, ignored rows and a loss
  // scale over micro-steps.
  Tensor targets = Tensor::from_vector<std::int64_t>({0, 4, -100, 3, 2, 1, 4, -100, 0}, {9});
  for (DType dtype : {DType::F32, DType::F64}) {
    Tensor logits = Tensor::empty({9, 5}, dtype);
    ops::fill_uniform(logits, -2, 2, 17);
    double scale = 1024.0;
    Context ctx;
    ctx.step.loss_scale = &scale;
    ctx.step.loss_scale_divisor = 3;
    SoftmaxCrossEntropy whole(0.1);
    const double want = whole.forward(ctx, logits, targets).item();
    const double want_correct = whole.correct_count().item();
    std::vector<double> want_grad = whole.backward(ctx).to(DType::F64).to_vector<double>();

    SoftmaxCrossEntropy chunked(0.1);
    Tensor rows = logits.clone();
    chunked.begin_rows(targets, 5);
    for (auto [first, last] : {std::pair<int, int>{0, 4}, {4, 5}, {5, 9}})
      chunked.forward_rows_with_gradient(ctx, rows.slice(0, first, last), first);
    EXPECT_EQ(chunked.finish_rows().item(), want);
    EXPECT_EQ(chunked.counted_rows().item(), 7.0);
    EXPECT_EQ(chunked.correct_count().item(), want_correct);
    EXPECT_EQ(rows.to(DType::F64).to_vector<double>(), want_grad);
  }
}

TEST(SoftmaxCrossEntropy, RowsOutsideTheBatchOrABadTargetAreErrors) {
  SoftmaxCrossEntropy loss_fn;
  Context ctx;
  EXPECT_THROW(loss_fn.forward_rows_with_gradient(ctx, Tensor::zeros({2, 3}, DType::F32), 0),
               Error);  // before begin_rows
  loss_fn.begin_rows(Tensor::from_vector<std::int64_t>({0, 2, 1}, {3}), 3);
  EXPECT_THROW(loss_fn.forward_rows_with_gradient(ctx, Tensor::zeros({2, 3}, DType::F32), 2),
               Error);  // rows 2..3 of 3
  EXPECT_THROW(loss_fn.begin_rows(Tensor::from_vector<std::int64_t>({0, 3}, {2}), 3), InputError);
}

}  // namespace
}  // namespace kiln
