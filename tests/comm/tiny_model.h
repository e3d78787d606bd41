#pragma once
// A tiny model built directly from kiln::Layer for the data-parallel tests (no dependency on the
// layers other engineers write): Linear -> Square -> Linear, computed with core ops only, so the
// same code runs on the CPU and on CUDA. Parameter gradients are accumulated (+=), input
// gradients written (=), as layers/layer.h demands.

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "core/ops.h"
#include "layers/layer.h"

namespace kiln::testing {

// y = x W^T + b.   x (B, in), W (out, in), b (out), y (B, out).
class TestLinear : public Layer {
 public:
  TestLinear(std::int64_t in, std::int64_t out) : in_(in), out_(out) {
    weight_ = &add_parameter("weight", {out, in});
    bias_ = &add_parameter("bias", {out}, /*no_weight_decay=*/true);
    add_buffer("forward_count", {1}, 0.0);  // a buffer for the broadcast test
  }
  std::string type() const override { return "TestLinear"; }
  Shape output_shape(const Shape& input) const override { return {input[0], out_}; }
  void reset_parameters(std::uint64_t seed) override {
    const double bound = 1.0 / std::sqrt(static_cast<double>(in_));
    ops::fill_uniform(weight_->value, -bound, bound, seed, 0);
    ops::fill_uniform(bias_->value, -bound, bound, seed, 1u << 20);
  }

 protected:
  Tensor forward_impl(Context&, const Tensor& x) override {
    x_ = x;
    Tensor y = Tensor::empty({x.size(0), out_}, x.dtype(), x.device());  // (B, out)
    ops::gemm(false, true, 1.0, x, weight_->value, 0.0, y);
    Tensor ones = Tensor::full({x.size(0), 1}, 1.0, x.dtype(), x.device());  // (B, 1)
    ops::gemm(false, false, 1.0, ones, bias_->value.view({1, out_}), 1.0, y);
    return y;
  }
  Tensor backward_impl(Context&, const Tensor& dy) override {
    // dW += dy^T x; db += 1^T dy; dx = dy W.
    ops::gemm(true, false, 1.0, dy, x_, 1.0, weight_->grad);
    Tensor ones = Tensor::full({dy.size(0), 1}, 1.0, dy.dtype(), dy.device());  // (B, 1)
    Tensor db = bias_->grad.view({1, out_});
    ops::gemm(true, false, 1.0, ones, dy, 1.0, db);
    Tensor dx = Tensor::empty({dy.size(0), in_}, dy.dtype(), dy.device());  // (B, in)
    ops::gemm(false, false, 1.0, dy, weight_->value, 0.0, dx);
    return dx;
  }

 private:
  std::int64_t in_, out_;
  Parameter* weight_;
  Parameter* bias_;
  Tensor x_;
};

// y = x * x; dx = 2 x dy.
class TestSquare : public Layer {
 public:
  std::string type() const override { return "TestSquare"; }
  Shape output_shape(const Shape& input) const override { return input; }

 protected:
  Tensor forward_impl(Context&, const Tensor& x) override {
    x_ = x;
    return ops::mul(x, x);
  }
  Tensor backward_impl(Context&, const Tensor& dy) override {
    Tensor dx = ops::mul(x_, dy);
    ops::scale(dx, 2.0);
    return dx;
  }

 private:
  Tensor x_;
};

constexpr std::int64_t kIn = 6, kHidden = 16, kOut = 5;

// Linear(6, 16) -> Square -> Linear(16, 5) [-> an unused Linear(5, 3) when `with_unused`].
inline std::unique_ptr<Sequential> make_tiny_model(std::uint64_t seed, Device device, DType dtype,
                                                   bool with_unused = false) {
  auto model = std::make_unique<Sequential>();
  model->add("fc1", std::make_unique<TestLinear>(kIn, kHidden));
  model->add("square", std::make_unique<TestSquare>());
  model->add("fc2", std::make_unique<TestLinear>(kHidden, kOut));
  model->set_name("");
  model->reset_parameters(seed);
  if (with_unused) {
    // Registered as a parameter owner but never called: its hook never fires.
    auto holder = std::make_unique<Sequential>();
    holder->add("body", std::move(model));
    auto& unused = holder->add("unused", std::make_unique<TestLinear>(kOut, 3));
    unused.reset_parameters(seed + 99);
    holder->set_name("");
    holder->to(device, dtype);
    return holder;
  }
  model->to(device, dtype);
  return model;
}

// The model's forward/backward path (skipping an unused tail layer).
inline Layer& active_part(Sequential& model, bool with_unused) {
  return with_unused ? *model.layers()[0] : model;
}

// Mean-squared-error gradient: dy = 2 (y - t) / (denominator * outputs).
inline Tensor mse_grad(const Tensor& y, const Tensor& t, std::int64_t denominator) {
  Tensor dy = y.clone();
  ops::axpy(-1.0, t, dy);
  ops::scale(dy, 2.0 / static_cast<double>(denominator * y.size(1)));
  return dy;
}

// The fixed global batch of `step`: inputs (B, kIn) and targets (B, kOut).
inline void global_batch(std::uint64_t step, std::int64_t batch, Device device, DType dtype,
                         Tensor& x, Tensor& t) {
  x = Tensor::empty({batch, kIn}, dtype, device);
  t = Tensor::empty({batch, kOut}, dtype, device);
  ops::fill_normal(x, 0.0, 1.0, 1000 + step, 0);
  ops::fill_normal(t, 0.0, 1.0, 2000 + step, 0);
}

inline void sgd_step(const std::vector<Parameter*>& params, double lr) {
  for (Parameter* p : params) ops::axpy(-lr, p->grad, p->value);
}

// All parameter values concatenated, on the host, as f64.
inline std::vector<double> parameter_values(Layer& model) {
  std::vector<double> out;
  for (Parameter* p : model.parameters()) {
    std::vector<double> v = p->value.to_vector<double>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

inline double max_relative_difference(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    diff = std::max(diff, std::fabs(a[i] - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  return a.size() == b.size() ? diff / scale : INFINITY;
}

// Single-process reference: `steps` SGD steps on the whole global batch.
inline std::vector<double> reference_run(std::uint64_t seed, Device device, DType dtype, int steps,
                                         std::int64_t batch, double lr) {
  auto model = make_tiny_model(seed, device, dtype);
  Context ctx;
  ctx.run.device = device;
  auto params = model->parameters();
  for (int s = 0; s < steps; ++s) {
    for (Parameter* p : params) p->grad.zero();
    Tensor x, t;
    global_batch(s, batch, device, dtype, x, t);
    Tensor y = model->forward(ctx, x);
    model->backward(ctx, mse_grad(y, t, batch));
    sgd_step(params, lr);
  }
  return parameter_values(*model);
}

}  // namespace kiln::testing
