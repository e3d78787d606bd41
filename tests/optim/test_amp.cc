// Mixed precision: opt levels, the loss scaler's state machine, the wrapper's skip/unscale/master
// logic, a tiny linear regression trained under O0..O3 (fp16 and bf16 parameter tensors on CPU)
// and gradient accumulation equivalence.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "core/allocator.h"
#include "core/ops.h"
#include "optim/amp/amp.h"
#include "optim/schedule.h"
#include "optim/sharded_optimizer.h"
#include "tests/optim/option_presets.h"

namespace kiln::optim {
namespace {

TEST(AmpPolicy, OptLevels) {
  AmpOptions a;
  a.level = OptLevel::O0;
  EXPECT_EQ(precision_policy(a).matmul, DType::F32);
  EXPECT_EQ(parameter_dtype(a), DType::F32);
  EXPECT_FALSE(uses_loss_scaling(a));
  a.level = OptLevel::O1;
  EXPECT_EQ(precision_policy(a).activation, DType::F16);
  EXPECT_EQ(parameter_dtype(a), DType::F32);
  EXPECT_TRUE(uses_loss_scaling(a));
  a.level = OptLevel::O2;
  a.half = HalfType::BF16;
  EXPECT_EQ(precision_policy(a).matmul, DType::BF16);
  EXPECT_EQ(parameter_dtype(a), DType::BF16);
  EXPECT_TRUE(uses_master_weights(a));
  EXPECT_FALSE(uses_loss_scaling(a));  // bf16: no scaler by default
  a.loss_scale = LossScaleMode::Dynamic;
  EXPECT_TRUE(uses_loss_scaling(a));
  a.level = OptLevel::O3;
  EXPECT_FALSE(uses_master_weights(a));
  EXPECT_EQ(opt_level_from_name("O2"), OptLevel::O2);
  EXPECT_THROW(opt_level_from_name("O4"), InputError);
  EXPECT_EQ(half_type_from_name("bf16"), HalfType::BF16);
  AmpOptions bad;
  bad.scaler.backoff_factor = 1.5;
  EXPECT_THROW(validate(bad), InputError);
}

TEST(LossScaler, GrowthBackoffAndState) {
  LossScalerOptions o;
  o.growth_interval = 3;
  LossScaler s(o, LossScaleMode::Dynamic);
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_FALSE(s.update(false));
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_EQ(s.growth_tracker(), 2);
  EXPECT_FALSE(s.update(false));  // third clean step: x2
  EXPECT_EQ(s.scale(), 131072.0);
  EXPECT_EQ(s.growth_tracker(), 0);
  EXPECT_FALSE(s.update(false));
  EXPECT_TRUE(s.update(true));  // overflow: skip, x0.5, tracker reset
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_EQ(s.growth_tracker(), 0);
  EXPECT_FALSE(s.update(false));
  LossScaler::State saved = s.state();
  LossScaler r(o, LossScaleMode::Dynamic);
  r.load_state(saved);
  EXPECT_EQ(r.scale(), 65536.0);
  EXPECT_EQ(r.growth_tracker(), 1);
  EXPECT_THROW(r.load_state({-1.0, 0}), InputError);
}

TEST(LossScaler, MinScaleOverflowIsAnError) {
  LossScalerOptions o;
  o.init_scale = 4.0;
  o.min_scale = 1.0;
  LossScaler s(o, LossScaleMode::Dynamic);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 2.0);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 1.0);
  try {
    s.update(true);
    FAIL() << "expected an error at the minimum scale";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("minimum scale"), std::string::npos) << e.what();
  }
}

TEST(LossScaler, GrowthStopsAtMaxScale) {
  LossScalerOptions o;
  o.init_scale = 4.0;
  o.growth_factor = 3.0;
  o.growth_interval = 1;
  o.max_scale = 20.0;
  LossScaler s(o, LossScaleMode::Dynamic);
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 12.0);
  EXPECT_FALSE(s.update(false));  // 36 would pass the cap: clamped to it, not left at 12
  EXPECT_EQ(s.scale(), 20.0);
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 20.0);
  EXPECT_TRUE(s.update(true));  // backs off from the cap as from any scale
  EXPECT_EQ(s.scale(), 10.0);
}

