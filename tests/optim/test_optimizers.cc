// Optimizers against values worked out by hand from the published formulas (torch.optim.SGD,
// torch.optim.AdamW, the LAMB paper with Apex's clipping), parameter groups, state restore and
// global-norm clipping. The multi-step references are written in double straight from the
// formulas, independent of optim/update_rules.h.

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/ops.h"
#include "optim/optimizer.h"

namespace kiln::optim {
namespace {

std::vector<float> values(const Tensor& t) {
  return t.to_vector<float>();
}

struct Fixture {
  std::vector<std::unique_ptr<Parameter>> owned;
  std::vector<Parameter*> params;
  Parameter& add(const std::string& name, const std::vector<float>& value, bool no_wd = false) {
    auto p = std::make_unique<Parameter>();
    p->name = name;
    p->value = Tensor::from_vector(value, {static_cast<std::int64_t>(value.size())});
    p->grad = Tensor::zeros({static_cast<std::int64_t>(value.size())}, DType::F32);
    p->no_weight_decay = no_wd;
    params.push_back(p.get());
    owned.push_back(std::move(p));
    return *owned.back();
  }
};

void set_grad(Parameter& p, const std::vector<float>& g) {
  p.grad.copy_from(Tensor::from_vector(g, p.grad.shape()));
}

void expect_near_rel(const std::vector<float>& got, const std::vector<double>& want, double rel,
                     const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], rel * std::max(1.0, std::fabs(want[i])))
        << what << "[" << i << "]";
  }
}

TEST(Sgd, PlainMomentumWeightDecayByHand) {
  Fixture f;
  Parameter& p = f.add("w", {1.0f});
  OptimizerOptions o;
  o.kind = OptimizerKind::SGD;
  o.lr = 0.1;
  o.momentum = 0.9;
  o.weight_decay = 0.1;
  auto opt = make_optimizer(f.params, o);
  set_grad(p, {0.5f});
  opt->step();
  // g' = 0.5 + 0.1 * 1 = 0.6; buf = g' (first step); p = 1 - 0.1 * 0.6
  EXPECT_NEAR(values(p.value)[0], 0.94, 1e-7);
  EXPECT_NEAR(values(*opt->state()[1].second)[0], 0.6, 1e-7);
  opt->step();
  // g' = 0.5 + 0.094 = 0.594; buf = 0.9 * 0.6 + 0.594 = 1.134; p = 0.94 - 0.1134
  EXPECT_NEAR(values(p.value)[0], 0.8266, 1e-6);
  EXPECT_NEAR(values(*opt->state()[1].second)[0], 1.134, 1e-6);
  EXPECT_EQ(opt->step_count(), 2);
}

TEST(Sgd, NesterovByHand) {
  Fixture f;
  Parameter& p = f.add("w", {1.0f});
  OptimizerOptions o;
  o.kind = OptimizerKind::SGD;
  o.lr = 0.1;
  o.momentum = 0.9;
  o.nesterov = true;
  o.weight_decay = 0.1;
  auto opt = make_optimizer(f.params, o);
  set_grad(p, {0.5f});
  opt->step();
  // buf = 0.6; g'' = 0.6 + 0.9 * 0.6 = 1.14; p = 1 - 0.114
  EXPECT_NEAR(values(p.value)[0], 0.886, 1e-6);
  opt->step();
  // g' = 0.5 + 0.0886 = 0.5886; buf = 0.54 + 0.5886 = 1.1286; g'' = 0.5886 + 1.01574
  EXPECT_NEAR(values(p.value)[0], 0.886 - 0.1 * (0.5886 + 0.9 * 1.1286), 1e-6);
}

TEST(Sgd, WithoutMomentumHasNoState) {
  Fixture f;
  Parameter& p = f.add("w", {2.0f, -1.0f});
  OptimizerOptions o;
  o.kind = OptimizerKind::SGD;
  o.lr = 0.5;
  auto opt = make_optimizer(f.params, o);
  set_grad(p, {1.0f, -2.0f});
  opt->step();
  expect_near_rel(values(p.value), {1.5, 0.0}, 1e-7, "sgd");
  EXPECT_EQ(opt->state().size(), 1u);  // only optimizer.step
  OptimizerOptions bad = o;
  bad.nesterov = true;
  EXPECT_THROW(make_optimizer(f.params, bad), InputError);
}

// AdamW from Loshchilov & Hutter / torch.optim.AdamW, in double.
struct AdamRef {
  double lr, b1, b2, eps, wd;
  bool amsgrad;
  std::vector<double> p, m, v, vmax;
  int t = 0;
  void step(const std::vector<double>& g) {
    ++t;
    double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
    for (std::size_t i = 0; i < p.size(); ++i) {
      p[i] *= 1 - lr * wd;
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      vmax[i] = std::max(vmax[i], v[i]);
      double second = amsgrad ? vmax[i] : v[i];
      p[i] -= lr / bc1 * m[i] / (std::sqrt(second) / std::sqrt(bc2) + eps);
    }
  }
};

