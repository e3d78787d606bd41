// The CUDA multi-tensor optimizers, unscale/inf-detect pass, O2 masters and resident mode (also
// replayed as a CUDA graph) against the CPU backend and host mode, on fresh random inputs. The
// element rules are shared and the kernels are built without FMA contraction, so fp32 results agree
// to rounding of the norms (LAMB, clipping).

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <tuple>

#include "core/allocator.h"
#include "core/cuda/cuda_check.h"
#include "core/ops.h"
#include "core/stream.h"
#include "optim/amp/amp.h"
#include "tests/optim/option_presets.h"
#include "tests/optim/resident_harness.h"

namespace kiln::optim {
namespace {

const Device kGpu = Device::cuda(0);

std::uint64_t fresh_seed() {
  return static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
}

class OptimGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_FAIL() << "no GPU visible: the gpu suite needs one";
  }
};

// Sizes cover one element, a partial chunk, several chunks and a ragged tail.
const std::vector<std::int64_t> kSizes = {1, 37, 32768, 100003, 4096};

struct Model {
  std::vector<std::unique_ptr<Parameter>> owned;
  std::vector<Parameter*> params;
  Model(Device device, DType dtype, std::uint64_t seed) {
    for (std::size_t i = 0; i < kSizes.size(); ++i) {
      auto p = std::make_unique<Parameter>();
      p->name = "layer" + std::to_string(i) + (i % 2 ? ".bias" : ".weight");
      p->no_weight_decay = i % 2 == 1;
      p->fp32_in_half = i == 1;
      DType dt = p->fp32_in_half ? DType::F32 : dtype;
      Tensor v = Tensor::empty({kSizes[i]}, DType::F32);
      ops::fill_normal(v, 0.0, 1.0, seed, 1000003 * i);
      p->value = v.to(device, dt);
      p->grad = Tensor::empty({kSizes[i]}, dt, device);
      p->grad.fill(NAN);  // poisoned: every step overwrites it
      params.push_back(p.get());
      owned.push_back(std::move(p));
    }
  }
};

void fill_grads(Model& m, std::uint64_t seed, int step, double scale) {
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    Tensor g = Tensor::empty({kSizes[i]}, DType::F32);
    ops::fill_normal(g, 0.0, step % 4 == 0 ? 1.0 : 0.01, seed + 7, 1000003 * i + 77 * step);
    ops::scale(g, scale);
    m.params[i]->grad.copy_from(g);
  }
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (double v : t.to_vector<double>()) m = std::max(m, std::fabs(v));
  return m;
}

// max |a - b| / max(max |b|, floor) over one tensor.
double relative_difference(const Tensor& a, const Tensor& b, double floor = 0) {
  auto x = a.to_vector<double>(), y = b.to_vector<double>();
  double diff = 0, ref = floor;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i])) return INFINITY;
    diff = std::max(diff, std::fabs(x[i] - y[i]));
    ref = std::max(ref, std::fabs(y[i]));
  }
  return ref > 0 ? diff / ref : diff;
}

// CUDA state against CPU state (state()[0], the step count, skipped), each kind of state
// (moments, masters) on the scale of that kind over all tensors: a one-element tensor's first
// moment can sit near 0, where its own relative error means nothing.
void expect_states_close(const std::vector<std::pair<std::string, Tensor*>>& cpu,
                         const std::vector<std::pair<std::string, Tensor*>>& gpu,
                         double tolerance = 1e-6) {
  ASSERT_EQ(cpu.size(), gpu.size());
  auto kind_of = [](const std::string& name) { return name.substr(name.rfind('.') + 1); };
  std::map<std::string, double> scale;
  for (std::size_t i = 1; i < cpu.size(); ++i) {
    double& m = scale[kind_of(cpu[i].first)];
    m = std::max(m, max_abs(*cpu[i].second));
  }
  for (std::size_t i = 1; i < cpu.size(); ++i) {
    EXPECT_EQ(cpu[i].first, gpu[i].first);
    EXPECT_LT(relative_difference(*gpu[i].second, *cpu[i].second, scale[kind_of(cpu[i].first)]),
              tolerance)
        << cpu[i].first;
  }
}

