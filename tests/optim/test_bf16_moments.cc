// optimizer.moments_dtype BF16: stochastic rounding is exactly unbiased, bf16 state halves the
// bytes and tracks fp32 state, runs repeat bit for bit, and a ZeRO piece (element_offset) rounds
// as the whole parameter does.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "core/ops.h"
#include "core/random.h"
#include "optim/optimizer.h"
#include "tests/optim/option_presets.h"

namespace kiln::optim {
namespace {

Tensor normal(std::int64_t n, std::uint64_t seed) {
  Tensor t = Tensor::empty({n}, DType::F32);
  ops::fill_normal(t, 0.0, 1.0, seed);
  return t;
}

// Every one of the 65,536 low halves of the random word: the rounded values average to x exactly
// (a fraction f of them round up, f being x's distance from the value below), each result is one
// of x's two bf16 neighbours, and inf and NaN stay what they are.
TEST(StochasticRounding, AveragesToTheValueOverEveryRandomWord) {
  const float xs[] = {1.0f,   1.00390625f, 0.3333333f, -2.718281f,
                      1e-20f, -7.1e-39f,   65504.1f,   3.0e38f};
  for (float x : xs) {
    const std::uint16_t down = static_cast<std::uint16_t>(float_bits(x) >> 16);
    double sum = 0;
    for (std::uint32_t r = 0; r < 65536; ++r) {
      // The high half of the word must not matter.
      const std::uint16_t b = bf16_bits_stochastic(x, r | (r * 2654435761u & 0xffff0000u));
      ASSERT_TRUE(b == down || b == static_cast<std::uint16_t>(down + 1)) << x;
      sum += bf16_bits_to_float(b);
    }
    EXPECT_EQ(sum / 65536.0, static_cast<double>(x)) << x;
  }
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isinf(bf16_bits_to_float(bf16_bits_stochastic(-inf, 0xffffu))));
  EXPECT_LT(bf16_bits_to_float(bf16_bits_stochastic(-inf, 0xffffu)), 0.0f);
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(bf16_bits_stochastic(std::nanf(""), 0xffffu))));
  EXPECT_EQ(bf16_bits_widen(0x3f80), 1.0f);
}

struct Model {
  std::vector<std::unique_ptr<Parameter>> owned;
  std::vector<Parameter*> params;
  explicit Model(std::uint64_t seed) {
    const std::int64_t sizes[] = {4099, 37, 1000};
    for (int i = 0; i < 3; ++i) {
      auto p = std::make_unique<Parameter>();
      p->name = "layer" + std::to_string(i) + ".weight";
      p->value = normal(sizes[i], seed + i);
      p->grad = Tensor::zeros({sizes[i]}, DType::F32);
      params.push_back(p.get());
      owned.push_back(std::move(p));
    }
  }
  void fill_grads(std::uint64_t seed, int step) {
    for (std::size_t i = 0; i < params.size(); ++i) {
      params[i]->grad.copy_from(
          normal(params[i]->grad.numel(), seed * 1000 + static_cast<std::uint64_t>(step) * 7 + i));
    }
  }
};

std::vector<std::vector<float>> train(const OptimizerOptions& o, int steps, Optimizer** out_state,
                                      std::unique_ptr<Optimizer>* keep) {
  Model m(5);
  auto opt = make_optimizer(m.params, o);
  for (int s = 0; s < steps; ++s) {
    m.fill_grads(9, s);
    opt->step();
  }
  std::vector<std::vector<float>> w;
  for (Parameter* p : m.params) w.push_back(p->value.to_vector<float>());
  if (out_state != nullptr) *out_state = opt.get();
  if (keep != nullptr) *keep = std::move(opt);
  return w;
}

double max_relative(const std::vector<std::vector<float>>& a,
                    const std::vector<std::vector<float>>& b) {
  double num = 0, den = 0;
  for (std::size_t t = 0; t < a.size(); ++t) {
    for (std::size_t i = 0; i < a[t].size(); ++i) {
      num = std::max(num, std::fabs(static_cast<double>(a[t][i]) - b[t][i]));
      den = std::max(den, std::fabs(static_cast<double>(b[t][i])));
    }
  }
  return num / den;
}

OptimizerOptions with_bf16(OptimizerOptions o) {
  o.moments_dtype = MomentsDtype::BF16;
  return o;
}

