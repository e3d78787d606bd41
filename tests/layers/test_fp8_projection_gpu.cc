// FP8 projections on the GPU against their CPU twin (layers/fp8_projection.h), on fresh random
// inputs that bf16 represents exactly, so both sides cast the same values at the same scales:
// the FP8 bytes are equal, the products exact, and what differs is the fp32 summation order and
// the GPU's bf16 output. Three training steps of a Linear (bias; GELU) and of a bare projection
// (the llama family's path): outputs and gradients within a few bf16 steps, and the scaling
// states (scales, histories, overflow counts: written by the CUDA casts' last block) equal to
// the twin's bit for bit.

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/ops.h"
#include "core/stream.h"
#include "layers/fp8_projection.h"
#include "layers/linear.h"
#include "tests/gpu_test_util.h"

namespace kiln {
namespace {

using kiln::testing::fresh_seed;
using kiln::testing::kGpu;

Tensor random_bf16(const Shape& shape, double bound, std::uint64_t seed) {
  Tensor t = Tensor::empty(shape, DType::F32);
  ops::fill_uniform(t, -bound, bound, seed);
  return t.to(DType::BF16).to(DType::F32);
}

// |gpu - cpu| <= 2^-7 (|cpu| + rms): a bf16 rounding of the output, and the summation order.
void expect_close(const Tensor& got, const Tensor& want, const std::string& what) {
  auto g = got.to(Device::cpu(), DType::F32).to_vector<double>(), w = want.to_vector<double>();
  ASSERT_EQ(g.size(), w.size()) << what;
  double rms = 0;
  for (double v : w) rms += v * v;
  rms = std::sqrt(rms / static_cast<double>(w.size()));
  ASSERT_GT(rms, 0.0) << what;
  int bad = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double tol = std::ldexp(1.0, -7) * (std::fabs(w[i]) + rms);
    if (!(std::fabs(g[i] - w[i]) <= tol) && ++bad <= 5)
      ADD_FAILURE() << what << "[" << i << "]: gpu " << g[i] << ", cpu " << w[i];
  }
  EXPECT_EQ(bad, 0) << what << " (" << g.size() << " elements, rms " << rms << ")";
}

void expect_same_state(const Tensor& gpu, const Tensor& cpu, const std::string& what) {
  EXPECT_EQ(gpu.to(Device::cpu()).to_vector<float>(), cpu.to_vector<float>()) << what;
}

Fp8Settings settings(Fp8Recipe recipe) {
  Fp8Settings s;
  s.enabled = true;
  s.scaling.recipe = recipe;
  s.scaling.history = 4;
  return s;
}

class Fp8ProjectionGpu : public ::testing::TestWithParam<Fp8Recipe> {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_FAIL() << "no GPU visible: the gpu suite needs one";
  }
};