TEST(LossScaler, DefaultCapIsTwoToThe24) {
  LossScalerOptions o;
  EXPECT_EQ(o.max_scale, 16777216.0);
  o.growth_interval = 1;
  LossScaler s(o, LossScaleMode::Dynamic);  // 2^16, doubling every clean step
  for (int i = 0; i < 20; ++i) s.update(false);
  EXPECT_EQ(s.scale(), 16777216.0);
}

TEST(LossScaler, MaxScaleBelowInitScaleIsRejected) {
  AmpOptions a;
  a.level = OptLevel::O1;
  a.scaler.max_scale = a.scaler.init_scale / 2;
  EXPECT_THROW(validate(a), InputError);
  a.loss_scale = LossScaleMode::Static;  // a static scale never grows: the cap does not apply
  EXPECT_NO_THROW(validate(a));
}

TEST(LossScaler, StaticAndNone) {
  LossScalerOptions o;
  o.init_scale = 128.0;
  o.growth_interval = 1;
  LossScaler st(o, LossScaleMode::Static);
  EXPECT_FALSE(st.update(false));
  EXPECT_TRUE(st.update(true));  // still skipped
  EXPECT_EQ(st.scale(), 128.0);
  LossScaler none(o, LossScaleMode::None);
  EXPECT_EQ(none.scale(), 1.0);
  EXPECT_FALSE(none.update(true));
}

struct TwoParams {
  Parameter w, b;
  std::vector<Parameter*> list() { return {&w, &b}; }
  TwoParams(DType dtype, std::vector<float> wv, std::vector<float> bv) {
    w.name = "fc.weight";
    w.value = Tensor::from_vector(wv, {static_cast<std::int64_t>(wv.size())}).to(dtype);
    w.grad = Tensor::zeros(w.value.shape(), dtype);
    b.name = "fc.bias";
    b.no_weight_decay = true;
    b.fp32_in_half = true;
    b.value = Tensor::from_vector(bv, {static_cast<std::int64_t>(bv.size())});
    b.grad = Tensor::zeros(b.value.shape(), DType::F32);
  }
};

TEST(MixedPrecision, OverflowSkipsWithoutTouchingAnything) {
  TwoParams m(DType::F32, {1.0f, 2.0f}, {0.5f});
  OptimizerOptions o;
  o.lr = 0.1;
  AmpOptions a;
  a.level = OptLevel::O1;
  MixedPrecisionOptimizer opt(m.list(), o, a);
  EXPECT_EQ(opt.scale(), 65536.0);
  m.w.grad.copy_from(Tensor::from_vector(std::vector<float>{INFINITY, 1.0f}, {2}));
  m.b.grad.fill(3.0);
  StepResult r = opt.step();
  EXPECT_TRUE(r.skipped);
  EXPECT_TRUE(r.found_inf);
  EXPECT_EQ(r.scale, 65536.0);
  EXPECT_EQ(r.next_scale, 32768.0);
  EXPECT_EQ(m.w.value.to_vector<float>(), (std::vector<float>{1.0f, 2.0f}));
  EXPECT_EQ(m.b.value.to_vector<float>()[0], 0.5f);
  EXPECT_EQ(opt.optimizer().step_count(), 0);
  for (auto& [name, t] : opt.optimizer().state()) {
    if (name != "optimizer.step") {
      EXPECT_EQ(ops::reduce(*t, ops::Reduction::Max).item(), 0.0) << name;
    }
  }
  EXPECT_EQ(opt.weights_version(), 0u);
  // NaN is caught as well.
  opt.zero_grad();
  m.b.grad.fill(NAN);
  EXPECT_TRUE(opt.step().skipped);
  EXPECT_EQ(opt.scale(), 16384.0);
}