// For each kind: the state is bf16 (half the bytes), the weights after 50 steps stay close to
// fp32 state's (the rounding noise is zero-mean) and not equal to them (the setting changes the
// arithmetic); a second run is bit for bit the same. SGD's step is lr times the momentum buffer
// itself, so each store's error (up to 2^-8 of the buffer) reaches the weights undivided: 1e-2;
// Adam-family steps divide m by sqrt(v), where the errors mostly cancel: 1e-3.
TEST(Bf16Moments, HalfTheBytesTrackFp32AndRepeat) {
  const std::pair<OptimizerOptions, double> kinds[] = {{presets::sgd_momentum_options(), 1e-2},
                                                       {presets::adamw_options(), 1e-3},
                                                       {presets::lamb_options(), 1e-3}};
  for (const auto& [o, tolerance] : kinds) {
    const char* name = optimizer_kind_name(o.kind);
    std::unique_ptr<Optimizer> fp32_opt, bf16_opt;
    auto fp32 = train(o, 50, nullptr, &fp32_opt);
    auto bf16 = train(with_bf16(o), 50, nullptr, &bf16_opt);
    auto again = train(with_bf16(o), 50, nullptr, nullptr);
    std::int64_t fp32_bytes = 0, bf16_bytes = 0;
    for (auto& [key, t] : fp32_opt->state()) {
      if (key != "optimizer.step") fp32_bytes += static_cast<std::int64_t>(t->nbytes());
    }
    for (auto& [key, t] : bf16_opt->state()) {
      if (key == "optimizer.step") continue;
      EXPECT_EQ(t->dtype(), DType::BF16) << name << " " << key;
      bf16_bytes += static_cast<std::int64_t>(t->nbytes());
    }
    EXPECT_GT(fp32_bytes, 0) << name;
    EXPECT_EQ(2 * bf16_bytes, fp32_bytes) << name;
    const double d = max_relative(bf16, fp32);
    EXPECT_GT(d, 0.0) << name;
    EXPECT_LT(d, tolerance) << name;
    EXPECT_EQ(max_relative(again, bf16), 0.0) << name;
    std::cout << name << ": bf16 moments against fp32 after 50 steps, max relative " << d << "\n";
  }
}

// A parameter split in two pieces that say where they start (as ZeRO's are) steps to the whole
// parameter's weights and bf16 state bit for bit; pieces that do not say so round differently.
TEST(Bf16Moments, PiecesRoundAsTheWholeParameter) {
  const std::int64_t n = 70001, cut = 33333;
  Tensor whole = normal(n, 3);
  Tensor split = whole.clone();
  Tensor unaligned = whole.clone();
  Tensor grad = Tensor::zeros({n}, DType::F32);
  OptimizerOptions o = with_bf16(presets::adamw_options());
  auto piece = [&](Tensor& t, std::int64_t lo, std::int64_t hi, std::int64_t offset) {
    OptimizedTensor p;
    p.name = "w";
    p.value = t.slice(0, lo, hi);
    p.grad = grad.slice(0, lo, hi);
    p.weight_decay = o.weight_decay;
    p.element_offset = offset;
    return p;
  };
  auto one = make_optimizer({piece(whole, 0, n, 0)}, o);
  auto two = make_optimizer({piece(split, 0, cut, 0), piece(split, cut, n, cut)}, o);
  auto wrong = make_optimizer({piece(unaligned, 0, cut, 0), piece(unaligned, cut, n, 0)}, o);
  for (int s = 0; s < 20; ++s) {
    grad.copy_from(normal(n, 100 + static_cast<std::uint64_t>(s)));
    one->step();
    two->step();
    wrong->step();
  }
  EXPECT_EQ(whole.to_vector<float>(), split.to_vector<float>());
  EXPECT_NE(whole.to_vector<float>(), unaligned.to_vector<float>());
  const auto whole_m = one->state()[1].second->to_vector<float>();
  const auto first = two->state()[1].second->to_vector<float>();
  const auto second = two->state()[3].second->to_vector<float>();
  ASSERT_EQ(first.size() + second.size(), whole_m.size());
  EXPECT_TRUE(std::equal(first.begin(), first.end(), whole_m.begin()));
  EXPECT_TRUE(std::equal(second.begin(), second.end(), whole_m.begin() + cut));
}

// A checkpoint of fp32 state restores into bf16 state (rounded to nearest) and back, as
// copy_from casts: switching moments_dtype between runs resumes.
TEST(Bf16Moments, StateRestoresAcrossDtypes) {
  Optimizer* fp32 = nullptr;
  std::unique_ptr<Optimizer> keep_fp32, keep_bf16;
  train(presets::adamw_options(), 3, &fp32, &keep_fp32);
  Optimizer* bf16 = nullptr;
  train(with_bf16(presets::adamw_options()), 1, &bf16, &keep_bf16);
  auto from = fp32->state();
  auto to = bf16->state();
  ASSERT_EQ(from.size(), to.size());
  for (std::size_t i = 0; i < from.size(); ++i) {
    ASSERT_EQ(from[i].first, to[i].first);
    to[i].second->copy_from(*from[i].second);
    if (from[i].first == "optimizer.step") continue;
    const auto a = from[i].second->to_vector<float>();
    const auto b = to[i].second->to_vector<float>();
    for (std::size_t k = 0; k < a.size(); ++k) {
      EXPECT_NEAR(b[k], a[k], std::fabs(a[k]) * (1.0 / 256)) << from[i].first;
    }
  }
  EXPECT_EQ(bf16->step_count(), 3);
}

}  // namespace
}  // namespace kiln::optim
