// Dense layers on the CPU: f64 finite-difference gradient checks, closed forms, dropout masks,
// the accumulate contract, and the MLP learning a tiny problem with plain SGD.

#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "core/ops.h"
#include "layers/activations.h"
#include "layers/dropout.h"
#include "layers/gradient_check.h"
#include "layers/linear.h"
#include "layers/models/model.h"
#include "layers/reshape.h"
#include "layers/softmax_cross_entropy.h"

namespace kiln {
namespace {

Tensor random_tensor(const Shape& shape, std::uint64_t seed, DType dtype = DType::F64,
                     double low = -1.0, double high = 1.0) {
  Tensor t = Tensor::empty(shape, dtype);
  ops::fill_uniform(t, low, high, seed);
  return t;
}

struct LinearCase {
  bool bias;
  Activation activation;
  Shape input;
};

class LinearGradient : public ::testing::TestWithParam<LinearCase> {};

TEST_P(LinearGradient, MatchesFiniteDifferences) {
  const LinearCase& c = GetParam();
  Linear layer(c.input.back(), 4, c.bias, c.activation);
  layer.reset_parameters(7);
  layer.to(Device::cpu(), DType::F64);
  Context ctx;
  GradientCheckResult r = check_layer_gradients(layer, ctx, random_tensor(c.input, 11));
  EXPECT_TRUE(r.ok) << r.report;
  // Kinks are rare on random inputs; nearly everything must actually be compared.
  std::int64_t elements = shape_numel(c.input) + 4 * c.input.back() + (c.bias ? 4 : 0);
  EXPECT_GE(r.checked, elements - 2) << r.report;
}

std::vector<LinearCase> linear_cases() {
  std::vector<LinearCase> cases;
  for (bool bias : {true, false}) {
    for (Activation a :
         {Activation::None, Activation::ReLU, Activation::GELU, Activation::GELUErf}) {
      cases.push_back({bias, a, {3, 5}});
      cases.push_back({bias, a, {2, 3, 5}});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Dense, LinearGradient, ::testing::ValuesIn(linear_cases()),
                         [](const ::testing::TestParamInfo<LinearCase>& info) {
                           const LinearCase& c = info.param;
                           return std::string(c.bias ? "bias_" : "nobias_") +
                                  activation_name(c.activation) + "_" +
                                  std::to_string(c.input.size()) + "d";
                         });

TEST(Linear, ForwardMatchesClosedForm) {
  Linear layer(3, 2, true, Activation::ReLU);
  layer.weight().value.copy_from(Tensor::from_vector<float>({1, 2, 3, -1, -2, -3}, {2, 3}));
  layer.bias()->value.copy_from(Tensor::from_vector<float>({0.5f, 0.25f}, {2}));
  Context ctx;
  Tensor x = Tensor::from_vector<float>({1, 0, -1, 2, 1, 0}, {2, 3});
  std::vector<float> y = layer.forward(ctx, x).to_vector<float>();
  // rows: (1*1 + 0*2 - 1*3 + 0.5, -(1 - 3) + 0.25) and (2 + 2 + 0.5, -(2 + 2) + 0.25), then ReLU
  std::vector<float> expected = {0.0f, 2.25f, 4.5f, 0.0f};
  ASSERT_EQ(y.size(), expected.size());
  for (std::size_t i = 0; i < y.size(); ++i) EXPECT_FLOAT_EQ(y[i], expected[i]) << i;
}

TEST(Linear, ShapesNamesInitAndFlops) {
  Linear layer(16, 8);
  EXPECT_EQ(layer.output_shape({2, 5, 16}), (Shape{2, 5, 8}));
  EXPECT_DOUBLE_EQ(layer.forward_flops({2, 5, 16}), 2.0 * 10 * 16 * 8);
  std::vector<Parameter*> params = layer.parameters();
  ASSERT_EQ(params.size(), 2u);
  EXPECT_EQ(params[0]->name, "weight");
  EXPECT_EQ(params[1]->name, "bias");
  EXPECT_FALSE(params[0]->no_weight_decay);
  EXPECT_TRUE(params[1]->no_weight_decay);
  layer.reset_parameters(3);
  std::vector<float> w = layer.weight().value.to_vector<float>();
  double bound = 1.0 / std::sqrt(16.0), max_abs = 0, sum = 0;
  for (float v : w) {
    max_abs = std::max(max_abs, std::fabs(static_cast<double>(v)));
    sum += v;
  }
  EXPECT_LE(max_abs, bound);
  EXPECT_GT(max_abs, 0.8 * bound);  // spread over the interval, not a constant
  EXPECT_LT(std::fabs(sum / static_cast<double>(w.size())), 0.1);
  std::vector<float> first = w;
  layer.reset_parameters(3);
  EXPECT_EQ(layer.weight().value.to_vector<float>(), first);
  layer.reset_parameters(4);
  EXPECT_NE(layer.weight().value.to_vector<float>(), first);
  EXPECT_THROW(Linear(0, 3), InputError);
}

TEST(Linear, ParameterGradientsAccumulate) {
  Linear layer(5, 3, true, Activation::GELU);
  layer.reset_parameters(1);
  Context ctx;
  Tensor x = random_tensor({4, 5}, 2, DType::F32);
  Tensor dy = random_tensor({4, 3}, 3, DType::F32);
  layer.forward(ctx, x);
  Tensor dx1 = layer.backward(ctx, dy);
  std::vector<float> w1 = layer.weight().grad.to_vector<float>();
  std::vector<float> b1 = layer.bias()->grad.to_vector<float>();
  layer.forward(ctx, x);
  Tensor dx2 = layer.backward(ctx, dy);
  std::vector<float> w2 = layer.weight().grad.to_vector<float>();
  std::vector<float> b2 = layer.bias()->grad.to_vector<float>();
  for (std::size_t i = 0; i < w1.size(); ++i) EXPECT_NEAR(w2[i], 2 * w1[i], 1e-5) << i;
  for (std::size_t i = 0; i < b1.size(); ++i) EXPECT_NEAR(b2[i], 2 * b1[i], 1e-5) << i;
  // Input gradients are written, not accumulated.
  EXPECT_EQ(dx1.to_vector<float>(), dx2.to_vector<float>());
  double nonzero = 0;
  for (float v : w1) nonzero += std::fabs(v);
  EXPECT_GT(nonzero, 0);
}

TEST(Gelu, ValuesOfBothForms) {
  EXPECT_NEAR(gelu_erf(1.0), 0.8413447460685429, 1e-14);
  EXPECT_NEAR(gelu_erf(-2.0), -0.04550026389635842, 1e-14);
  EXPECT_NEAR(gelu_tanh(1.0), 0.8411919906082768, 1e-14);
  EXPECT_NEAR(gelu_tanh(-2.0), -0.04540230591222885, 1e-14);
  GELU layer(GeluForm::Tanh);
  Context ctx;
  std::vector<float> y =
      layer.forward(ctx, Tensor::from_vector<float>({1.0f, -2.0f}, {2})).to_vector<float>();
  EXPECT_NEAR(y[0], 0.8411919906082768, 1e-6);
  EXPECT_NEAR(y[1], -0.04540230591222885, 1e-6);
}

TEST(Gelu, GradientsOfBothForms) {
  for (GeluForm form : {GeluForm::Erf, GeluForm::Tanh}) {
    GELU layer(form);
    Context ctx;
    GradientCheckResult r =
        check_layer_gradients(layer, ctx, random_tensor({3, 4, 5}, 5, DType::F64, -3, 3));
    EXPECT_TRUE(r.ok) << r.report;
    EXPECT_EQ(r.checked, 60) << r.report;
  }
}

TEST(Dropout, GradientIsMaskTimesDyOverKeep) {
  const double p = 0.3;
  Dropout layer(p);
  Context ctx;
  ctx.run.seed = 42;
  std::uint64_t step = 7;
  ctx.step.step = &step;
  Tensor x = random_tensor({64, 33}, 9, DType::F32, 0.5, 1.5);  // never zero
  Tensor dy = random_tensor({64, 33}, 10, DType::F32, 0.5, 1.5);
  std::vector<float> xv = x.to_vector<float>(), yv = layer.forward(ctx, x).to_vector<float>();
  std::vector<float> dyv = dy.to_vector<float>(), dxv = layer.backward(ctx, dy).to_vector<float>();
  std::uint64_t key = layer.mask_key(ctx);
  std::int64_t kept = 0;
  for (std::size_t i = 0; i < xv.size(); ++i) {
    bool keep = dropout_keep(key, 7, i, p);
    kept += keep;
    EXPECT_FLOAT_EQ(yv[i], keep ? static_cast<float>(xv[i] / (1 - p)) : 0.0f) << i;
    EXPECT_FLOAT_EQ(dxv[i], keep ? static_cast<float>(dyv[i] / (1 - p)) : 0.0f) << i;
  }
  double kept_fraction = static_cast<double>(kept) / static_cast<double>(xv.size());
  EXPECT_NEAR(kept_fraction, 1 - p, 0.03);
}

TEST(Dropout, MaskReplaysFromSeedAndStep) {
  Dropout layer(0.5), other(0.5);
  Context ctx;
  ctx.run.seed = 1;
  std::uint64_t step = 3;
  ctx.step.step = &step;
  Tensor x = random_tensor({1000}, 4, DType::F32, 1.0, 2.0);
  std::vector<float> a = layer.forward(ctx, x).to_vector<float>();
  step = 4;
  std::vector<float> b = layer.forward(ctx, x).to_vector<float>();
  step = 3;
  std::vector<float> c = layer.forward(ctx, x).to_vector<float>();
  std::vector<float> d = other.forward(ctx, x).to_vector<float>();
  ctx.run.seed = 2;
  std::vector<float> e = layer.forward(ctx, x).to_vector<float>();
  EXPECT_EQ(a, c);  // the same step replays the same mask
  EXPECT_NE(a, b);  // another step, another mask
  EXPECT_NE(a, d);  // another layer, another mask
  EXPECT_NE(a, e);  // another seed, another mask
}

TEST(Dropout, StepCounterGivesTheStepsMaskReadWhenRun) {
  // Context::step.step (CUDA graphs replay it): the step at the address when the pass runs picks
  // the mask.
  Dropout layer(0.4);
  Tensor x = random_tensor({37, 29}, 11, DType::F32, 0.5, 1.5);
  Tensor dy = random_tensor({37, 29}, 12, DType::F32, 0.5, 1.5);
  Context fixed;
  fixed.run.seed = 8;
  const std::uint64_t seven = 7, eight = 8;
  fixed.step.step = &seven;
  std::vector<float> y7 = layer.forward(fixed, x).to_vector<float>();
  std::vector<float> dx7 = layer.backward(fixed, dy).to_vector<float>();
  fixed.step.step = &eight;
  std::vector<float> y8 = layer.forward(fixed, x).to_vector<float>();
  std::vector<float> dx8 = layer.backward(fixed, dy).to_vector<float>();
  ASSERT_NE(y7, y8);

  std::uint64_t step = 7;
  Context ctx;
  ctx.run.seed = 8;
  ctx.step.step = &step;
  EXPECT_EQ(layer.forward(ctx, x).to_vector<float>(), y7);
  EXPECT_EQ(layer.backward(ctx, dy).to_vector<float>(), dx7);
  step = 8;  // the same context, the next step
  EXPECT_EQ(layer.forward(ctx, x).to_vector<float>(), y8);
  EXPECT_EQ(layer.backward(ctx, dy).to_vector<float>(), dx8);
  // Backward reads the address when it runs, as a replayed graph does, not at forward.
  layer.forward(ctx, x);
  step = 7;
  EXPECT_EQ(layer.backward(ctx, dy).to_vector<float>(), dx7);
}

TEST(Dropout, EvalIsIdentityAndBadProbabilityIsAnError) {
  Dropout layer(0.9);
  layer.set_training(false);
  Context ctx;
  ctx.training = false;
  Tensor x = random_tensor({5, 6}, 1, DType::F32);
  EXPECT_EQ(layer.forward(ctx, x).to_vector<float>(), x.to_vector<float>());
  Tensor dy = random_tensor({5, 6}, 2, DType::F32);
  EXPECT_EQ(layer.backward(ctx, dy).to_vector<float>(), dy.to_vector<float>());
  EXPECT_THROW(Dropout(1.5), InputError);
  EXPECT_THROW(Dropout(-0.1), InputError);
}

TEST(Dropout, GradientCheckWithFixedMask) {
  Dropout layer(0.4);
  Context ctx;
  ctx.run.seed = 5;
  const std::uint64_t step = 2;
  ctx.step.step = &step;
  GradientCheckResult r = check_layer_gradients(layer, ctx, random_tensor({4, 7}, 3));
  EXPECT_TRUE(r.ok) << r.report;
  EXPECT_EQ(r.checked, 28) << r.report;
}

TEST(Reshape, ShapesAndGradients) {
  Flatten flatten;
  EXPECT_EQ(flatten.output_shape({2, 3, 4, 5}), (Shape{2, 60}));
  Reshape reshape({-1, 4});
  EXPECT_EQ(reshape.output_shape({2, 3, 8}), (Shape{2, 6, 4}));
  EXPECT_THROW(Reshape({-1, -1}), InputError);
  Context ctx;
  Tensor x = random_tensor({2, 3, 4}, 1);
  Tensor y = flatten.forward(ctx, x);
  EXPECT_EQ(y.shape(), (Shape{2, 12}));
  EXPECT_EQ(y.to_vector<double>(), x.to_vector<double>());
  Tensor dx = flatten.backward(ctx, random_tensor({2, 12}, 2));
  EXPECT_EQ(dx.shape(), (Shape{2, 3, 4}));
  for (Layer* layer : std::vector<Layer*>{&flatten, &reshape}) {
    GradientCheckResult r = check_layer_gradients(*layer, ctx, random_tensor({2, 3, 8}, 6));
    EXPECT_TRUE(r.ok) << r.report;
    EXPECT_EQ(r.checked, 48) << r.report;
  }
}

TEST(GradientCheck, CatchesAWrongGradient) {
  // A layer whose backward is off by a factor must fail the checker (the checker can fail).
  class Doubler : public Layer {
   public:
    std::string type() const override { return "Doubler"; }
    Shape output_shape(const Shape& s) const override { return s; }

   protected:
    Tensor forward_impl(Context&, const Tensor& x) override {
      Tensor y = x.clone();
      ops::scale(y, 2.0);
      return y;
    }
    Tensor backward_impl(Context&, const Tensor& dy) override { return dy.clone(); }  // wrong
  };
  Doubler layer;
  Context ctx;
  GradientCheckResult r = check_layer_gradients(layer, ctx, random_tensor({3, 3}, 1));
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.failures, 9);
}

TEST(Mlp, StructureAndParameterCount) {
  ModelOptions options;  // 1x28x28, 10 classes
  options.mlp_hidden = {256, 128};
  Model model = make_mlp(options);
  EXPECT_EQ(model.sample_shape, (Shape{1, 28, 28}));
  EXPECT_EQ(model.num_outputs, 10);
  EXPECT_EQ(model.net->parameter_count(), 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
  EXPECT_EQ(model.net->output_shape({32, 1, 28, 28}), (Shape{32, 10}));
  EXPECT_DOUBLE_EQ(model.net->forward_flops({1, 1, 28, 28}),
                   2.0 * (784 * 256 + 256 * 128 + 128 * 10));
  std::vector<Parameter*> params = model.net->parameters();
  ASSERT_EQ(params.size(), 6u);
  EXPECT_EQ(params[0]->name, "fc1.weight");
  EXPECT_EQ(params[5]->name, "fc3.bias");
}

TEST(Mlp, SgdReducesTheLossOnATinyProblem) {
  ModelOptions options;
  options.image_size = 4;
  options.num_classes = 3;
  options.mlp_hidden = {16};
  Model model = make_mlp(options);
  model.net->reset_parameters(1);
  // 24 samples whose class is the quadrant with the largest mean: learnable by an MLP.
  const std::int64_t batch = 24;
  Tensor x = random_tensor({batch, 1, 4, 4}, 77, DType::F32);
  std::vector<float> xv = x.to_vector<float>();
  std::vector<std::int64_t> labels(batch);
  for (std::int64_t i = 0; i < batch; ++i) {
    double s[3] = {0, 0, 0};
    for (int j = 0; j < 16; ++j) s[j % 3] += xv[i * 16 + j];
    labels[i] = std::max_element(s, s + 3) - s;
  }
  Tensor targets = Tensor::from_vector<std::int64_t>(labels, {batch});
  SoftmaxCrossEntropy loss_fn;
  Context ctx;
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    for (Parameter* p : model.net->parameters()) p->grad.zero();
    Tensor logits = model.net->forward(ctx, x);
    double loss = loss_fn.forward(ctx, logits, targets).item();
    if (step == 0) first = loss;
    last = loss;
    model.net->backward(ctx, loss_fn.backward(ctx));
    for (Parameter* p : model.net->parameters()) ops::axpy(-0.5, p->grad, p->value);
    ++ctx.weights_version;
  }
  EXPECT_TRUE(std::isfinite(last));
  EXPECT_LT(last, 0.5 * first) << "first " << first << " last " << last;
}

// backward(reuse_logits) writes the gradient over the forward's logits: the same values
// as into a fresh tensor.
TEST(SoftmaxCrossEntropy, GradientOverTheLogitsEqualsAFreshOne) {
  Tensor logits = random_tensor({6, 50}, 5, DType::F32);
  Tensor targets = Tensor::from_vector<std::int64_t>({1, 49, -100, 0, 7, 3}, {6});
  Context ctx;
  const double loss_scale = 8.0;
  ctx.step.loss_scale = &loss_scale;
  SoftmaxCrossEntropy loss_fn(0.1);
  loss_fn.forward(ctx, logits, targets);
  const std::vector<float> fresh = loss_fn.backward(ctx).to_vector<float>();
  Tensor own = logits.clone();
  loss_fn.forward(ctx, own, targets);
  Tensor reused = loss_fn.backward(ctx, /*reuse_logits=*/true);
  EXPECT_EQ(reused.data(), own.data());
  EXPECT_EQ(reused.to_vector<float>(), fresh);
}

}  // namespace
}  // namespace kiln