TEST(MixedPrecision, UnscaledStepEqualsPlainStep) {
  TwoParams scaled(DType::F32, {1.0f, -2.0f}, {0.5f}), plain(DType::F32, {1.0f, -2.0f}, {0.5f});
  OptimizerOptions o;
  o.lr = 0.01;
  o.weight_decay = 0.1;
  AmpOptions a;
  a.level = OptLevel::O1;
  a.scaler.init_scale = 1024.0;  // a power of two: unscaling is exact
  MixedPrecisionOptimizer amp(scaled.list(), o, a);
  auto ref = make_optimizer(plain.list(), o);
  for (int s = 0; s < 3; ++s) {
    std::vector<float> gw = {0.25f * (s + 1), -0.5f}, gb = {0.125f};
    plain.w.grad.copy_from(Tensor::from_vector(gw, {2}));
    plain.b.grad.copy_from(Tensor::from_vector(gb, {1}));
    for (float& g : gw) g *= 1024.0f;
    for (float& g : gb) g *= 1024.0f;
    amp.zero_grad();
    scaled.w.grad.copy_from(Tensor::from_vector(gw, {2}));
    scaled.b.grad.copy_from(Tensor::from_vector(gb, {1}));
    StepResult r = amp.step();
    ref->step();
    EXPECT_FALSE(r.skipped);
    EXPECT_NEAR(r.grad_norm, std::sqrt(0.0625 * (s + 1) * (s + 1) + 0.25 + 0.015625), 1e-6);
    EXPECT_EQ(scaled.w.value.to_vector<float>(), plain.w.value.to_vector<float>());
    EXPECT_EQ(scaled.b.value.to_vector<float>(), plain.b.value.to_vector<float>());
  }
  EXPECT_EQ(amp.weights_version(), 3u);
}

TEST(MixedPrecision, FoundInfHookDecidesForAllRanks) {
  TwoParams m(DType::F32, {1.0f}, {0.0f});
  OptimizerOptions o;
  AmpOptions a;
  a.level = OptLevel::O1;
  MixedPrecisionOptimizer opt(m.list(), o, a);
  int calls = 0;
  // Another rank overflowed: the reduced flag says so, and this rank skips too.
  opt.set_found_inf_hook([&](Tensor& flag) {
    ++calls;
    EXPECT_EQ(flag.item(), 0.0);
    flag.fill(1.0);
  });
  m.w.grad.fill(1.0);
  EXPECT_TRUE(opt.step().skipped);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(m.w.value.to_vector<float>()[0], 1.0f);
}

void check_o2_masters(DType half) {
  TwoParams m(half, {1.0f, -0.5f, 0.25f}, {0.1f});
  OptimizerOptions o;
  o.kind = OptimizerKind::SGD;
  o.lr = 1e-3;  // updates below half resolution: only the masters see them
  AmpOptions a;
  a.level = OptLevel::O2;
  a.half = half == DType::BF16 ? HalfType::BF16 : HalfType::FP16;
  MixedPrecisionOptimizer opt(m.list(), o, a);
  auto state = opt.state();
  Tensor* master = nullptr;
  for (auto& [name, t] : state) {
    if (name == "fc.weight.master") master = t;
    EXPECT_NE(name, "fc.bias.master");  // fp32_in_half parameters have no master
  }
  ASSERT_NE(master, nullptr);
  EXPECT_EQ(master->dtype(), DType::F32);
  const double scale = opt.scale();
  for (int s = 0; s < 4; ++s) {
    opt.zero_grad();
    m.w.grad.copy_from(Tensor::from_vector(std::vector<float>{0.5f, 0.5f, -0.5f}, {3}).to(half));
    ops::scale(m.w.grad, scale);
    m.b.grad.fill(0.5 * scale);
    ASSERT_FALSE(opt.step().skipped);
  }
  // Masters moved by 4 * lr * g exactly (in fp32); the half weights are the rounded masters.
  auto mv = master->to_vector<float>();
  EXPECT_NEAR(mv[0], 1.0 - 4 * 1e-3 * 0.5, 1e-6);
  EXPECT_NEAR(mv[2], 0.25 + 4 * 1e-3 * 0.5, 1e-6);
  EXPECT_EQ(m.w.value.dtype(), half);
  auto hv = m.w.value.to_vector<float>();
  auto rounded = master->to(half).to_vector<float>();
  EXPECT_EQ(hv, rounded);
  EXPECT_NE(hv[0], mv[0]);  // the half weight cannot hold 0.998
  EXPECT_NEAR(m.b.value.to_vector<float>()[0], 0.1 - 4 * 1e-3 * 0.5, 1e-7);
  // Restoring masters then refreshing rewrites the half weights.
  master->fill(2.0);
  opt.refresh_model_weights();
  EXPECT_EQ(m.w.value.to_vector<float>()[1], 2.0f);
}