void compare_optimizer(OptimizerOptions o, int steps, double weight_tolerance = 1e-6,
                       double state_tolerance = 1e-6) {
  std::uint64_t seed = fresh_seed();
  Model cpu(Device::cpu(), DType::F32, seed), gpu(kGpu, DType::F32, seed);
  auto oc = make_optimizer(cpu.params, o), og = make_optimizer(gpu.params, o);
  double worst = 0;
  for (int s = 0; s < steps; ++s) {
    fill_grads(cpu, seed, s, 1.0);
    fill_grads(gpu, seed, s, 1.0);
    oc->step();
    og->step();
  }
  for (std::size_t i = 0; i < cpu.params.size(); ++i) {
    double d = relative_difference(gpu.params[i]->value, cpu.params[i]->value);
    worst = std::max(worst, d);
    EXPECT_LT(d, weight_tolerance) << optimizer_kind_name(o.kind) << " " << cpu.params[i]->name;
  }
  expect_states_close(oc->state(), og->state(), state_tolerance);
  std::cout << optimizer_kind_name(o.kind) << ": max relative difference over " << steps
            << " steps " << worst << "\n";
}

TEST_F(OptimGpu, SgdMatchesCpuOver100Steps) {
  OptimizerOptions o = presets::sgd_momentum_options();
  o.nesterov = true;
  o.groups = {{"layer2.*", 0.5, -1.0}};
  compare_optimizer(o, 100);
  o.nesterov = false;
  o.dampening = 0.1;
  o.max_grad_norm = 5.0;
  compare_optimizer(o, 100);
}

TEST_F(OptimGpu, AdamWMatchesCpuOver100Steps) {
  OptimizerOptions o = presets::adamw_options();
  compare_optimizer(o, 100);
  o.amsgrad = true;
  o.max_grad_norm = 1.0;
  compare_optimizer(o, 100);
}

TEST_F(OptimGpu, LambMatchesCpuOver100Steps) {
  OptimizerOptions o = presets::lamb_options();
  o.max_grad_norm = 1.0;
  compare_optimizer(o, 100);
  o.bias_correction = false;
  compare_optimizer(o, 100);
}

// bf16 state rounded stochastically: the CUDA kernels draw the CPU's random bits (the same
// Philox block per element, parameter and step), so SGD and AdamW agree bit for bit (measured on
// the H200) as with fp32 state. LAMB's clip divisor comes from a norm summed in another order
// (1e-7 apart in fp32 state): a moment that lands that close to a rounding threshold stores one
// bf16 step (2^-8) apart, so its states agree within one step and its weights within 3e-4.
TEST_F(OptimGpu, Bf16MomentsMatchCpu) {
  for (OptimizerOptions o : {presets::sgd_momentum_options(), presets::adamw_options()}) {
    o.moments_dtype = MomentsDtype::BF16;
    o.max_grad_norm = 1.0;
    compare_optimizer(o, 100, 1e-12, 1e-12);
  }
  OptimizerOptions lamb = presets::lamb_options();
  lamb.moments_dtype = MomentsDtype::BF16;
  lamb.max_grad_norm = 1.0;
  compare_optimizer(lamb, 100, 3e-4, 1.0 / 256);
}

TEST_F(OptimGpu, GlobalNormAndClipMatchCpu) {
  std::uint64_t seed = fresh_seed();
  Model cpu(Device::cpu(), DType::F32, seed), gpu(kGpu, DType::F32, seed);
  fill_grads(cpu, seed, 0, 3.0);
  fill_grads(gpu, seed, 0, 3.0);
  std::vector<Tensor> gc, gg;
  for (auto* p : cpu.params) gc.push_back(p->grad);
  for (auto* p : gpu.params) gg.push_back(p->grad);
  double nc = global_norm(gc), ng = global_norm(gg);
  EXPECT_GT(nc, 1.0);
  EXPECT_NEAR(ng, nc, 1e-6 * nc);
  EXPECT_EQ(global_norm(gg), ng);  // deterministic
  clip_grad_norm(gc, 1.0);
  clip_grad_norm(gg, 1.0);
  for (std::size_t i = 0; i < gc.size(); ++i) EXPECT_LT(relative_difference(gg[i], gc[i]), 1e-6);
}

