#pragma once
// MixedPrecisionOptimizer's resident mode against host mode (test_resident.cc on the CPU,
// test_optim_gpu.cc on CUDA): the same model, gradients and LR schedule run through step() and
// through step_resident() + report(), with inf/NaN injected at two steps, clipping on and a
// dynamic scaler that grows and backs off; the runs must agree bit for bit.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/ops.h"
#include "optim/amp/amp.h"

namespace kiln::optim::resident_test {

// Sizes: one partial chunk, a few elements, one element.
const std::vector<std::int64_t> kSizes = {1000, 7, 1};
constexpr int kSteps = 30;
// 1-based steps whose gradients get an inf (the first) or a NaN (the second).
constexpr int kInfStep = 5, kNanStep = 17;

struct Model {
  std::vector<std::unique_ptr<Parameter>> owned;
  std::vector<Parameter*> params;
  Model(Device device, DType dtype) {
    const char* names[] = {"fc.weight", "fc.bias", "emb.scale"};
    for (std::size_t i = 0; i < kSizes.size(); ++i) {
      auto p = std::make_unique<Parameter>();
      p->name = names[i];
      p->no_weight_decay = i == 1;
      p->fp32_in_half = i == 1;
      DType dt = p->fp32_in_half ? DType::F32 : dtype;
      Tensor v = Tensor::empty({kSizes[i]}, DType::F32);
      ops::fill_normal(v, 0.0, 1.0, 11, 1000003 * i);
      p->value = v.to(device, dt);
      p->grad = Tensor::zeros({kSizes[i]}, dt, device);
      params.push_back(p.get());
      owned.push_back(std::move(p));
    }
  }
};

// The LR of every step: warmup then decay; shorter than the run, so the last entry holds.
inline std::vector<double> lr_table(double base) {
  std::vector<double> t;
  for (int s = 0; s < 24; ++s) t.push_back(base * (s < 4 ? (s + 1) / 4.0 : 1.0 - 0.02 * s));
  return t;
}

inline double lr_at(const std::vector<double>& table, std::int64_t step) {
  return table[std::min<std::size_t>(static_cast<std::size_t>(step), table.size() - 1)];
}

// The gradients a backward under `scale` leaves (rounded once into the gradient dtype), with an
// inf or a NaN at the injection steps. `step` is 1-based.
inline void fill_grads(Model& m, int step, double scale) {
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    Tensor g = Tensor::empty({kSizes[i]}, DType::F32);
    ops::fill_normal(g, 0.0, step % 4 == 0 ? 1.0 : 0.01, 23, 1000003 * i + 77 * step);
    ops::scale(g, scale);
    if (step == kInfStep && i == 0) g.slice(0, 3, 4).fill(INFINITY);
    if (step == kNanStep && i == 1) g.slice(0, 0, 1).fill(NAN);
    m.params[i]->grad.copy_from(g);
  }
}

// The loss scale the resident state holds, read as the loss backward would (from memory).
inline double resident_loss_scale(const MixedPrecisionOptimizer& opt, Device device) {
  Tensor source =
      Tensor::wrap(const_cast<double*>(opt.loss_scale_source()), {1}, DType::F64, device);
  return source.item();
}

inline bool same_bytes(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  Tensor x = a.to(Device::cpu()), y = b.to(Device::cpu());
  return std::memcmp(x.data(), y.data(), x.nbytes()) == 0;
}

// Weights, optimizer state (masters and "optimizer.step" included) and scaler state.
inline void expect_same_state(Model& a, MixedPrecisionOptimizer& oa, Model& b,
                              MixedPrecisionOptimizer& ob) {
  for (std::size_t i = 0; i < a.params.size(); ++i) {
    EXPECT_TRUE(same_bytes(a.params[i]->value, b.params[i]->value)) << a.params[i]->name;
  }
  auto sa = oa.state(), sb = ob.state();
  ASSERT_EQ(sa.size(), sb.size());
  for (std::size_t i = 0; i < sa.size(); ++i) {
    EXPECT_EQ(sa[i].first, sb[i].first);
    EXPECT_TRUE(same_bytes(*sa[i].second, *sb[i].second)) << sa[i].first;
  }
  EXPECT_EQ(oa.scaler().state().scale, ob.scaler().state().scale);
  EXPECT_EQ(oa.scaler().state().growth_tracker, ob.scaler().state().growth_tracker);
  EXPECT_EQ(oa.optimizer().step_count(), ob.optimizer().step_count());
}