TEST(MixedPrecision, O2MastersF16) {
  check_o2_masters(DType::F16);
}
TEST(MixedPrecision, O2MastersBF16) {
  check_o2_masters(DType::BF16);
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.numel() == b.numel() &&
         std::memcmp(a.data(), b.data(), a.numel() * dtype_size(a.dtype())) == 0;
}

// The gradients a backward pass under loss scale `scale` would leave: N(0, stddev) * scale, in the
// parameter's dtype (rounded once).
void fill_scaled_grad(Tensor& grad, double stddev, double scale, std::uint64_t seed) {
  Tensor g = Tensor::empty(grad.shape(), DType::F32);
  ops::fill_normal(g, 0.0, stddev, seed);
  ops::scale(g, scale);
  grad.copy_from(g);
}

// The old O2 way: float(grad) * float(1 / scale) into an fp32 tensor (the master gradient).
void unscale_into(const Tensor& scaled, double scale, Tensor& out) {
  const float inv_scale = static_cast<float>(1.0 / scale);
  std::vector<float> v = scaled.to_vector<float>();  // exact for f16, bf16 and f32
  for (float& x : v) x = x * inv_scale;
  out.copy_from(Tensor::from_vector(v, scaled.shape()));
}

// O2 keeps no fp32 master gradients: the optimizer reads the scaled half gradients and unscales
// them as it reads them. Against the old way (gradients unscaled into fp32 tensors, then the
// optimizer on fp32 masters with a half model copy), masters, half weights, the fp32_in_half
// parameter and the optimizer state agree bit for bit. The scale (not a power of two, so
// unscaling rounds) grows during the run: the optimizer must use the factor of the step's pass.
void check_o2_unscale_in_optimizer(OptimizerOptions o, DType half) {
  SCOPED_TRACE(std::string(optimizer_kind_name(o.kind)) + " " + dtype_name(half) +
               " max_grad_norm " + std::to_string(o.max_grad_norm));
  const std::int64_t n = 1000, nb = 7;
  Parameter w, b;
  w.name = "fc.weight";
  w.value = Tensor::empty({n}, DType::F32);
  ops::fill_normal(w.value, 0.0, 1.0, 21);
  w.value = w.value.to(half);
  w.grad = Tensor::zeros({n}, half);
  b.name = "fc.bias";
  b.no_weight_decay = true;
  b.fp32_in_half = true;
  b.value = Tensor::empty({nb}, DType::F32);
  ops::fill_normal(b.value, 0.0, 1.0, 22);
  b.grad = Tensor::zeros({nb}, DType::F32);
  AmpOptions a;
  a.level = OptLevel::O2;
  a.half = half == DType::BF16 ? HalfType::BF16 : HalfType::FP16;
  a.loss_scale = LossScaleMode::Dynamic;
  a.scaler.init_scale = 1000.0;
  a.scaler.growth_interval = 2;

  // The reference, built before the amp optimizer sees the parameters (same initial values).
  std::vector<OptimizedTensor> ref_tensors(2);
  ref_tensors[0].name = w.name;
  ref_tensors[0].value = w.value.to(DType::F32);
  ref_tensors[0].grad = Tensor::zeros({n}, DType::F32);
  ref_tensors[0].model_copy = w.value.clone();
  ref_tensors[1].name = b.name;
  ref_tensors[1].no_weight_decay = true;
  ref_tensors[1].value = b.value.clone();
  ref_tensors[1].grad = Tensor::zeros({nb}, DType::F32);
  for (OptimizedTensor& t : ref_tensors) {
    std::tie(t.lr_multiplier, t.weight_decay) = resolve_group(t.name, t.no_weight_decay, o);
  }
  auto ref = make_optimizer(ref_tensors, o);

  MixedPrecisionOptimizer opt({&w, &b}, o, a);
  const Tensor& master = opt.optimizer().tensors()[0].value;
  // The optimizer reads the model's half gradient itself: no fp32 gradient-sized tensor.
  EXPECT_EQ(opt.optimizer().tensors()[0].grad.dtype(), half);
  EXPECT_EQ(opt.optimizer().tensors()[0].grad.data(), w.grad.data());
  EXPECT_EQ(opt.optimizer().tensors()[1].grad.data(), b.grad.data());
  int clipped = 0;
  std::vector<double> scales;
  for (int s = 0; s < 6; ++s) {
    const double scale = opt.scale();
    scales.push_back(scale);
    opt.zero_grad();
    const double stddev = s % 2 ? 0.01 : 1.0;  // below and above max_grad_norm
    fill_scaled_grad(w.grad, stddev, scale, 100 + s);
    fill_scaled_grad(b.grad, stddev, scale, 200 + s);
    Tensor w_grad = w.grad.clone(), b_grad = b.grad.clone();
    unscale_into(w.grad, scale, ref_tensors[0].grad);
    unscale_into(b.grad, scale, ref_tensors[1].grad);

    StepResult r = opt.step();
    ASSERT_FALSE(r.skipped);
    EXPECT_EQ(r.scale, scale);
    ref->step(r.grad_norm);  // the old step: the pass's norm, the fp32 unscaled gradients
    if (o.max_grad_norm > 0 && r.grad_norm > o.max_grad_norm) ++clipped;

    EXPECT_TRUE(same_bytes(master, ref_tensors[0].value)) << "master, step " << s;
    EXPECT_TRUE(same_bytes(w.value, ref_tensors[0].model_copy)) << "half weights, step " << s;
    EXPECT_TRUE(same_bytes(b.value, ref_tensors[1].value)) << "fp32 bias, step " << s;
    // The pass wrote nothing: the model's gradients are still the scaled ones.
    EXPECT_TRUE(same_bytes(w.grad, w_grad)) << "step " << s;
    EXPECT_TRUE(same_bytes(b.grad, b_grad)) << "step " << s;
  }
  EXPECT_EQ(scales, (std::vector<double>{1000, 1000, 2000, 2000, 4000, 4000}));
  if (o.max_grad_norm > 0) {
    EXPECT_EQ(clipped, 3);  // the N(0, 1) steps
  }
  auto sa = opt.optimizer().state(), sr = ref->state();
  ASSERT_EQ(sa.size(), sr.size());
  for (std::size_t i = 0; i < sa.size(); ++i) {
    EXPECT_EQ(sa[i].first, sr[i].first);
    EXPECT_TRUE(same_bytes(*sa[i].second, *sr[i].second)) << sa[i].first;
  }
  // state(): the optimizer's tensors and one master per half parameter, nothing gradient-like.
  auto all = opt.state();
  EXPECT_EQ(all.size(), sa.size() + 1);
  EXPECT_EQ(all.back().first, "fc.weight.master");
}