void compare_amp(OptLevel level, DType half, bool inject_inf) {
  std::uint64_t seed = fresh_seed();
  AmpOptions a;
  a.level = level;
  a.half = half == DType::BF16 ? HalfType::BF16 : HalfType::FP16;
  a.loss_scale = LossScaleMode::Dynamic;
  a.scaler.init_scale = 1024.0;
  DType pdt = parameter_dtype(a);
  Model cpu(Device::cpu(), pdt, seed), gpu(kGpu, pdt, seed);
  OptimizerOptions o;
  o.lr = 1e-3;
  o.weight_decay = 0.01;
  o.max_grad_norm = 50.0;
  MixedPrecisionOptimizer mc(cpu.params, o, a), mg(gpu.params, o, a);
  for (int s = 0; s < 20; ++s) {
    mc.zero_grad();
    mg.zero_grad();
    fill_grads(cpu, seed, s, mc.scale());
    fill_grads(gpu, seed, s, mg.scale());
    if (inject_inf && s == 5) {  // one inf deep inside the largest tensor
      for (Model* m : {&cpu, &gpu}) {
        Tensor g = m->params[3]->grad;
        g.slice(0, 77777, 77778).fill(s % 2 ? NAN : INFINITY);
      }
    }
    mg.unscale_and_check();
    mc.unscale_and_check();
    EXPECT_EQ(mg.found_inf_flag().item(), mc.found_inf_flag().item()) << "step " << s;
    StepResult rc = mc.step(), rg = mg.step();
    EXPECT_EQ(rc.skipped, rg.skipped);
    EXPECT_EQ(rg.skipped, inject_inf && s == 5);
    if (!rc.skipped) {
      EXPECT_NEAR(rg.grad_norm, rc.grad_norm, 1e-5 * rc.grad_norm);
    }
    EXPECT_EQ(rc.next_scale, rg.next_scale);
  }
  auto sc = mc.state(), sg = mg.state();
  ASSERT_EQ(sc.size(), sg.size());
  for (std::size_t i = 1; i < sc.size(); ++i) {
    EXPECT_EQ(sc[i].first, sg[i].first);
    EXPECT_LT(relative_difference(*sg[i].second, *sc[i].second), 1e-6) << sc[i].first;
  }
  for (std::size_t i = 0; i < cpu.params.size(); ++i) {
    // Half weights: equal up to one rounding of nearly equal masters.
    double tol = cpu.params[i]->value.dtype() == DType::F32 ? 1e-6 : 8e-3;
    EXPECT_LT(relative_difference(gpu.params[i]->value, cpu.params[i]->value), tol)
        << opt_level_name(level) << " " << cpu.params[i]->name;
  }
}

TEST_F(OptimGpu, UnscaleAndInfDetectMatchCpu) {
  compare_amp(OptLevel::O1, DType::F16, true);
}

TEST_F(OptimGpu, O2MastersMatchCpuF16) {
  compare_amp(OptLevel::O2, DType::F16, true);
}

TEST_F(OptimGpu, O2MastersMatchCpuBF16) {
  compare_amp(OptLevel::O2, DType::BF16, false);
}

TEST_F(OptimGpu, O3HalfWeightsMatchCpu) {
  compare_amp(OptLevel::O3, DType::F16, false);
}

// Bit for bit, whatever the devices.
bool same_bytes(const Tensor& a, const Tensor& b) {
  Tensor x = a.to(Device::cpu()), y = b.to(Device::cpu());
  return x.dtype() == y.dtype() && x.numel() == y.numel() &&
         std::memcmp(x.data(), y.data(), x.nbytes()) == 0;
}

// The old O2 way: float(grad) * float(1 / scale) into an fp32 tensor (the master gradient).
void unscale_into(const Tensor& scaled, double scale, Tensor& out) {
  const float inv_scale = static_cast<float>(1.0 / scale);
  std::vector<float> v = scaled.to_vector<float>();  // exact for f16, bf16 and f32
  for (float& x : v) x = x * inv_scale;
  out.copy_from(Tensor::from_vector(v, scaled.shape()));
}