void run_adamw(bool amsgrad) {
  Fixture f;
  Parameter& p = f.add("w", {1.0f, -0.5f, 2.0f});
  OptimizerOptions o;
  o.kind = OptimizerKind::AdamW;
  o.lr = 0.1;
  o.weight_decay = 0.1;
  o.amsgrad = amsgrad;
  auto opt = make_optimizer(f.params, o);
  AdamRef ref{0.1,       0.9,       0.999,    1e-8, 0.1, amsgrad, {1.0, -0.5, 2.0},
              {0, 0, 0}, {0, 0, 0}, {0, 0, 0}};
  // Large then small gradients: AMSGrad keeps the first step's second moment.
  std::vector<std::vector<double>> grads = {
      {0.5, -2.0, 1.0}, {0.01, 0.02, -0.03}, {0.0, 0.01, 0.0}, {-0.2, 0.1, 0.3}};
  for (std::size_t s = 0; s < grads.size(); ++s) {
    set_grad(p, {static_cast<float>(grads[s][0]), static_cast<float>(grads[s][1]),
                 static_cast<float>(grads[s][2])});
    opt->step();
    ref.step(grads[s]);
    expect_near_rel(values(p.value), ref.p, 2e-6, "adamw step " + std::to_string(s));
  }
  if (amsgrad) {
    auto state = opt->state();
    ASSERT_EQ(state.size(), 4u);
    EXPECT_EQ(state[3].first, "w.max_exp_avg_sq");
    expect_near_rel(values(*state[3].second), ref.vmax, 1e-6, "max_exp_avg_sq");
  }
}

TEST(AdamW, FirstStepByHand) {
  Fixture f;
  Parameter& p = f.add("w", {1.0f});
  OptimizerOptions o;
  o.lr = 0.1;
  o.weight_decay = 0.1;
  auto opt = make_optimizer(f.params, o);
  set_grad(p, {0.5f});
  opt->step();
  // p = 1 * (1 - 0.01) - 0.1 * (0.05 / 0.1) / (sqrt(0.00025 / 0.001) + 1e-8)
  EXPECT_NEAR(values(p.value)[0], 0.99 - 0.1 * 0.5 / (0.5 + 1e-8), 1e-7);
  auto state = opt->state();
  ASSERT_EQ(state.size(), 3u);
  EXPECT_EQ(state[1].first, "w.exp_avg");
  EXPECT_EQ(state[2].first, "w.exp_avg_sq");
  EXPECT_NEAR(values(*state[1].second)[0], 0.05, 1e-8);
  EXPECT_NEAR(values(*state[2].second)[0], 0.00025, 1e-10);
}

TEST(AdamW, MatchesFormulaOverSteps) {
  run_adamw(false);
}
TEST(AdamW, AmsgradMatchesFormulaOverSteps) {
  run_adamw(true);
}

TEST(Lamb, TrustRatioAndExcludedParametersByHand) {
  Fixture f;
  Parameter& w = f.add("layer.weight", {3.0f, 4.0f});
  Parameter& b = f.add("layer.bias", {1.0f, -1.0f}, /*no_wd=*/true);
  OptimizerOptions o;
  o.kind = OptimizerKind::LAMB;
  o.lr = 0.01;
  o.eps = 1e-6;
  o.weight_decay = 0.0;
  auto opt = make_optimizer(f.params, o);
  set_grad(w, {0.3f, 0.4f});
  set_grad(b, {0.1f, -0.2f});
  opt->step();
  // Step 1 with bias correction: m_hat = g, v_hat = g^2, update = g / (|g| + eps) ~ sign(g).
  double u0 = 0.3 / (0.3 + 1e-6), u1 = 0.4 / (0.4 + 1e-6);
  double ratio = 5.0 / std::sqrt(u0 * u0 + u1 * u1);  // ||w|| / ||update||
  expect_near_rel(values(w.value), {3.0 - 0.01 * ratio * u0, 4.0 - 0.01 * ratio * u1}, 1e-6,
                  "weight");
  // The bias is not adapted: trust ratio 1.
  expect_near_rel(values(b.value),
                  {1.0 - 0.01 * 0.1 / (0.1 + 1e-6), -1.0 + 0.01 * 0.2 / (0.2 + 1e-6)}, 1e-6,
                  "bias");
}