void check_o2_unscale_in_optimizer_all(OptimizerOptions o) {
  for (DType half : {DType::F16, DType::BF16}) {
    for (double max_grad_norm : {0.0, 1.0}) {
      o.max_grad_norm = max_grad_norm;
      check_o2_unscale_in_optimizer(o, half);
    }
  }
}

TEST(MixedPrecision, O2UnscaleInOptimizerIsBitExactSgd) {
  check_o2_unscale_in_optimizer_all(presets::sgd_momentum_options());
}

TEST(MixedPrecision, O2UnscaleInOptimizerIsBitExactAdamW) {
  OptimizerOptions o = presets::adamw_options();
  check_o2_unscale_in_optimizer_all(o);
  o.amsgrad = true;
  check_o2_unscale_in_optimizer_all(o);
}

TEST(MixedPrecision, O2UnscaleInOptimizerIsBitExactLamb) {
  check_o2_unscale_in_optimizer_all(presets::lamb_options());
}

// Optimizer::step's grad_unscale on its own: half gradients read with a factor equal the fp32
// gradients unscaled beforehand, including the clipping norm computed inside step().
TEST(MixedPrecision, GradUnscaleEqualsUnscaledFp32Gradients) {
  for (OptimizerKind kind : {OptimizerKind::SGD, OptimizerKind::AdamW, OptimizerKind::LAMB}) {
    OptimizerOptions o;
    o.kind = kind;
    o.lr = 1e-2;
    o.weight_decay = 0.01;
    o.max_grad_norm = 0.5;
    const double scale = 384.0;
    Tensor value = Tensor::empty({333}, DType::F32);
    ops::fill_normal(value, 0.0, 1.0, 31);
    OptimizedTensor t, r;
    t.name = r.name = "w";
    t.value = value.clone();
    t.grad = Tensor::zeros({333}, DType::F16);
    r.value = value.clone();
    r.grad = Tensor::zeros({333}, DType::F32);
    auto opt = make_optimizer(std::vector<OptimizedTensor>{t}, o);
    auto ref = make_optimizer(std::vector<OptimizedTensor>{r}, o);
    for (int s = 0; s < 3; ++s) {
      fill_scaled_grad(t.grad, 1.0, scale, 40 + s);
      unscale_into(t.grad, scale, r.grad);
      double norm = opt->step(-1.0, 1.0 / scale);
      EXPECT_EQ(norm, ref->step());
      EXPECT_GT(norm, o.max_grad_norm);  // clipped
      EXPECT_TRUE(same_bytes(t.value, r.value)) << optimizer_kind_name(kind) << " step " << s;
    }
    EXPECT_THROW(opt->step(-1.0, 0.0), InputError);
    EXPECT_THROW(opt->step(-1.0, INFINITY), InputError);
    EXPECT_EQ(opt->step_count(), 3);
  }
}