// O2 keeps no fp32 master gradients: the kernels read the scaled half gradients and unscale them
// as they read them. (1) On the GPU, bit for bit the old way: the gradients unscaled into fp32
// tensors, then the optimizer on fp32 masters with a half model copy (same kernels, same
// arithmetic); the scale is not a power of two and grows during the run. (2) CUDA against the
// CPU, as the other amp cases.
void compare_o2_unscale_in_optimizer(OptimizerOptions o, DType half) {
  SCOPED_TRACE(std::string(optimizer_kind_name(o.kind)) + " " + dtype_name(half) +
               " max_grad_norm " + std::to_string(o.max_grad_norm));
  std::uint64_t seed = fresh_seed();
  AmpOptions a;
  a.level = OptLevel::O2;
  a.half = half == DType::BF16 ? HalfType::BF16 : HalfType::FP16;
  a.loss_scale = LossScaleMode::Dynamic;
  a.scaler.init_scale = 1000.0;
  a.scaler.growth_interval = 3;
  Model cpu(Device::cpu(), half, seed), gpu(kGpu, half, seed);
  std::vector<OptimizedTensor> ref_tensors;
  for (Parameter* p : gpu.params) {
    OptimizedTensor t;
    t.name = p->name;
    t.no_weight_decay = p->no_weight_decay;
    std::tie(t.lr_multiplier, t.weight_decay) = resolve_group(p->name, p->no_weight_decay, o);
    t.value = Tensor::empty(p->value.shape(), DType::F32, kGpu);
    t.value.copy_from(p->value);
    t.grad = Tensor::zeros(p->value.shape(), DType::F32, kGpu);
    if (is_half(p->value.dtype())) t.model_copy = p->value.clone();
    ref_tensors.push_back(t);
  }
  auto ref = make_optimizer(ref_tensors, o);
  MixedPrecisionOptimizer mc(cpu.params, o, a), mg(gpu.params, o, a);
  for (std::size_t i = 0; i < gpu.params.size(); ++i) {
    EXPECT_EQ(mg.optimizer().tensors()[i].grad.data(), gpu.params[i]->grad.data());
  }
  for (int s = 0; s < 12; ++s) {
    mc.zero_grad();
    mg.zero_grad();
    fill_grads(cpu, seed, s, mc.scale());
    fill_grads(gpu, seed, s, mg.scale());
    for (std::size_t i = 0; i < gpu.params.size(); ++i) {
      unscale_into(gpu.params[i]->grad, mg.scale(), ref_tensors[i].grad);
    }
    StepResult rc = mc.step(), rg = mg.step();
    ASSERT_FALSE(rc.skipped);
    ASSERT_FALSE(rg.skipped);
    EXPECT_NEAR(rg.grad_norm, rc.grad_norm, 1e-5 * rc.grad_norm);
    ref->step(rg.grad_norm);  // the old step: the pass's norm, the fp32 unscaled gradients
  }
  EXPECT_EQ(mg.scale(), 16000.0);  // grown after every third step: 1000 .. 8000 were used
  for (std::size_t i = 0; i < gpu.params.size(); ++i) {
    const OptimizedTensor& t = ref_tensors[i];
    const Tensor& model_weights = t.model_copy.defined() ? t.model_copy : t.value;
    EXPECT_TRUE(same_bytes(gpu.params[i]->value, model_weights)) << t.name;
    EXPECT_TRUE(same_bytes(mg.optimizer().tensors()[i].value, t.value)) << t.name;
  }
  auto sg = mg.optimizer().state(), sr = ref->state();
  ASSERT_EQ(sg.size(), sr.size());
  for (std::size_t i = 0; i < sg.size(); ++i) {
    EXPECT_EQ(sg[i].first, sr[i].first);
    EXPECT_TRUE(same_bytes(*sg[i].second, *sr[i].second)) << sg[i].first;
  }
  expect_states_close(mc.state(), mg.state());  // CUDA against the CPU
}

void compare_o2_unscale_in_optimizer_all(OptimizerOptions o) {
  for (DType half : {DType::F16, DType::BF16}) {
    for (double max_grad_norm : {0.0, 50.0}) {
      o.max_grad_norm = max_grad_norm;
      compare_o2_unscale_in_optimizer(o, half);
    }
  }
}

TEST_F(OptimGpu, O2UnscaleInOptimizerSgd) {
  compare_o2_unscale_in_optimizer_all(presets::sgd_momentum_options());
}

TEST_F(OptimGpu, O2UnscaleInOptimizerAdamW) {
  OptimizerOptions o = presets::adamw_options();
  compare_o2_unscale_in_optimizer_all(o);
}

TEST_F(OptimGpu, O2UnscaleInOptimizerLamb) {
  compare_o2_unscale_in_optimizer_all(presets::lamb_options());
}

