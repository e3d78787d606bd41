#pragma once
// A finite-difference gradient checker for any Layer, in f64 on the CPU (Caffe's
// GradientChecker, with a generic kink test instead of a per-layer kink range).
//
// The scalar checked is L = sum(y * w) for a fixed random w of the output's shape, so
// dL/dy = w is what backward receives. The layer must already be on the CPU in f64
// (layer.to(Device::cpu(), DType::F64)); the checker runs it with activation = matmul = F64.
//
// For each checked element e of the input and of every parameter, the central difference
// (L(e+h) - L(e-h)) / 2h is compared with the analytic gradient under
// |analytic - numeric| <= abs_tolerance + rel_tolerance * max(|analytic|, |numeric|).
// Kinks (ReLU at 0, dropout never, max-pool ties): where the one-sided differences
// (L(e+h) - L(e)) / h and (L(e) - L(e-h)) / h disagree by more than kink_threshold, the
// function is not differentiable within h of e and the element is skipped (counted).
//
// Usage (in a GoogleTest):
//   kiln::GradientCheckResult r = kiln::check_layer_gradients(layer, ctx, x);
//   EXPECT_TRUE(r.ok) << r.report;
//   EXPECT_GT(r.checked, 0);

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "core/ops.h"
#include "core/tensor.h"
#include "layers/layer.h"

namespace kiln {

struct GradientCheckOptions {
  double step = 1e-5;           // h
  double abs_tolerance = 1e-6;  // f64 central differences are good to ~h^2 and 1e-16/h
  double rel_tolerance = 1e-5;
  double kink_threshold = 1e-3;  // one-sided slopes differing by more than this: a kink
  bool check_input = true;       // false for integer inputs (embeddings)
  std::int64_t max_elements_per_tensor = 400;  // beyond this, a strided sample is checked
  std::uint64_t seed = 1234;                   // of the output weights w
};

struct GradientCheckResult {
  bool ok = true;
  std::int64_t checked = 0;  // elements compared
  std::int64_t skipped = 0;  // elements at a kink
  std::int64_t failures = 0;
  double max_abs_error = 0;
  std::string report;  // one line per failure (the first 20), then a summary
};

namespace gradient_check_detail {

// L = sum(y * w) in f64 for a fresh forward at the current values.
inline double objective(Layer& layer, Context& ctx, const Tensor& x, const std::vector<double>& w) {
  Tensor y = layer.forward(ctx, x);
  std::vector<double> yv = y.to_vector<double>();
  KILN_CHECK(yv.size() == w.size(), "gradient check: the output changed size between forwards");
  double sum = 0;
  for (std::size_t i = 0; i < yv.size(); ++i) sum += yv[i] * w[i];
  return sum;
}

inline void compare_tensor(const std::string& what, double* values, std::int64_t n,
                           const std::vector<double>& analytic, Layer& layer, Context& ctx,
                           const Tensor& x, const std::vector<double>& w, double center,
                           const GradientCheckOptions& opt, GradientCheckResult& result,
                           std::ostringstream& failures) {
  std::int64_t stride =
      std::max<std::int64_t>(1, (n + opt.max_elements_per_tensor - 1) /
                                    std::max<std::int64_t>(opt.max_elements_per_tensor, 1));
  for (std::int64_t i = 0; i < n; i += stride) {
    double saved = values[i];
    // Caches keyed by weights_version (O1 half weights) must see the perturbed value.
    values[i] = saved + opt.step;
    ++ctx.weights_version;
    double plus = objective(layer, ctx, x, w);
    values[i] = saved - opt.step;
    ++ctx.weights_version;
    double minus = objective(layer, ctx, x, w);
    values[i] = saved;
    ++ctx.weights_version;
    double forward_slope = (plus - center) / opt.step;
    double backward_slope = (center - minus) / opt.step;
    double numeric = (plus - minus) / (2 * opt.step);
    double scale = std::max({1.0, std::fabs(forward_slope), std::fabs(backward_slope)});
    if (std::fabs(forward_slope - backward_slope) > opt.kink_threshold * scale) {
      ++result.skipped;
      continue;
    }
    ++result.checked;
    double a = analytic[static_cast<std::size_t>(i)];
    double err = std::fabs(a - numeric);
    result.max_abs_error = std::max(result.max_abs_error, err);
    bool bad = !(err <= opt.abs_tolerance +
                            opt.rel_tolerance * std::max(std::fabs(a), std::fabs(numeric)));
    if (bad) {
      ++result.failures;
      result.ok = false;
      if (result.failures <= 20) {
        failures << what << "[" << i << "]: analytic " << a << ", numeric " << numeric << ", error "
                 << err << "\n";
      }
    }
  }
}

}  // namespace gradient_check_detail

// Checks dL/dx and dL/dp for every parameter p of `layer` (children included) at input `x`.
// `ctx` is used as given (training flag, seed, step) except that its precision is set to f64.
// Parameter gradients are zeroed first, and left holding the analytic gradient afterwards.
inline GradientCheckResult check_layer_gradients(Layer& layer, Context& ctx, const Tensor& x_in,
                                                 const GradientCheckOptions& opt = {}) {
  using namespace gradient_check_detail;
  ctx.run.device = Device::cpu();
  ctx.run.precision.activation = DType::F64;
  ctx.run.precision.matmul = DType::F64;
  bool float_input = is_floating(x_in.dtype());
  Tensor x =
      float_input ? x_in.to(Device::cpu(), DType::F64).clone() : x_in.to(Device::cpu()).clone();
  std::vector<Parameter*> params = trainable(layer.parameters());  // frozen ones have no gradient
  for (Parameter* p : params) {
    KILN_CHECK(
        p->value.dtype() == DType::F64 && p->value.device().is_cpu() && p->value.is_contiguous(),
        "gradient check: parameter " + p->name + " is " + p->value.str() +
            "; call layer.to(Device::cpu(), DType::F64) first");
    p->grad.zero();
  }

  // Analytic gradients from one forward and one backward.
  Tensor y = layer.forward(ctx, x);
  Tensor w_tensor = Tensor::empty(y.shape(), DType::F64);
  ops::fill_uniform(w_tensor, -1.0, 1.0, opt.seed);
  std::vector<double> w = w_tensor.to_vector<double>();
  Tensor dx = layer.backward(ctx, w_tensor);
  std::vector<std::vector<double>> param_grads;
  for (Parameter* p : params) param_grads.push_back(p->grad.to_vector<double>());

  double center = objective(layer, ctx, x, w);
  GradientCheckResult result;
  std::ostringstream failures;
  if (opt.check_input && float_input) {
    KILN_CHECK(dx.defined() && dx.shape() == x.shape(),
               "gradient check: backward returned " +
                   (dx.defined() ? dx.str() : std::string("nothing")) + " for input " + x.str());
    compare_tensor("input", x.data<double>(), x.numel(), dx.to_vector<double>(), layer, ctx, x, w,
                   center, opt, result, failures);
  }
  for (std::size_t k = 0; k < params.size(); ++k) {
    Parameter* p = params[k];
    compare_tensor(p->name, p->value.data<double>(), p->value.numel(), param_grads[k], layer, ctx,
                   x, w, center, opt, result, failures);
  }
  std::ostringstream summary;
  summary << failures.str() << "gradient check of " << layer.type() << ": " << result.checked
          << " checked, " << result.skipped << " at kinks, " << result.failures
          << " failed, max |error| " << result.max_abs_error;
  result.report = summary.str();
  return result;
}

}  // namespace kiln