// Memory: O2 with AdamW holds, per half parameter, the fp32 master and two fp32 moments and
// nothing else (the old fp32 master gradient is gone), and a step allocates no gradient-sized
// temporary.
TEST(MixedPrecision, O2KeepsNoFp32GradientCopy) {
  const std::int64_t n = 1 << 14, nb = 64;
  TwoParams m(DType::F16, std::vector<float>(n, 0.5f), std::vector<float>(nb, 0.25f));
  OptimizerOptions o;
  o.weight_decay = 0.01;
  AmpOptions a;
  a.level = OptLevel::O2;
  CachingAllocator& host = host_allocator();
  const std::size_t before = host.stats().allocated_bytes;
  MixedPrecisionOptimizer opt(m.list(), o, a);
  const std::size_t after = host.stats().allocated_bytes;
  auto r = [](std::int64_t bytes) {
    return round_allocation_size(static_cast<std::size_t>(bytes));
  };
  // masters + exp_avg + exp_avg_sq (w), the moments of the fp32 bias, the step count, the stats,
  // the loss scale the loss's backward reads.
  const std::size_t expected = 3 * r(4 * n) + 2 * r(4 * nb) + r(8) + r(8) + r(8);
  EXPECT_EQ(after - before, expected);
  fill_scaled_grad(m.w.grad, 1e-3, opt.scale(), 51);  // finite in fp16 at 65536
  fill_scaled_grad(m.b.grad, 1e-3, opt.scale(), 52);
  host.reset_peak_stats();
  ASSERT_FALSE(opt.step().skipped);
  EXPECT_EQ(host.stats().allocated_bytes, after);
  EXPECT_LT(host.stats().peak_allocated_bytes - after, r(2 * n));  // not even a half copy
}

// y = X w + b + noise, trained by hand-written forward/backward with core ops::gemm.
struct Regression {
  static constexpr std::int64_t kN = 64, kD = 8;
  Tensor x, y;  // (N, D), (N, 1) f32
  Regression() {
    x = Tensor::empty({kN, kD}, DType::F32);
    ops::fill_normal(x, 0.0, 1.0, 7);
    Tensor w_true = Tensor::empty({kD, 1}, DType::F32);
    ops::fill_uniform(w_true, -1.0, 1.0, 8);
    y = Tensor::zeros({kN, 1}, DType::F32);
    ops::gemm(false, false, 1.0, x, w_true, 0.0, y);
    Tensor noise = Tensor::empty({kN, 1}, DType::F32);
    ops::fill_normal(noise, 0.0, 0.3, 9);
    ops::axpy(1.0, noise, y);
    auto yv = y.to_vector<float>();
    for (float& v : yv) v += 0.5f;  // the bias
    y = Tensor::from_vector(yv, {kN, 1});
  }
};