// Device memory: O2 with AdamW holds per half parameter the fp32 master and two moments (no fp32
// master gradient), and a step allocates no gradient-sized temporary.
TEST_F(OptimGpu, O2KeepsNoFp32GradientCopy) {
  std::uint64_t seed = fresh_seed();
  Model gpu(kGpu, DType::F16, seed);
  OptimizerOptions o;
  o.weight_decay = 0.01;
  AmpOptions a;
  a.level = OptLevel::O2;
  CachingAllocator& device = cuda_allocator(0);
  auto r = [](std::int64_t bytes) {
    return round_allocation_size(static_cast<std::size_t>(bytes));
  };
  std::size_t expected = r(8);  // the found-inf flag and the norm
  for (Parameter* p : gpu.params) {
    expected += (is_half(p->value.dtype()) ? 3 : 2) * r(4 * p->value.numel());
  }
  const std::size_t before = device.stats().allocated_bytes;
  MixedPrecisionOptimizer m(gpu.params, o, a);
  const std::size_t after = device.stats().allocated_bytes;
  // The old fp32 master gradients alone were over 500 KiB here.
  EXPECT_GE(after - before, expected);
  EXPECT_LT(after - before, expected + r(4 * 4096));
  for (int s = 1; s <= 2; ++s) {  // the first step also uploads the descriptor tables
    m.zero_grad();
    fill_grads(gpu, seed, s, m.scale());
    device.reset_peak_stats();
    const std::size_t start = device.stats().allocated_bytes;
    ASSERT_FALSE(m.step().skipped);
    if (s == 2) {
      EXPECT_EQ(device.stats().allocated_bytes, start);
      EXPECT_LT(device.stats().peak_allocated_bytes - start, r(4 * 4096));
    }
  }
}

TEST_F(OptimGpu, O2HalfWeightsAreRoundedMasters) {
  std::uint64_t seed = fresh_seed();
  AmpOptions a;
  a.level = OptLevel::O2;
  a.half = HalfType::BF16;
  Model gpu(kGpu, DType::BF16, seed);
  OptimizerOptions o;
  o.kind = OptimizerKind::LAMB;
  o.lr = 1e-2;
  MixedPrecisionOptimizer m(gpu.params, o, a);
  for (int s = 0; s < 3; ++s) {
    m.zero_grad();
    fill_grads(gpu, seed, s, 1.0);
    ASSERT_FALSE(m.step().skipped);
  }
  int masters = 0;
  for (auto& [name, t] : m.state()) {
    if (name.size() < 7 || name.substr(name.size() - 7) != ".master") continue;
    ++masters;
    std::string pname = name.substr(0, name.size() - 7);
    for (auto* p : gpu.params) {
      if (p->name == pname) {
        EXPECT_EQ(p->value.to_vector<float>(), t->to(DType::BF16).to_vector<float>()) << name;
      }
    }
  }
  EXPECT_EQ(masters, 4);  // every bf16 parameter but the fp32_in_half one
}

// Resident mode on CUDA against host mode on CUDA: the same kernels with their scalars read from
// the device state, so bit for bit; nothing allocates after the first step.
TEST_F(OptimGpu, ResidentMatchesHostModeBitForBit) {
  namespace rt = resident_test;
  for (const rt::Case& c : rt::cases()) {
    SCOPED_TRACE(c.name());
    const DType dtype = parameter_dtype(c.amp);
    const std::vector<double> table = rt::lr_table(c.optim.lr);
    rt::Model host_model(kGpu, dtype), res_model(kGpu, dtype);
    MixedPrecisionOptimizer host(host_model.params, c.optim, c.amp);
    MixedPrecisionOptimizer res(res_model.params, c.optim, c.amp);
    auto results = rt::run_host(host_model, host, table, 0, rt::kSteps);
    res.make_resident(table, 0);
    rt::run_resident_and_compare(res_model, res, kGpu, table, 0, rt::kSteps, results);
    rt::expect_same_state(host_model, host, res_model, res);
  }
}