// LAMB from You et al. (2019) with decoupled weight decay and Apex's global clipping, in double.
TEST(Lamb, ClippingWeightDecayAndStepsMatchFormula) {
  Fixture f;
  Parameter& w = f.add("w", {0.5f, -1.5f, 2.0f});
  Parameter& b = f.add("b", {0.25f}, true);
  OptimizerOptions o;
  o.kind = OptimizerKind::LAMB;
  o.lr = 0.02;
  o.eps = 1e-6;
  o.weight_decay = 0.05;
  o.max_grad_norm = 1.0;
  auto opt = make_optimizer(f.params, o);
  std::vector<std::vector<double>> pv = {{0.5, -1.5, 2.0}, {0.25}}, m = {{0, 0, 0}, {0}},
                                   v = {{0, 0, 0}, {0}};
  std::vector<std::vector<std::vector<double>>> grads = {
      {{3.0, -4.0, 1.0}, {2.0}}, {{0.1, 0.2, -0.1}, {0.05}}, {{-1.0, 0.5, 0.5}, {-0.3}}};
  for (std::size_t s = 0; s < grads.size(); ++s) {
    int t = static_cast<int>(s) + 1;
    double sumsq = 0;
    for (auto& g : grads[s])
      for (double x : g) sumsq += x * x;
    double divisor = std::max(1.0, std::sqrt(sumsq) / 1.0);
    for (std::size_t k = 0; k < 2; ++k) {
      double wd = k == 0 ? 0.05 : 0.0;
      std::vector<double> u(pv[k].size());
      double pn = 0, un = 0;
      for (std::size_t i = 0; i < pv[k].size(); ++i) {
        double g = grads[s][k][i] / divisor;
        m[k][i] = 0.9 * m[k][i] + 0.1 * g;
        v[k][i] = 0.999 * v[k][i] + 0.001 * g * g;
        double mh = m[k][i] / (1 - std::pow(0.9, t)), vh = v[k][i] / (1 - std::pow(0.999, t));
        u[i] = mh / (std::sqrt(vh) + 1e-6) + wd * pv[k][i];
        pn += pv[k][i] * pv[k][i];
        un += u[i] * u[i];
      }
      double ratio = k == 0 ? std::sqrt(pn) / std::sqrt(un) : 1.0;
      for (std::size_t i = 0; i < pv[k].size(); ++i) pv[k][i] -= 0.02 * ratio * u[i];
    }
    std::vector<float> gw, gb;
    for (double x : grads[s][0]) gw.push_back(static_cast<float>(x));
    for (double x : grads[s][1]) gb.push_back(static_cast<float>(x));
    set_grad(w, gw);
    set_grad(b, gb);
    double norm = opt->step();
    EXPECT_NEAR(norm, std::sqrt(sumsq), 1e-5);
    expect_near_rel(values(w.value), pv[0], 2e-6, "lamb w step " + std::to_string(s));
    expect_near_rel(values(b.value), pv[1], 2e-6, "lamb b step " + std::to_string(s));
    if (s == 0) {  // the clipped gradient reached the moments: m = 0.1 * g / ||g||
      expect_near_rel(values(*opt->state()[1].second), m[0], 1e-6, "exp_avg");
    }
  }
}

TEST(Groups, PatternsAndFlagsResolve) {
  OptimizerOptions o;
  o.weight_decay = 0.01;
  o.groups = {{"encoder.*", 0.5, -1.0}, {"*.embedding.*", 1.0, 0.0}};
  EXPECT_EQ(resolve_group("encoder.layer0.weight", false, o), std::make_pair(0.5, 0.01));
  EXPECT_EQ(resolve_group("encoder.layer0.bias", true, o), std::make_pair(0.5, 0.0));
  EXPECT_EQ(resolve_group("model.embedding.weight", false, o), std::make_pair(1.0, 0.0));
  EXPECT_EQ(resolve_group("head.weight", false, o), std::make_pair(1.0, 0.01));
  o.exclude_flagged_from_decay = false;
  EXPECT_EQ(resolve_group("head.bias", true, o), std::make_pair(1.0, 0.01));
}

TEST(Groups, LrMultiplierAndDecayApplyPerTensor) {
  Fixture f;
  Parameter& a = f.add("slow.weight", {1.0f});
  Parameter& b = f.add("fast.bias", {1.0f}, true);
  OptimizerOptions o;
  o.kind = OptimizerKind::SGD;
  o.lr = 0.1;
  o.weight_decay = 1.0;
  o.groups = {{"slow.*", 0.5, -1.0}};
  auto opt = make_optimizer(f.params, o);
  set_grad(a, {1.0f});
  set_grad(b, {1.0f});
  opt->step();
  EXPECT_NEAR(values(a.value)[0], 1.0 - 0.05 * (1.0 + 1.0), 1e-7);  // lr 0.05, decay 1
  EXPECT_NEAR(values(b.value)[0], 1.0 - 0.1 * 1.0, 1e-7);           // lr 0.1, no decay
}

