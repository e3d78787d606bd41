// MixedPrecisionOptimizer's resident mode on the CPU (the same logic the CUDA kernels run): bit
// for bit equal to host mode for every optimizer and level, skipped steps decided from the state,
// errors reported by report(), and a resume through make_resident() after loading a checkpoint.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/optim/resident_harness.h"

namespace kiln::optim::resident_test {
namespace {

const Device kCpu = Device::cpu();

TEST(ResidentMode, MatchesHostModeBitForBit) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name());
    const DType dtype = parameter_dtype(c.amp);
    const std::vector<double> table = lr_table(c.optim.lr);
    Model host_model(kCpu, dtype), res_model(kCpu, dtype);
    MixedPrecisionOptimizer host(host_model.params, c.optim, c.amp);
    MixedPrecisionOptimizer res(res_model.params, c.optim, c.amp);
    auto results = run_host(host_model, host, table, 0, kSteps);
    res.make_resident(table, 0);
    ASSERT_TRUE(res.resident());
    run_resident_and_compare(res_model, res, kCpu, table, 0, kSteps, results);
    expect_same_state(host_model, host, res_model, res);
    // The run exercised what it claims: skips (the two injections at least), growth, clipping.
    int skipped = 0, grown = 0, clipped = 0;
    for (const StepResult& r : results) {
      skipped += r.skipped;
      grown += r.next_scale > r.scale;
      clipped += !r.skipped && r.grad_norm > c.optim.max_grad_norm;
    }
    EXPECT_GE(skipped, 2);
    EXPECT_GE(grown, 1);
    EXPECT_GE(clipped, 1);
  }
}

// The trainer reads the state back only now and then: the steps in between run unobserved.
TEST(ResidentMode, ReportingOnlyAtTheEndGivesTheSameState) {
  Case c = cases()[10];  // AdamW O0
  c.amp.level = OptLevel::O2;
  const std::vector<double> table = lr_table(c.optim.lr);
  Model host_model(kCpu, parameter_dtype(c.amp)), res_model(kCpu, parameter_dtype(c.amp));
  MixedPrecisionOptimizer host(host_model.params, c.optim, c.amp);
  MixedPrecisionOptimizer res(res_model.params, c.optim, c.amp);
  auto results = run_host(host_model, host, table, 0, kSteps);
  res.make_resident(table, 0);
  for (int s = 0; s < kSteps; ++s) {
    res.zero_grad();
    fill_grads(res_model, s + 1, resident_loss_scale(res, kCpu));
    res.step_resident();
  }
  ResidentReport r = res.report();
  expect_same_state(host_model, host, res_model, res);
  int skipped = 0;
  for (const StepResult& h : results) skipped += h.skipped;
  EXPECT_EQ(r.skipped_steps, skipped);
  EXPECT_EQ(r.optimizer_steps, kSteps - skipped);
  EXPECT_EQ(r.grad_norm, results.back().grad_norm);
  EXPECT_EQ(res.scale(), host.scale());
  EXPECT_EQ(res.lr(), lr_at(table, kSteps));
}

// Host mode applies an inf/NaN update without a scaler; resident mode skips it (the weights are
// never corrupted) and report() names the step.
TEST(ResidentMode, NonFiniteWithoutScalerSkipsAndThrows) {
  Case c = cases()[10];  // AdamW O0
  c.amp.loss_scale = LossScaleMode::None;
  const std::vector<double> table = lr_table(c.optim.lr);
  Model m(kCpu, DType::F32);
  MixedPrecisionOptimizer opt(m.params, c.optim, c.amp);
  opt.make_resident(table, 0);
  EXPECT_EQ(resident_loss_scale(opt, kCpu), 1.0);
  for (int s = 0; s < kInfStep - 1; ++s) {
    opt.zero_grad();
    fill_grads(m, s + 1, 1.0);
    opt.step_resident();
  }
  EXPECT_EQ(opt.report().optimizer_steps, kInfStep - 1);
  std::vector<Tensor> before;
  for (Parameter* p : m.params) before.push_back(p->value.clone());
  opt.zero_grad();
  fill_grads(m, kInfStep, 1.0);
  opt.step_resident();
  try {
    opt.report();
    FAIL() << "expected an error for inf/NaN gradients without a loss scaler";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("non-finite gradients (inf/NaN) at step " + std::to_string(kInfStep)),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("no loss scaler"), std::string::npos) << what;
  }
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    EXPECT_TRUE(same_bytes(m.params[i]->value, before[i])) << m.params[i]->name;
  }
  EXPECT_EQ(opt.optimizer().step_count(), kInfStep - 1);
}