// Resident mode on CUDA against host mode on the CPU: the same decisions, norms and states within
// the tolerances of the tests above.
TEST_F(OptimGpu, ResidentMatchesCpuHostMode) {
  namespace rt = resident_test;
  for (const rt::Case& c : rt::cases()) {
    SCOPED_TRACE(c.name());
    const DType dtype = parameter_dtype(c.amp);
    const std::vector<double> table = rt::lr_table(c.optim.lr);
    rt::Model cpu(Device::cpu(), dtype), gpu(kGpu, dtype);
    MixedPrecisionOptimizer mc(cpu.params, c.optim, c.amp), mg(gpu.params, c.optim, c.amp);
    auto results = rt::run_host(cpu, mc, table, 0, rt::kSteps);
    mg.make_resident(table, 0);
    for (int s = 0; s < rt::kSteps; ++s) {
      mg.zero_grad();
      rt::fill_grads(gpu, s + 1, rt::resident_loss_scale(mg, kGpu));
      mg.step_resident();
      ResidentReport r = mg.report();
      const StepResult& h = results[static_cast<std::size_t>(s)];
      EXPECT_EQ(r.skipped, h.skipped) << "step " << s + 1;
      EXPECT_EQ(r.next_loss_scale, h.next_scale) << "step " << s + 1;
      if (!h.skipped) {
        EXPECT_NEAR(r.grad_norm, h.grad_norm, 1e-5 * h.grad_norm) << "step " << s + 1;
      }
    }
    expect_states_close(mc.state(), mg.state());
    for (std::size_t i = 0; i < cpu.params.size(); ++i) {
      double tol = cpu.params[i]->value.dtype() == DType::F32 ? 1e-6 : 8e-3;
      EXPECT_LT(relative_difference(gpu.params[i]->value, cpu.params[i]->value), tol)
          << cpu.params[i]->name;
    }
    EXPECT_EQ(mg.optimizer().step_count(), mc.optimizer().step_count());
    EXPECT_EQ(mg.scaler().state().scale, mc.scaler().state().scale);
  }
}

// A CUDA graph of one step_resident(), captured in the strict (global) mode that refuses any
// allocation or synchronisation, replayed once per step: equal to host mode bit for bit.
class CudaGraph {
 public:
  void capture_begin(cudaStream_t stream) {
    KILN_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  }
  void capture_end(cudaStream_t stream) {
    KILN_CUDA_CHECK(cudaStreamEndCapture(stream, &graph_));
    KILN_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
  }
  void launch(cudaStream_t stream) { KILN_CUDA_CHECK(cudaGraphLaunch(exec_, stream)); }
  ~CudaGraph() {
    if (exec_ != nullptr) KILN_IGNORE_ERROR(cudaGraphExecDestroy(exec_));
    if (graph_ != nullptr) KILN_IGNORE_ERROR(cudaGraphDestroy(graph_));
  }

 private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

TEST_F(OptimGpu, ResidentStepReplaysAsCudaGraph) {
  namespace rt = resident_test;
  const auto all = rt::cases();
  for (const rt::Case& c : {all[1], all[7], all[12], all[23]}) {
    SCOPED_TRACE(c.name());
    const DType dtype = parameter_dtype(c.amp);
    const std::vector<double> table = rt::lr_table(c.optim.lr);
    rt::Model host_model(kGpu, dtype), res_model(kGpu, dtype);
    MixedPrecisionOptimizer host(host_model.params, c.optim, c.amp);
    auto results = rt::run_host(host_model, host, table, 0, rt::kSteps);
    Stream stream = Stream::create(kGpu);
    StreamGuard guard(kGpu, stream.handle());
    cudaStream_t s = static_cast<cudaStream_t>(stream.handle());
    MixedPrecisionOptimizer res(res_model.params, c.optim, c.amp);
    res.make_resident(table, 0);
    CudaGraph graph;
    for (int step = 0; step < rt::kSteps; ++step) {
      res.zero_grad();
      rt::fill_grads(res_model, step + 1, rt::resident_loss_scale(res, kGpu));
      if (step == 0) {
        res.step_resident();  // the first call uploads the descriptor tables
      } else {
        if (step == 1) {
          graph.capture_begin(s);
          res.step_resident();
          graph.capture_end(s);
        }
        graph.launch(s);
      }
      ResidentReport r = res.report();
      const StepResult& h = results[static_cast<std::size_t>(step)];
      EXPECT_EQ(r.skipped, h.skipped) << "step " << step + 1;
      EXPECT_EQ(r.next_loss_scale, h.next_scale) << "step " << step + 1;
      EXPECT_EQ(r.schedule_step, step + 1);
    }
    rt::expect_same_state(host_model, host, res_model, res);
  }
}

}  // namespace
}  // namespace kiln::optim