struct LinearModel {
  Parameter w, b;
  LinearModel(DType dtype) {
    w.name = "linear.weight";
    w.value = Tensor::zeros({Regression::kD, 1}, DType::F32);
    ops::fill_uniform(w.value, -0.1, 0.1, 11);
    w.value = w.value.to(dtype);
    w.grad = Tensor::zeros(w.value.shape(), dtype);
    b.name = "linear.bias";
    b.no_weight_decay = true;
    b.fp32_in_half = true;
    b.value = Tensor::zeros({1}, dtype == DType::F32 ? DType::F32 : DType::F32);
    b.grad = Tensor::zeros({1}, DType::F32);
  }
  std::vector<Parameter*> list() { return {&w, &b}; }

  // Forward and backward over rows [begin, end): returns the mean squared error; accumulates
  // the gradient of loss * loss_multiplier into w.grad and b.grad (+=).
  double forward_backward(const Regression& data, std::int64_t begin, std::int64_t end,
                          const PrecisionPolicy& policy, double loss_multiplier) {
    std::int64_t n = end - begin;
    Tensor xs = data.x.slice(0, begin, end).contiguous();
    Tensor pred = Tensor::zeros({n, 1}, DType::F32);
    Tensor xm = xs.to(policy.matmul), wm = w.value.to(policy.matmul);  // O1 casts the weights
    ops::gemm(false, false, 1.0, xm, wm, 0.0, pred);                   // fp32 accumulation
    auto pv = pred.to(policy.activation).to_vector<float>();           // activations in half
    auto yv = data.y.slice(0, begin, end).contiguous().to_vector<float>();
    float bias = b.value.to_vector<float>()[0];
    double loss = 0.0;
    std::vector<float> dpred(n);
    for (std::int64_t i = 0; i < n; ++i) {
      double r = pv[i] + bias - yv[i];
      loss += r * r / n;
      dpred[i] = static_cast<float>(2.0 * r / n * loss_multiplier);
    }
    // The gradient flows back in the activation dtype (it may overflow in fp16: the scaler's job).
    Tensor dp = Tensor::from_vector(dpred, {n, 1}).to(policy.activation).to(DType::F32);
    Tensor dw = Tensor::zeros({Regression::kD, 1}, DType::F32);
    ops::gemm(true, false, 1.0, xs, dp, 0.0, dw);
    Tensor acc = w.grad.to(DType::F32);
    ops::add(acc, dw, acc);
    w.grad.copy_from(acc);
    Tensor db = ops::reduce(dp, ops::Reduction::Sum);
    Tensor bacc = b.grad.clone();
    ops::add(bacc, db.view({1}), bacc);
    b.grad.copy_from(bacc);
    return loss;
  }
};

double train(OptLevel level, HalfType half, int steps, int micro_batches = 1) {
  Regression data;
  AmpOptions a;
  a.level = level;
  a.half = half;
  LinearModel model(parameter_dtype(a));
  OptimizerOptions o;
  o.kind = OptimizerKind::AdamW;
  o.lr = 0.05;
  o.weight_decay = 1e-4;
  MixedPrecisionOptimizer opt(model.list(), o, a);
  GradientAccumulation accumulation(micro_batches);
  LrSchedule schedule([] {
    ScheduleOptions s;
    s.kind = ScheduleKind::Cosine;
    s.base_lr = 0.05;
    s.min_lr = 0.001;
    s.warmup_steps = 5;
    s.total_steps = 150;
    return s;
  }());
  const std::int64_t per = Regression::kN / micro_batches;
  for (int step = 0; step < steps; ++step) {
    opt.set_lr(schedule.lr_at(opt.optimizer().step_count()));
    opt.zero_grad();
    for (int mb = 0; mb < micro_batches; ++mb) {
      model.forward_backward(data, mb * per, (mb + 1) * per, opt.precision(),
                             accumulation.loss_factor() * opt.scale());
    }
    opt.step();
  }
  // The final loss in fp32 on the fp32 view of the weights.
  LinearModel eval(DType::F32);
  eval.w.value.copy_from(model.w.value);
  eval.b.value.copy_from(model.b.value);
  return eval.forward_backward(data, 0, Regression::kN, PrecisionPolicy{}, 1.0);
}