TEST_P(Fp8ProjectionGpu, LinearMatchesTheCpuTwin) {
  std::uint64_t seed = fresh_seed();
  const std::int64_t rows = 256, in = 192, out = 320;
  for (Activation act : {Activation::None, Activation::GELU}) {
    Linear cpu(in, out, true, act), gpu(in, out, true, act);
    cpu.use_fp8(settings(GetParam()));
    gpu.use_fp8(settings(GetParam()));
    cpu.reset_parameters(++seed);
    for (Parameter* p : cpu.parameters()) p->value.copy_from(p->value.to(DType::BF16));
    gpu.reset_parameters(seed);
    cpu.to(Device::cpu(), DType::F32);
    gpu.to(kGpu, DType::BF16);
    Context cctx, gctx;
    gctx.run.device = kGpu;
    gctx.run.precision.activation = gctx.run.precision.matmul = DType::BF16;
    const std::string what =
        std::string(act == Activation::None ? "linear" : "gelu") + " seed " + std::to_string(seed);
    for (int step = 0; step < 3; ++step) {
      // Inputs grow and shrink, so the delayed scales saturate some steps and the histories move.
      const double bound = step == 1 ? 6.0 : 1.0;
      const Tensor x = random_bf16({rows, in}, bound, ++seed),
                   dy = random_bf16({rows, out}, 1e-3 * bound, ++seed);
      kiln::testing::poison_gpu_cache();
      const Tensor yc = cpu.forward(cctx, x), yg = gpu.forward(gctx, x.to(kGpu, DType::BF16));
      const std::string at = what + " step " + std::to_string(step);
      expect_close(yg, yc, at + " y");
      if (act == Activation::GELU) {
        // GELU's derivative reads the bf16 pre-activation on the GPU: dz differs by its rounding,
        // so only the forward is compared bit for bit below.
        expect_same_state(gpu.buffers()[0]->value, cpu.buffers()[0]->value, at + " state");
        continue;
      }
      // Each step's gradients alone: a bf16 gradient accumulated over steps rounds once per step.
      for (Linear* l : {&cpu, &gpu})
        for (Parameter* p : l->parameters()) p->grad.fill(0.0);
      const Tensor dxc = cpu.backward(cctx, dy), dxg = gpu.backward(gctx, dy.to(kGpu, DType::BF16));
      expect_close(dxg, dxc, at + " dx");
      expect_close(gpu.weight().grad, cpu.weight().grad, at + " weight grad");
      expect_close(gpu.bias()->grad, cpu.bias()->grad, at + " bias grad");
      expect_same_state(gpu.buffers()[0]->value, cpu.buffers()[0]->value, at + " state");
    }
  }
}

TEST_P(Fp8ProjectionGpu, BareProjectionMatchesTheCpuTwin) {
  std::uint64_t seed = fresh_seed();
  const std::int64_t rows = 128, in = 256, out = 96;
  Buffer cpu_state, gpu_state;
  cpu_state.value = Tensor::zeros(Fp8Projection::state_shape(settings(GetParam())), DType::F32);
  gpu_state.value = cpu_state.value.clone();
  Fp8Projection cpu(cpu_state, settings(GetParam())), gpu(gpu_state, settings(GetParam()));
  gpu_state.value = gpu_state.value.to(kGpu);
  Context cctx, gctx;
  gctx.run.device = kGpu;
  for (int step = 0; step < 3; ++step) {
    const Tensor x = random_bf16({rows, in}, 2.0, ++seed), w = random_bf16({out, in}, 0.1, ++seed),
                 dz = random_bf16({rows, out}, 1e-2, ++seed);
    Tensor yc = Tensor::empty({rows, out}, DType::F32),
           yg = Tensor::empty({rows, out}, DType::BF16, kGpu);
    project_forward(&cpu, cctx, x, w, yc);
    const Tensor xg = x.to(kGpu, DType::BF16), wg = w.to(kGpu, DType::BF16);
    project_forward(&gpu, gctx, xg, wg, yg);
    const std::string at = "seed " + std::to_string(seed) + " step " + std::to_string(step);
    expect_close(yg, yc, at + " y");
    Tensor dwc = Tensor::zeros({out, in}, DType::F32), dxc = Tensor::empty({rows, in}, DType::F32);
    Tensor dwg = Tensor::zeros({out, in}, DType::F32, kGpu),
           dxg = Tensor::empty({rows, in}, DType::BF16, kGpu);
    project_backward(&cpu, x, w, dz, dwc, dxc);
    project_backward(&gpu, xg, wg, dz.to(kGpu, DType::BF16), dwg, dxg);
    expect_close(dwg, dwc, at + " dw");
    expect_close(dxg, dxc, at + " dx");
    expect_same_state(gpu_state.value, cpu_state.value, at + " state");
  }
}

INSTANTIATE_TEST_SUITE_P(Recipes, Fp8ProjectionGpu,
                         ::testing::Values(Fp8Recipe::Delayed, Fp8Recipe::Current),
                         [](const ::testing::TestParamInfo<Fp8Recipe>& info) {
                           return std::string(info.param == Fp8Recipe::Delayed ? "Delayed"
                                                                               : "Current");
                         });

}  // namespace
}  // namespace kiln