TEST(State, RestoresBitExactly) {
  for (OptimizerKind kind : {OptimizerKind::SGD, OptimizerKind::AdamW, OptimizerKind::LAMB}) {
    OptimizerOptions o;
    o.kind = kind;
    o.lr = 0.05;
    o.momentum = 0.9;
    o.weight_decay = 0.01;
    o.amsgrad = true;
    Fixture fa, fb;
    Parameter& pa = fa.add("w", {0.3f, -0.7f, 1.1f, 0.0f});
    auto a = make_optimizer(fa.params, o);
    auto grads = [](int s) { return std::vector<float>{0.1f * s, -0.2f, 0.05f * s * s, 0.3f}; };
    for (int s = 0; s < 3; ++s) {
      set_grad(pa, grads(s));
      a->step();
    }
    // A second optimizer restored from the first one's state continues identically.
    Parameter& pb = fb.add("w", values(pa.value));
    auto b = make_optimizer(fb.params, o);
    auto sa = a->state(), sb = b->state();
    ASSERT_EQ(sa.size(), sb.size());
    for (std::size_t i = 0; i < sa.size(); ++i) {
      EXPECT_EQ(sa[i].first, sb[i].first);
      sb[i].second->copy_from(*sa[i].second);
    }
    EXPECT_EQ(b->step_count(), 3);
    for (int s = 3; s < 6; ++s) {
      set_grad(pa, grads(s));
      set_grad(pb, grads(s));
      a->step();
      b->step();
    }
    auto va = values(pa.value), vb = values(pb.value);
    for (std::size_t i = 0; i < va.size(); ++i) {
      EXPECT_EQ(float_bits(va[i]), float_bits(vb[i])) << optimizer_kind_name(kind) << " " << i;
    }
  }
}

TEST(Clip, GlobalNormAndClipping) {
  Tensor g1 = Tensor::from_vector(std::vector<float>{3.0f, 4.0f}, {2});
  Tensor g2 = Tensor::from_vector(std::vector<float>{12.0f}, {1});
  EXPECT_NEAR(global_norm({g1, g2}), 13.0, 1e-6);
  // Below the threshold nothing changes.
  EXPECT_NEAR(clip_grad_norm({g1, g2}, 20.0), 13.0, 1e-6);
  EXPECT_EQ(values(g1)[0], 3.0f);
  // Above: grads *= max / (norm + 1e-6).
  EXPECT_NEAR(clip_grad_norm({g1, g2}, 6.5), 13.0, 1e-6);
  double coef = 6.5 / (13.0 + 1e-6);
  EXPECT_NEAR(values(g1)[1], 4.0 * coef, 1e-6);
  EXPECT_NEAR(values(g2)[0], 12.0 * coef, 1e-6);
  EXPECT_NEAR(global_norm({g1, g2}), 6.5, 1e-5);
}

TEST(Clip, SgdClipsThroughOptions) {
  Fixture f;
  Parameter& p = f.add("w", {0.0f, 0.0f});
  OptimizerOptions o;
  o.kind = OptimizerKind::SGD;
  o.lr = 1.0;
  o.max_grad_norm = 1.0;
  auto opt = make_optimizer(f.params, o);
  set_grad(p, {3.0f, 4.0f});
  EXPECT_NEAR(opt->step(), 5.0, 1e-6);
  expect_near_rel(values(p.value), {-0.6, -0.8}, 1e-6, "clipped sgd");
}

TEST(Optimizer, F64WeightsUseF64State) {
  auto p = std::make_unique<Parameter>();
  p->name = "w";
  p->value = Tensor::from_vector(std::vector<double>{1.0}, {1});
  p->grad = Tensor::from_vector(std::vector<double>{0.5}, {1});
  OptimizerOptions o;
  o.lr = 0.1;
  auto opt = make_optimizer(std::vector<Parameter*>{p.get()}, o);
  opt->step();
  EXPECT_EQ(opt->state()[1].second->dtype(), DType::F64);
  EXPECT_NEAR(p->value.to_vector<double>()[0], 1.0 - 0.1 * 0.5 / (0.5 + 1e-8), 1e-15);
}

TEST(Optimizer, NamesParse) {
  EXPECT_EQ(optimizer_kind_from_name("lamb"), OptimizerKind::LAMB);
  try {
    optimizer_kind_from_name("adam");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("sgd, adamw, lamb"), std::string::npos);
  }
}

}  // namespace
}  // namespace kiln::optim