TEST(MixedPrecision, LinearRegressionTracksO0UnderEveryLevel) {
  const int steps = 200;
  double o0 = train(OptLevel::O0, HalfType::FP16, steps);
  EXPECT_LT(o0, 0.2);  // near the noise floor (0.09)
  for (HalfType half : {HalfType::FP16, HalfType::BF16}) {
    for (OptLevel level : {OptLevel::O1, OptLevel::O2, OptLevel::O3}) {
      double loss = train(level, half, steps);
      EXPECT_NEAR(loss, o0, 0.02 * o0) << opt_level_name(level) << " " << half_type_name(half);
    }
  }
}

TEST(MixedPrecision, AccumulationEqualsOneBigBatch) {
  for (OptLevel level : {OptLevel::O0, OptLevel::O2}) {
    Regression data;
    AmpOptions a;
    a.level = level;
    a.loss_scale = LossScaleMode::None;
    LinearModel big(parameter_dtype(a)), small(parameter_dtype(a));
    OptimizerOptions o;
    o.kind = OptimizerKind::SGD;
    o.lr = 0.1;
    o.momentum = 0.9;
    MixedPrecisionOptimizer ob(big.list(), o, a), os(small.list(), o, a);
    GradientAccumulation acc(4);
    for (int step = 0; step < 3; ++step) {
      ob.zero_grad();
      big.forward_backward(data, 0, Regression::kN, ob.precision(), 1.0);
      ob.step();
      os.zero_grad();
      for (int mb = 0; mb < 4; ++mb) {
        small.forward_backward(data, mb * 16, (mb + 1) * 16, os.precision(), acc.loss_factor());
      }
      os.step();
    }
    // O0: fp32 sums in another order; O2: the micro-batch gradients accumulate in fp16, so the
    // masters agree to half precision.
    const double tol = level == OptLevel::O0 ? 1e-5 : 2e-3;
    Tensor* mb = nullptr;
    Tensor* ms = nullptr;
    for (auto& [n, t] : ob.state())
      if (n == "linear.weight.master") mb = t;
    for (auto& [n, t] : os.state())
      if (n == "linear.weight.master") ms = t;
    auto wb = (mb ? *mb : big.w.value).to_vector<float>();
    auto ws = (ms ? *ms : small.w.value).to_vector<float>();
    for (std::size_t i = 0; i < wb.size(); ++i) {
      EXPECT_NEAR(ws[i], wb[i], tol * std::max(1.0f, std::fabs(wb[i]))) << opt_level_name(level);
    }
  }
  EXPECT_THROW(GradientAccumulation(0), InputError);
}

// O2's masters start from the exact fp32 initial values, and ShardedOptimizer releases those
// before the moments are allocated: a 7B model's 30 GB of them never sit beside its whole state.
TEST(ShardedOptimizer, MastersStartFromTheInitialValuesReleasedBeforeTheMoments) {
  const std::int64_t n = 1 << 20;
  Tensor init = Tensor::empty({n}, DType::F32);
  ops::fill_normal(init, 0.0, 1.0, 7);
  const std::vector<float> expected = init.to_vector<float>();
  Parameter p;
  p.name = "fc.weight";
  p.value = init.to(Device::cpu(), DType::BF16);
  p.grad = Tensor::zeros({n}, DType::BF16);
  AmpOptions a;
  a.level = OptLevel::O2;
  a.half = HalfType::BF16;
  CachingAllocator& host = host_allocator();
  const std::size_t before = host.stats().allocated_bytes;  // init's 4n bytes among them
  host.reset_peak_stats();
  NamedTensors fp32_init{{p.name, init}};
  init = Tensor();
  ShardedOptimizer opt({&p}, std::move(fp32_init), presets::adamw_options(), a, nullptr);
  // The master (4n) beside init, then init gone before the two fp32 moments (8n): 8n at most,
  // where keeping init would have reached 12n.
  const std::size_t peak = host.stats().peak_allocated_bytes - before;
  EXPECT_LT(peak, static_cast<std::size_t>(9 * n)) << peak;
  EXPECT_GE(peak, static_cast<std::size_t>(8 * n)) << peak;
  Tensor* master = nullptr;
  for (auto& [name, t] : opt.optimizer().state())
    if (name == "fc.weight.master") master = t;
  ASSERT_NE(master, nullptr);
  EXPECT_EQ(master->to_vector<float>(), expected);
}

}  // namespace
}  // namespace kiln::optim