// A dynamic scale that overflows at min_scale: host mode throws in step(), resident mode records
// the step and report() throws the same message with it.
TEST(ResidentMode, OverflowAtMinScaleThrows) {
  Case c = cases()[0];
  c.amp.scaler.init_scale = 4.0;
  c.amp.scaler.min_scale = 1.0;
  const std::vector<double> table = lr_table(c.optim.lr);
  Model m(kCpu, DType::F32), hm(kCpu, DType::F32);
  MixedPrecisionOptimizer opt(m.params, c.optim, c.amp), host(hm.params, c.optim, c.amp);
  opt.make_resident(table, 0);
  for (int s = 0; s < 2; ++s) {  // 4 -> 2 -> 1
    opt.zero_grad();
    for (Parameter* p : m.params) p->grad.fill(INFINITY);
    opt.step_resident();
    EXPECT_TRUE(opt.report().skipped);
    for (Parameter* p : hm.params) p->grad.fill(INFINITY);
    EXPECT_TRUE(host.step().skipped);
  }
  EXPECT_EQ(opt.scale(), 1.0);
  opt.zero_grad();
  for (Parameter* p : m.params) p->grad.fill(INFINITY);
  opt.step_resident();
  std::string host_message;
  try {
    host.step();
  } catch (const Error& e) {
    host_message = e.what();
  }
  EXPECT_NE(host_message.find("minimum scale"), std::string::npos) << host_message;
  try {
    opt.report();
    FAIL() << "expected an overflow error at the minimum scale";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("loss scale overflow at the minimum scale 1 at step 3:"), std::string::npos)
        << what;
  }
}

// Save after 12 resident steps, load into a fresh model and optimizer, make_resident() at step 12
// and continue: bit for bit the uninterrupted host run.
TEST(ResidentMode, ResumeAfterLoadContinuesIdentically) {
  for (const Case& c : {cases()[4], cases()[12], cases()[22]}) {  // SGD, AdamW, LAMB: O2..O3
    SCOPED_TRACE(c.name());
    const DType dtype = parameter_dtype(c.amp);
    const std::vector<double> table = lr_table(c.optim.lr);
    const int first = 12;
    Model host_model(kCpu, dtype), a_model(kCpu, dtype), b_model(kCpu, dtype);
    MixedPrecisionOptimizer host(host_model.params, c.optim, c.amp);
    auto results = run_host(host_model, host, table, 0, kSteps);
    MixedPrecisionOptimizer a(a_model.params, c.optim, c.amp);
    a.make_resident(table, 0);
    run_resident_and_compare(a_model, a, kCpu, table, 0, first, results);
    // The checkpoint: weights, optimizer state, scaler state (all current after report()).
    MixedPrecisionOptimizer b(b_model.params, c.optim, c.amp);
    for (std::size_t i = 0; i < a_model.params.size(); ++i) {
      b_model.params[i]->value.copy_from(a_model.params[i]->value);
    }
    auto sa = a.state(), sb = b.state();
    ASSERT_EQ(sa.size(), sb.size());
    for (std::size_t i = 0; i < sa.size(); ++i) sb[i].second->copy_from(*sa[i].second);
    b.scaler().load_state(a.scaler().state());
    b.refresh_model_weights();
    b.make_resident(table, first);
    std::vector<StepResult> rest(results.begin() + first, results.end());
    run_resident_and_compare(b_model, b, kCpu, table, first, kSteps - first, rest);
    expect_same_state(host_model, host, b_model, b);
  }
}

TEST(ResidentMode, RefusesShardedOptimizersAndHostSteps) {
  Case c = cases()[0];  // SGD O0
  Model m(kCpu, DType::F32);
  MixedPrecisionOptimizer sharded(m.params, c.optim, c.amp);
  sharded.set_sumsq_hook([](double local) { return local; });
  EXPECT_THROW(sharded.make_resident(lr_table(1e-3), 0), Error);
  EXPECT_FALSE(sharded.resident());
  // Host mode: the scale the host keeps, where the loss's backward reads it.
  ASSERT_NE(sharded.loss_scale_source(), nullptr);
  EXPECT_EQ(*sharded.loss_scale_source(), sharded.scale());
  MixedPrecisionOptimizer opt(m.params, c.optim, c.amp);
  EXPECT_THROW(opt.make_resident({}, 0), InputError);
  opt.make_resident(lr_table(1e-3), 0);
  // Made resident again (a resume): the state stays where a captured graph reads it.
  const double* source = opt.loss_scale_source();
  opt.make_resident(lr_table(2e-3), 5);
  EXPECT_EQ(opt.loss_scale_source(), source);
  EXPECT_EQ(opt.lr(), lr_table(2e-3)[5]);
  EXPECT_THROW(opt.step(), Error);
  EXPECT_THROW(opt.upload_resident_state(-1), InputError);
}

}  // namespace
}  // namespace kiln::optim::resident_test