struct Case {
  OptimizerOptions optim;
  AmpOptions amp;
  std::string name() const {
    return std::string(optimizer_kind_name(optim.kind)) + (optim.nesterov ? " nesterov" : "") +
           (optim.amsgrad ? " amsgrad" : "") + " " + opt_level_name(amp.level) + " " +
           half_type_name(amp.half);
  }
};

// The optimizers and levels every equality test covers: clipping on (the gradients' norm is
// far above max_grad_norm), a dynamic scaler that grows every 3 clean steps.
inline std::vector<Case> cases() {
  std::vector<OptimizerOptions> optims;
  OptimizerOptions sgd;
  sgd.kind = OptimizerKind::SGD;
  sgd.lr = 0.05;
  sgd.momentum = 0.9;
  sgd.weight_decay = 0.01;
  optims.push_back(sgd);
  sgd.nesterov = true;
  optims.push_back(sgd);
  OptimizerOptions adamw;
  adamw.kind = OptimizerKind::AdamW;
  adamw.lr = 1e-2;
  adamw.weight_decay = 0.01;
  optims.push_back(adamw);
  adamw.amsgrad = true;
  optims.push_back(adamw);
  OptimizerOptions lamb;
  lamb.kind = OptimizerKind::LAMB;
  lamb.lr = 2e-2;
  lamb.eps = 1e-6;
  lamb.weight_decay = 0.01;
  optims.push_back(lamb);
  std::vector<Case> out;
  for (OptimizerOptions o : optims) {
    o.max_grad_norm = 0.5;
    o.groups.push_back({"emb.*", 0.5, -1.0});  // a per-tensor LR multiplier
    for (auto [level, half] : {std::pair{OptLevel::O0, HalfType::FP16},
                               {OptLevel::O1, HalfType::FP16},
                               {OptLevel::O2, HalfType::FP16},
                               {OptLevel::O2, HalfType::BF16},
                               {OptLevel::O3, HalfType::BF16}}) {
      Case c;
      c.optim = o;
      c.amp.level = level;
      c.amp.half = half;
      c.amp.loss_scale = LossScaleMode::Dynamic;
      c.amp.scaler.growth_interval = 3;
      c.amp.scaler.init_scale = 1024.0;
      out.push_back(c);
    }
  }
  return out;
}

// One run of `steps` host-mode steps (from schedule step `first`), returning each step's result.
inline std::vector<StepResult> run_host(Model& m, MixedPrecisionOptimizer& opt,
                                        const std::vector<double>& table, int first, int steps) {
  std::vector<StepResult> results;
  for (int s = first; s < first + steps; ++s) {
    opt.set_lr(lr_at(table, s));
    opt.zero_grad();
    fill_grads(m, s + 1, opt.scale());
    results.push_back(opt.step());
  }
  return results;
}

// The same steps in resident mode (already made resident at schedule step `first`), reported after
// every step and compared with the host run's results. After the first step nothing may allocate
// on the parameters' device.
inline void run_resident_and_compare(Model& m, MixedPrecisionOptimizer& opt, Device device,
                                     const std::vector<double>& table, int first, int steps,
                                     const std::vector<StepResult>& host) {
  std::int64_t skipped = 0;
  for (int s = first; s < first + steps; ++s) {
    opt.zero_grad();
    fill_grads(m, s + 1, resident_loss_scale(opt, device));
    const std::uint64_t before = allocator_for(device).stats().allocations;
    opt.step_resident();
    const std::uint64_t after = allocator_for(device).stats().allocations;
    if (s > first) {
      EXPECT_EQ(after, before) << "step_resident() allocated at step " << s + 1;
    }
    ResidentReport r = opt.report();
    const StepResult& h = host[static_cast<std::size_t>(s - first)];
    SCOPED_TRACE("step " + std::to_string(s + 1));
    EXPECT_EQ(r.skipped, h.skipped);
    EXPECT_EQ(r.found_inf, h.found_inf);
    // A NaN gradient gives a NaN norm in both modes.
    EXPECT_TRUE(r.grad_norm == h.grad_norm || (std::isnan(r.grad_norm) && std::isnan(h.grad_norm)))
        << r.grad_norm << " vs " << h.grad_norm;
    EXPECT_EQ(r.loss_scale, h.scale);
    EXPECT_EQ(r.next_loss_scale, h.next_scale);
    EXPECT_EQ(r.lr, lr_at(table, s));
    EXPECT_EQ(r.schedule_step, s + 1);
    skipped += h.skipped ? 1 : 0;
    EXPECT_EQ(r.skipped_steps, skipped);
  }
}

}  // namespace kiln::optim::resident_test
