// Transformer layers on the GPU against the CPU backend, in f32, f16 and bf16 (O2-style: half
// weights and activations, LayerNorm parameters fp32), on fresh random inputs. Launchers are
// called with NaN-poisoned outputs; whole layers run after the caching allocator's free blocks
// have been filled with NaN. Tolerance: |gpu - cpu| <= factor * eps(dtype) * (rms(cpu) + |cpu|).

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include "core/allocator.h"
#include "core/ops.h"
#include "core/stream.h"
#include "layers/attention.h"
#include "layers/cuda/attention_cuda.h"
#include "layers/cuda/embedding_cuda.h"
#include "layers/cuda/layernorm_cuda.h"
#include "layers/embedding.h"
#include "layers/grouped_query_attention.h"
#include "layers/layernorm.h"
#include "layers/models/model.h"
#include "layers/swiglu_mlp.h"
#include "layers/transformer_block.h"
#include "tests/gpu_test_util.h"

namespace kiln {
namespace {

using kiln::testing::fresh_seed;
using kiln::testing::kGpu;

double epsilon(DType dt) {
  return dt == DType::F32 ? 1.2e-7 : dt == DType::F16 ? 9.8e-4 : 7.8e-3;
}

// f32 CPU values that are exactly representable in `dt`.
Tensor random_cpu(const Shape& shape, DType dt, std::uint64_t seed, double bound = 1.0) {
  Tensor t = Tensor::empty(shape, DType::F32);
  ops::fill_uniform(t, -bound, bound, seed);
  return t.to(dt).to(DType::F32);
}

Tensor poisoned(const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype, kGpu);
  t.fill(NAN);
  return t;
}

// Fills the caching allocator's free memory with NaN, so that a layer's fresh outputs start
// poisoned.
void poison_allocator() {
  for (std::int64_t bytes : {std::int64_t{1} << 26, std::int64_t{1} << 22, std::int64_t{1} << 16}) {
    Tensor t = Tensor::empty({bytes / 4}, DType::F32, kGpu);
    t.fill(NAN);
  }
  device_synchronize(kGpu);
}

// `floor` raises the scale of a tensor whose exact values are ~0 (see compare_layer).
void expect_close(const Tensor& got, const Tensor& want, DType dt, const std::string& what,
                  double factor, double floor = 0.0) {
  ASSERT_TRUE(got.defined()) << what;
  ASSERT_EQ(got.numel(), want.numel()) << what;
  auto g = got.to_vector<double>(), w = want.to_vector<double>();
  double rms = 0;
  for (double v : w) rms += v * v;
  rms = std::sqrt(rms / std::max<std::size_t>(w.size(), 1));
  bool noise = rms < floor;  // a gradient that is zero in exact arithmetic
  if (!noise) {
    ASSERT_GT(rms, 0.0) << what << ": the CPU reference is all zero";
  }
  int bad = 0;
  double nonzero = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    nonzero += std::fabs(g[i]);
    double tol = factor * epsilon(dt) * (std::max(rms, floor) + std::fabs(w[i]));
    if (!(std::fabs(g[i] - w[i]) <= tol)) {
      if (++bad <= 5) ADD_FAILURE() << what << "[" << i << "]: gpu " << g[i] << ", cpu " << w[i];
    }
  }
  EXPECT_EQ(bad, 0) << what << " (" << g.size() << " elements, rms " << rms << ")";
  if (!noise) {
    EXPECT_GT(nonzero, 0.0) << what << ": all zero";
  }
}

class TransformerGpu : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_FAIL() << "no GPU visible: the gpu suite needs one";
  }
};

struct Run {
  Tensor y, dx;
  std::vector<Tensor> grads;
};

// Runs `layer` forward and backward on the CPU in f32, then on the GPU in `dt` (parameters in
// `dt` except fp32_in_half ones), from the same parameter values, inputs and dropout masks, and
// compares outputs, input gradients and parameter gradients.
void compare_layer(Layer& layer, const Tensor& x, const Shape& y_shape, DType dt, Context ctx,
                   double factor, std::uint64_t seed, const std::string& what) {
  for (Parameter* p : layer.parameters()) {
    ops::fill_uniform(p->value, -0.5, 0.5, ++seed);
    p->value.copy_from(p->value.to(dt));  // representable in dt: both sides start equal
  }
  Tensor dy = random_cpu(y_shape, dt, ++seed);
  auto run = [&](Device device, DType act) {
    Context c = ctx;
    c.run.device = device;
    c.run.precision.activation = act;
    c.run.precision.matmul = act;
    if (c.call.attention_mask.defined()) c.call.attention_mask = c.call.attention_mask.to(device);
    Run r;
    Tensor in = is_floating(x.dtype()) ? x.to(device, act) : x.to(device);
    r.y = layer.forward(c, in);
    r.dx = layer.backward(c, dy.to(device, act));
    for (Parameter* p : layer.parameters()) r.grads.push_back(p->grad.to(Device::cpu()).clone());
    return r;
  };
  layer.to(Device::cpu(), DType::F32);
  Run want = run(Device::cpu(), DType::F32);
  layer.to(kGpu, dt);
  poison_allocator();
  Run got = run(kGpu, dt);
  EXPECT_EQ(got.y.dtype(), dt) << what;
  EXPECT_EQ(got.y.shape(), want.y.shape()) << what;
  expect_close(got.y, want.y, dt, what + " y", factor);
  if (want.dx.defined()) expect_close(got.dx, want.dx, dt, what + " dx", factor);
  // The key bias's gradient is zero in exact arithmetic (softmax ignores a shift shared by a
  // row), so both sides hold rounding noise: its scale is the layer's largest gradient's.
  std::vector<Parameter*> params = layer.parameters();
  double largest_rms = 0;
  for (const Tensor& g : want.grads) {
    double sum = 0;
    for (double v : g.to_vector<double>()) sum += v * v;
    largest_rms = std::max(largest_rms, std::sqrt(sum / std::max<std::int64_t>(g.numel(), 1)));
  }
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::string& n = params[i]->name;
    bool key_bias = n.size() >= 8 && n.compare(n.size() - 8, 8, "key.bias") == 0;
    expect_close(got.grads[i], want.grads[i], dt, what + " grad " + n, factor,
                 key_bias ? largest_rms : 0.0);
  }
}

// Dropout's step (7) in pinned host memory: the CPU reads it there and, under unified addressing,
// the kernels too, so one context serves both devices.
const std::uint64_t* step_seven() {
  static std::uint64_t* step = [] {
    auto* p = static_cast<std::uint64_t*>(pinned_allocator().allocate(sizeof(std::uint64_t)));
    *p = 7;
    return p;
  }();
  return step;
}

Context training_context(std::uint64_t seed) {
  Context ctx;
  ctx.training = true;
  ctx.run.seed = seed;
  ctx.step.step = step_seven();
  return ctx;
}

Tensor padding_mask(std::int64_t b, std::int64_t t) {
  std::vector<float> m(static_cast<std::size_t>(b * t), 1.0f);
  for (std::int64_t i = 1; i < b; ++i)
    for (std::int64_t j = t - 3 * i; j < t; ++j) m[static_cast<std::size_t>(i * t + j)] = 0.0f;
  return Tensor::from_vector(m, {b, t});
}

// ---------------------------------------------------------------------------------------------
// Launchers with poisoned outputs.

TEST_P(TransformerGpu, LayerNormLaunchersMatchCpu) {
  DType dt = GetParam();
  std::uint64_t seed = fresh_seed();
  // 256 and 768 in half: the packed backward; every multiple of 8 up to 2048 in half: the packed
  // forward (1600: GPT-2 XL, lanes with fewer packs than others). With a residual: the sum x +
  // delta normalised and written, and the residual's gradient added to dx.
  for (std::int64_t cols : {50, 256, 768, 1600}) {
    for (bool residual : {false, true}) {
      SCOPED_TRACE("cols " + std::to_string(cols) + (residual ? " with a residual" : ""));
      const std::int64_t rows = 203;  // several 32- and 64-row chunks and a partial one
      LayerNorm ln(cols, 1e-5);
      ops::fill_uniform(ln.weight().value, 0.5, 1.5, seed + 1);
      ops::fill_uniform(ln.bias().value, -0.5, 0.5, seed + 2);
      Tensor x = random_cpu({rows, cols}, dt, seed + 3, 2.0),
             dy = random_cpu({rows, cols}, dt, seed + 4),
             delta = random_cpu({rows, cols}, dt, seed + 5),
             rg = random_cpu({rows, cols}, dt, seed + 6);
      Context cpu;
      if (residual) ln.add_to_next_input(delta);
      Tensor y_ref = ln.forward(cpu, x);
      Tensor sum_ref = ln.residual_sum();
      if (residual) ln.add_to_next_dx(rg);
      Tensor dx_ref = ln.backward(cpu, dy);
      Tensor gx = x.to(kGpu, dt), gdy = dy.to(kGpu, dt);
      Tensor gdelta = residual ? delta.to(kGpu, dt) : Tensor();
      Tensor grg = residual ? rg.to(kGpu, dt) : Tensor();
      Tensor w = ln.weight().value.to(kGpu), b = ln.bias().value.to(kGpu);
      Tensor y = poisoned({rows, cols}, dt), mean = poisoned({rows}, DType::F32),
             rstd = poisoned({rows}, DType::F32);
      Tensor sum = residual ? poisoned({rows, cols}, dt) : Tensor();
      cuda::layernorm_forward(gx, gdelta, w, b, 1e-5, y, sum, mean, rstd);
      // f32 rows of 1600: the two passes' sums differ in order by up to ~sqrt(cols) roundings.
      expect_close(y, y_ref, dt, "layernorm y", 16);
      if (residual) {
        // The CPU's reference runs in f32: its sum rounded once to dt is the kernel's.
        EXPECT_EQ(sum.to(Device::cpu(), DType::F32).to_vector<float>(),
                  sum_ref.to(Device::cpu(), dt).to(DType::F32).to_vector<float>());
      }
      Tensor normalised = residual ? sum : gx;
      Tensor dx = poisoned({rows, cols}, dt), dw = poisoned({cols}, DType::F32),
             db = poisoned({cols}, DType::F32);
      cuda::layernorm_backward(gdy, normalised, w, mean, rstd, grg, dx, dw, db, false);
      expect_close(dx, dx_ref, dt, "layernorm dx", 16);
      expect_close(dw, ln.weight().grad, dt, "layernorm dweight", 16);
      expect_close(db, ln.bias().grad, dt, "layernorm dbias", 16);
      // Deterministic: a second backward gives the same bits; accumulating adds them.
      Tensor dw2 = poisoned({cols}, DType::F32), db2 = poisoned({cols}, DType::F32);
      Tensor dx2 = poisoned({rows, cols}, dt);
      cuda::layernorm_backward(gdy, normalised, w, mean, rstd, grg, dx2, dw2, db2, false);
      EXPECT_EQ(dw.to_vector<float>(), dw2.to_vector<float>());
      EXPECT_EQ(db.to_vector<float>(), db2.to_vector<float>());
      cuda::layernorm_backward(gdy, normalised, w, mean, rstd, grg, dx2, dw2, db2, true);
      std::vector<float> once = dw.to_vector<float>(), twice = dw2.to_vector<float>();
      for (std::size_t i = 0; i < once.size(); ++i) ASSERT_EQ(twice[i], once[i] + once[i]) << i;
    }
  }
}

TEST_P(TransformerGpu, EmbeddingLaunchersMatchCpu) {
  DType dt = GetParam();
  std::uint64_t seed = fresh_seed();
  const std::int64_t num = 50, dim = 33, pad = 3, n = 4 * 37;
  Embedding emb(num, dim, pad);
  emb.weight().value.copy_from(emb.weight().value.to(dt));
  std::vector<std::int64_t> id(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)  // many repeats, the padding id among them
    id[static_cast<std::size_t>(i)] = static_cast<std::int64_t>((seed >> (i % 40)) % 9) * 5 % num;
  id[5] = pad;
  Tensor ids = Tensor::from_vector(id, {4, 37});
  Tensor dy = random_cpu({4, 37, dim}, dt, seed + 1);
  Tensor initial_grad = random_cpu({num, dim}, dt, seed + 2);
  emb.weight().grad.copy_from(initial_grad);
  Context cpu;
  Tensor y_ref = emb.forward(cpu, ids);
  emb.backward(cpu, dy);
  Tensor gids = ids.view({n}).to(kGpu);
  Tensor y = poisoned({n, dim}, dt);
  cuda::embedding_forward(gids, emb.weight().value.to(kGpu, dt), y);
  expect_close(y, y_ref, dt, "embedding y", 1);
  Tensor grad = initial_grad.to(kGpu, dt);
  cuda::embedding_backward(gids, dy.to(kGpu, dt).view({n, dim}), pad, grad);
  // Repeated ids sum in another order on the GPU (sorted) than on the CPU: up to ~16 terms.
  expect_close(grad, emb.weight().grad, dt, "embedding grad (accumulated)", 32);
  auto g = grad.to_vector<double>(), g0 = initial_grad.to(dt).to_vector<double>();
  for (std::int64_t c = 0; c < dim; ++c)
    EXPECT_EQ(g[static_cast<std::size_t>(pad * dim + c)],
              g0[static_cast<std::size_t>(pad * dim + c)]);
}

TEST_P(TransformerGpu, SoftmaxLaunchersMatchCpuThroughAttention) {
  // The fused softmax is checked through the attention layer (CPU loops vs CUDA kernel) with a
  // mask, odd T > 32 and dropout: the layer's probabilities feed everything after them.
  DType dt = GetParam();
  std::uint64_t seed = fresh_seed();
  const std::int64_t b = 3, t = 37, e = 64;
  for (QkvLayout layout : {QkvLayout::SeparateQKV, QkvLayout::FusedQKV}) {
    MultiHeadSelfAttention attn(e, 4, 0.1, layout);
    Context ctx = training_context(seed);
    ctx.call.attention_mask = padding_mask(b, t);
    compare_layer(attn, random_cpu({b, t, e}, dt, seed + 1), {b, t, e}, dt, ctx,
                  dt == DType::F32 ? 200 : 24, seed + 2,
                  layout == QkvLayout::FusedQKV ? "attention (fused)" : "attention (separate)");
  }
}

// ---------------------------------------------------------------------------------------------
// Whole layers.

TEST_P(TransformerGpu, LayerNormLayerMatchesCpu) {
  DType dt = GetParam();
  std::uint64_t seed = fresh_seed();
  LayerNorm ln(96, 1e-6);
  compare_layer(ln, random_cpu({3, 45, 96}, dt, seed, 2.0), {3, 45, 96}, dt, Context(),
                dt == DType::F32 ? 64 : 16, seed + 1, "layernorm");
}

TEST_P(TransformerGpu, EmbeddingLayerMatchesCpu) {
  DType dt = GetParam();
  std::uint64_t seed = fresh_seed();
  Embedding emb(40, 24, 0);
  std::vector<std::int64_t> id(2 * 29);
  for (std::size_t i = 0; i < id.size(); ++i)
    id[i] = static_cast<std::int64_t>((seed + i * i) % 40);
  compare_layer(emb, Tensor::from_vector(id, {2, 29}), {2, 29, 24}, dt, Context(), 8, seed,
                "embedding");
}

TEST_P(TransformerGpu, AttentionWithoutMaskOrDropoutMatchesCpu) {
  DType dt = GetParam();
  std::uint64_t seed = fresh_seed();
  MultiHeadSelfAttention attn(48, 3);
  compare_layer(attn, random_cpu({2, 129, 48}, dt, seed), {2, 129, 48}, dt, training_context(seed),
                dt == DType::F32 ? 200 : 24, seed + 1, "attention");
}

TEST_P(TransformerGpu, FusedAttentionMatchesCpu) {
  // Head dimension 64 in half takes the fused (flash) kernels (f32 the unfused path): one partial
  // key tile, exactly one, and several with a partial last; with a padding mask and dropout in
  // training, without either in eval; both parameter layouts.
  DType dt = GetParam();
  std::uint64_t seed = fresh_seed();
  const std::int64_t b = 3, e = 128;
  for (std::int64_t t : {37, 64, 197}) {
    for (bool training : {true, false}) {
      QkvLayout layout = t == 64 ? QkvLayout::SeparateQKV : QkvLayout::FusedQKV;
      MultiHeadSelfAttention attn(e, 2, 0.1, layout);
      Context ctx = training_context(seed);
      ctx.training = training;
      if (training) ctx.call.attention_mask = padding_mask(b, t);
      seed += 3;
      compare_layer(attn, random_cpu({b, t, e}, dt, seed), {b, t, e}, dt, ctx,
                    dt == DType::F32 ? 200 : 24, seed + 1,
                    "attention d=64 T=" + std::to_string(t) + (training ? " train" : " eval"));
    }
  }
}

TEST_P(TransformerGpu, UnmaskedAttentionMatchesCpuOnBothKernels) {
  // Without mask and dropout (ViT in training) the fused path runs cuDNN's attention, and with
  // KILN_ATTENTION_CUDNN=0 the flash kernels: each against the CPU, forward and backward. cuDNN's
  // backward must also be bitwise repeatable (its deterministic algorithm).
  DType dt = GetParam();
  std::uint64_t seed = fresh_seed();
  const std::int64_t b = 2, e = 128;
  for (const char* cudnn : {"1", "0"}) {
    ASSERT_EQ(setenv("KILN_ATTENTION_CUDNN", cudnn, 1), 0);
    for (std::int64_t t : {37, 197}) {
      MultiHeadSelfAttention attn(e, 2, 0.0, QkvLayout::FusedQKV);
      seed += 3;
      compare_layer(attn, random_cpu({b, t, e}, dt, seed), {b, t, e}, dt, training_context(seed),
                    dt == DType::F32 ? 200 : 24, seed + 1,
                    std::string("unmasked attention T=") + std::to_string(t) + " cudnn=" + cudnn);
      if (dt == DType::F32) continue;
      Tensor x = random_cpu({b, t, e}, dt, seed + 2).to(kGpu, dt);
      Tensor dy = random_cpu({b, t, e}, dt, seed + 3).to(kGpu, dt);
      Context c = training_context(seed);
      c.run.device = kGpu;
      c.run.precision.activation = c.run.precision.matmul = dt;
      std::vector<std::vector<double>> dx;
      for (int repeat = 0; repeat < 2; ++repeat) {
        attn.forward(c, x);
        dx.push_back(attn.backward(c, dy).to_vector<double>());
      }
      EXPECT_EQ(dx[0], dx[1]) << "attention backward T=" << t << " cudnn=" << cudnn
                              << " is not bitwise repeatable";
    }
  }
  ASSERT_EQ(unsetenv("KILN_ATTENTION_CUDNN"), 0);
}

// The attention paths a causal test runs: cuDNN (where it declines a shape, the flash kernels
// with one stderr line), Kiln's flash kernels, and the unfused softmax; f32 has only the last.
struct AttentionPath {
  const char* name;
  const char* unfused;  // KILN_ATTENTION_UNFUSED
  const char* cudnn;    // KILN_ATTENTION_CUDNN
};

std::vector<AttentionPath> attention_paths(DType dt, bool cudnn) {
  if (dt == DType::F32) return {{"unfused", "1", "0"}};
  std::vector<AttentionPath> paths;
  if (cudnn) paths.push_back({"cudnn", "0", "1"});
  paths.push_back({"flash", "0", "0"});
  paths.push_back({"unfused", "1", "0"});
  return paths;
}

TEST_P(TransformerGpu, CausalAttentionMatchesCpuOnEveryPath) {
  // GPT-2's causal attention at long T, without mask or dropout: cuDNN's causal attention, the
  // flash kernels (which skip the key tiles above the diagonal) and the unfused causal softmax,
  // each against the CPU, forward and backward. SeparateQKV for the key bias's noise floor.
  DType dt = GetParam();
  std::uint64_t seed = fresh_seed();
  struct Size {
    std::int64_t b, h, t;
    double x_bound;  // 4 heads (E = 256) halve the input so that the scores stay as spread
  };
  for (Size z : {Size{2, 2, 1024, 1.0}, Size{1, 4, 2048, 0.5}}) {
    for (const AttentionPath& path : attention_paths(dt, /*cudnn=*/true)) {
      ASSERT_EQ(setenv("KILN_ATTENTION_UNFUSED", path.unfused, 1), 0);
      ASSERT_EQ(setenv("KILN_ATTENTION_CUDNN", path.cudnn, 1), 0);
      const std::int64_t e = z.h * 64;
      MultiHeadSelfAttention attn(e, z.h, 0.0, QkvLayout::SeparateQKV, /*causal=*/true);
      seed += 3;
      compare_layer(attn, random_cpu({z.b, z.t, e}, dt, seed, z.x_bound), {z.b, z.t, e}, dt,
                    // f32: sums over 1024-2048 keys in another order on each side
                    training_context(seed), dt == DType::F32 ? 800 : 32, seed + 1,
                    "causal attention B=" + std::to_string(z.b) + " H=" + std::to_string(z.h) +
                        " T=" + std::to_string(z.t) + " " + path.name);
    }
  }
  ASSERT_EQ(unsetenv("KILN_ATTENTION_UNFUSED"), 0);
  ASSERT_EQ(unsetenv("KILN_ATTENTION_CUDNN"), 0);
}

TEST_P(TransformerGpu, CausalAttentionWithMaskAndDropoutMatchesCpu) {
  // Causal with a padding mask and dropout in training (the flash kernels in half, never cuDNN),
  // and in eval without either (cuDNN's causal graph): T with a partial tile, one tile exactly,
  // several tiles with a partial last, and a long one.
  DType dt = GetParam();
  std::uint64_t seed = fresh_seed();
  const std::int64_t b = 2, e = 128;
  for (std::int64_t t : {37, 64, 197, 1024}) {
    for (bool training : {true, false}) {
      for (const AttentionPath& path : attention_paths(dt, !training)) {
        ASSERT_EQ(setenv("KILN_ATTENTION_UNFUSED", path.unfused, 1), 0);
        ASSERT_EQ(setenv("KILN_ATTENTION_CUDNN", path.cudnn, 1), 0);
        MultiHeadSelfAttention attn(e, 2, 0.1, QkvLayout::SeparateQKV, /*causal=*/true);
        Context ctx = training_context(seed);
        ctx.training = training;
        if (training) ctx.call.attention_mask = padding_mask(b, t);
        seed += 3;
        // f32 sums over up to 1024 keys in another order on each side.
        compare_layer(attn, random_cpu({b, t, e}, dt, seed), {b, t, e}, dt, ctx,
                      dt == DType::F32 ? 800 : 32, seed + 1,
                      "causal attention T=" + std::to_string(t) +
                          (training ? " train " : " eval ") + path.name);
      }
    }
  }
  ASSERT_EQ(unsetenv("KILN_ATTENTION_UNFUSED"), 0);
  ASSERT_EQ(unsetenv("KILN_ATTENTION_CUDNN"), 0);
}

TEST_P(TransformerGpu, DropoutStepCounterIsReadWhenTheKernelsRun) {
  // Context::step.step in device memory (CUDA graphs replay it): the flash kernels and the
  // unfused softmax, forward and backward, read the step there as they run; the same step written
  // by the host gives the same bits, and a counter moved by ops::increment draws the next mask.
  DType dt = GetParam();
  std::uint64_t seed = fresh_seed();
  const std::int64_t b = 2, t = 97, e = 128;
  Tensor x = random_cpu({b, t, e}, dt, seed).to(kGpu, dt);
  Tensor dy = random_cpu({b, t, e}, dt, seed + 1).to(kGpu, dt);
  for (bool causal : {false, true}) {
    for (const AttentionPath& path : attention_paths(dt, /*cudnn=*/false)) {
      ASSERT_EQ(setenv("KILN_ATTENTION_UNFUSED", path.unfused, 1), 0);
      ASSERT_EQ(setenv("KILN_ATTENTION_CUDNN", path.cudnn, 1), 0);
      const std::string what = std::string(causal ? "causal " : "") + path.name;
      MultiHeadSelfAttention attn(e, 2, 0.2, QkvLayout::FusedQKV, causal);
      for (Parameter* p : attn.parameters()) ops::fill_uniform(p->value, -0.5, 0.5, ++seed);
      attn.to(kGpu, dt);
      Context ctx = training_context(seed);
      ctx.run.device = kGpu;
      ctx.run.precision.activation = dt;
      ctx.run.precision.matmul = dt;
      ctx.call.attention_mask = padding_mask(b, t).to(kGpu);
      // y, dx and every parameter gradient, on the host.
      auto step_once = [&](Context& c) {
        for (Parameter* p : attn.parameters()) p->grad.zero();
        std::vector<std::vector<double>> all;
        all.push_back(attn.forward(c, x).to(Device::cpu(), DType::F64).to_vector<double>());
        all.push_back(attn.backward(c, dy).to(Device::cpu(), DType::F64).to_vector<double>());
        for (Parameter* p : attn.parameters())
          all.push_back(p->grad.to(Device::cpu(), DType::F64).to_vector<double>());
        return all;
      };
      HostWrittenScalars written(kGpu, 7);
      ctx.step = written.scalars();
      auto want7 = step_once(ctx);
      written.set_step(8);
      auto want8 = step_once(ctx);
      ASSERT_NE(want7, want8) << what << ": the step does not act";
      Tensor step = Tensor::from_vector<std::int64_t>({7}, {1}).to(kGpu);
      ctx.step.step = reinterpret_cast<const std::uint64_t*>(step.data());
      EXPECT_EQ(step_once(ctx), want7) << what;
      ops::increment(step);
      EXPECT_EQ(step_once(ctx), want8) << what;
    }
  }
  ASSERT_EQ(unsetenv("KILN_ATTENTION_UNFUSED"), 0);
  ASSERT_EQ(unsetenv("KILN_ATTENTION_CUDNN"), 0);
}

TEST_P(TransformerGpu, KvCacheDecodeMatchesFullCausalForward) {
  // GPT-2's attention decoding on the GPU (a prompt of 3 tokens, then one at a time, through the
  // KV cache) against the CPU's full causal forward over every token; the GPU's own full forward
  // (fused in half) against the same reference. The cache entries start NaN-poisoned: positions
  // past the tokens written so far must never be read.
  DType dt = GetParam();
  std::uint64_t seed = fresh_seed();
  const std::int64_t b = 2, t = 77, e = 128, prompt = 3;
  MultiHeadSelfAttention attn(e, 2, 0.1, QkvLayout::FusedConv1D, /*causal=*/true);
  for (Parameter* p : attn.parameters()) {
    ops::fill_uniform(p->value, -0.5, 0.5, ++seed);
    p->value.copy_from(p->value.to(dt));
  }
  Tensor x = random_cpu({b, t, e}, dt, ++seed);
  Context cpu;
  cpu.training = false;
  attn.to(Device::cpu(), DType::F32);
  Tensor want = attn.forward(cpu, x);

  attn.to(kGpu, dt);
  Context c;
  c.training = false;
  c.run.device = kGpu;
  c.run.precision.activation = c.run.precision.matmul = dt;
  poison_allocator();
  Tensor full = attn.forward(c, x.to(kGpu, dt));
  expect_close(full, want, dt, "full causal forward", dt == DType::F32 ? 200 : 24);

  KvCache cache;
  cache.capacity = t + 5;
  c.call.kv_cache = &cache;
  poison_allocator();
  Tensor decoded = Tensor::empty({b, t, e}, DType::F32);
  for (std::int64_t from = 0; from < t;) {
    const std::int64_t to = from == 0 ? prompt : from + 1;
    Tensor y = attn.forward(c, x.slice(1, from, to).contiguous().to(kGpu, dt));
    ASSERT_EQ(y.dtype(), dt);
    decoded.slice(1, from, to).copy_from(y.to(Device::cpu(), DType::F32));
    cache.past = to;
    from = to;
  }
  ASSERT_EQ(cache.entries.size(), 1u);
  EXPECT_EQ(cache.entries.begin()->second.first.dtype(), dt);
  EXPECT_EQ(cache.entries.begin()->second.first.shape(), (Shape{b * 2, t + 5, 64}));
  expect_close(decoded, want, dt, "KV cache decode", dt == DType::F32 ? 200 : 24);
}

TEST_P(TransformerGpu, FlashBackwardInWorkspaceChunksIsBitwiseEqual) {
  // A workspace limit of 0.25 MiB holds 2 of the 6 (batch * head) rows at T = 197 (128 KiB
  // each): three chunks must give the gradients of one, bit for bit. A bad limit is an
  // InputError naming the variable.
  DType dt = GetParam();
  if (dt == DType::F32) GTEST_SKIP() << "f32 takes the unfused path";
  std::uint64_t seed = fresh_seed();
  const std::int64_t b = 3, t = 197, e = 128;
  MultiHeadSelfAttention attn(e, 2, 0.1, QkvLayout::FusedQKV);
  for (Parameter* p : attn.parameters()) ops::fill_uniform(p->value, -0.5, 0.5, ++seed);
  attn.to(kGpu, dt);
  Context c = training_context(seed);
  c.run.device = kGpu;
  c.run.precision.activation = c.run.precision.matmul = dt;
  c.call.attention_mask = padding_mask(b, t).to(kGpu);
  Tensor x = random_cpu({b, t, e}, dt, seed + 1).to(kGpu, dt);
  Tensor dy = random_cpu({b, t, e}, dt, seed + 2).to(kGpu, dt);
  auto gradients = [&]() {
    for (Parameter* p : attn.parameters()) p->grad.zero();
    attn.forward(c, x);
    std::vector<std::vector<double>> g{attn.backward(c, dy).to_vector<double>()};
    for (Parameter* p : attn.parameters()) g.push_back(p->grad.to_vector<double>());
    return g;
  };
  ASSERT_EQ(unsetenv("KILN_ATTENTION_WORKSPACE_MB"), 0);
  auto whole = gradients();
  ASSERT_EQ(setenv("KILN_ATTENTION_WORKSPACE_MB", "0.25", 1), 0);
  auto chunked = gradients();
  EXPECT_TRUE(whole == chunked) << "the chunked backward differs";
  ASSERT_EQ(setenv("KILN_ATTENTION_WORKSPACE_MB", "lots", 1), 0);
  attn.forward(c, x);
  try {
    attn.backward(c, dy);
    ADD_FAILURE() << "a bad KILN_ATTENTION_WORKSPACE_MB was accepted";
  } catch (const InputError& err) {
    EXPECT_NE(std::string(err.what()).find("KILN_ATTENTION_WORKSPACE_MB"), std::string::npos);
  }
  ASSERT_EQ(unsetenv("KILN_ATTENTION_WORKSPACE_MB"), 0);
}

TEST_P(TransformerGpu, TransformerBlocksMatchCpu) {
  DType dt = GetParam();
  std::uint64_t seed = fresh_seed();
  double factor = dt == DType::F32 ? 400 : 32;
  {
    TransformerBlock block(TransformerBlockConfig::bert(64, 4, 128, 0.1));
    block.set_name("layer");
    Context ctx = training_context(seed);
    ctx.call.attention_mask = padding_mask(2, 19);
    compare_layer(block, random_cpu({2, 19, 64}, dt, seed), {2, 19, 64}, dt, ctx, factor, seed + 1,
                  "post-LN block");
  }
  {
    TransformerBlock block(TransformerBlockConfig::vit(64, 4, 128, 0.1));
    block.set_name("encoder_layer");
    compare_layer(block, random_cpu({2, 17, 64}, dt, seed + 2), {2, 17, 64}, dt,
                  training_context(seed), factor, seed + 3, "pre-LN block");
  }
  // GPT-2's: causal, GELU tanh, the MLP activation recomputed in backward (half) or kept
  // (train.recompute KEEP_ALL), its derivative in the epilogue of c_proj's input-gradient GEMM
  // and, forced, in its own pass (the path for GPUs where cuBLASLt has no DGELU epilogue for the
  // types); without dropout after the MLP, the residual added in c_proj's epilogue.
  for (const char* unfused : {"0", "1"}) {
    for (bool recompute : {true, false}) {
      for (double dropout : {0.1, 0.0}) {
        ASSERT_EQ(setenv("KILN_DGELU_UNFUSED", unfused, 1), 0);
        TransformerBlockConfig config = TransformerBlockConfig::gpt2(128, 2, 256, dropout);
        config.recompute_mlp_activation = recompute;
        TransformerBlock block(config);
        block.set_name("transformer.h.0");
        compare_layer(block, random_cpu({2, 70, 128}, dt, seed + 4), {2, 70, 128}, dt,
                      training_context(seed), factor, seed + 5,
                      std::string("GPT-2 block, KILN_DGELU_UNFUSED=") + unfused +
                          (recompute ? " GELU recomputed" : " GELU kept") + " dropout " +
                          std::to_string(dropout));
      }
    }
  }
  ASSERT_EQ(unsetenv("KILN_DGELU_UNFUSED"), 0);
}

TEST_P(TransformerGpu, TinyModelsMatchCpu) {
  DType dt = GetParam();
  std::uint64_t seed = fresh_seed();
  double factor = dt == DType::F32 ? 1000 : 64;
  {
    // GPT-2: the tied LM head's logits in padded rows (vocabulary 101), causal attention.
    ModelOptions o;
    o.name = "gpt2";
    o.vocab_size = 101;
    o.hidden_size = 128;
    o.num_layers = 2;
    o.num_heads = 2;
    o.intermediate_size = 256;
    o.seq_len = 40;
    o.max_positions = 64;
    Model m = make_model(o);
    std::vector<std::int64_t> id(2 * 40);
    for (std::size_t i = 0; i < id.size(); ++i)
      id[i] = static_cast<std::int64_t>((seed + 7 * i) % 101);
    compare_layer(*m.net, Tensor::from_vector(id, {2, 40}), {2, 40, 101}, dt,
                  training_context(seed), factor, seed + 1, "tiny gpt2");
  }
  {
    ModelOptions o;
    o.name = "bert_base";
    o.vocab_size = 101;
    o.hidden_size = 32;
    o.num_layers = 2;
    o.num_heads = 2;
    o.intermediate_size = 64;
    o.seq_len = 11;
    Model m = make_model(o);
    std::vector<std::int64_t> id(3 * 11);
    for (std::size_t i = 0; i < id.size(); ++i)
      id[i] = 1 + static_cast<std::int64_t>((seed + 7 * i) % 100);
    Context ctx = training_context(seed);
    ctx.call.attention_mask = padding_mask(3, 11);
    compare_layer(*m.net, Tensor::from_vector(id, {3, 11}), {3, 11, 101}, dt, ctx, factor, seed + 1,
                  "tiny bert");
  }
  {
    ModelOptions o;
    o.name = "vit_b16";
    o.image_size = 48;
    o.image_channels = 3;
    o.num_classes = 10;
    o.hidden_size = 32;
    o.num_layers = 2;
    o.num_heads = 4;
    o.intermediate_size = 64;
    Model m = make_model(o);
    compare_layer(*m.net, random_cpu({2, 3, 48, 48}, dt, seed + 2), {2, 10}, dt,
                  training_context(seed), factor, seed + 3, "tiny vit");
  }
}

// Grouped-query attention with q/k/v bias (Qwen2) and rotary positions.
GroupedQueryAttentionConfig gqa_config(std::int64_t hidden, std::int64_t heads,
                                       std::int64_t kv_heads, std::int64_t max_positions,
                                       double theta) {
  GroupedQueryAttentionConfig c;
  c.hidden = hidden;
  c.heads = heads;
  c.kv_heads = kv_heads;
  c.qkv_bias = true;
  c.max_positions = max_positions;
  c.rotary.theta = theta;
  return c;
}

// The llama family's layers (issue 35): RMSNorm (Qwen2.5-0.5B's 896 columns and a small one, with
// the packed kernels in half), the SwiGLU MLP, grouped-query attention with rotary positions on
// cuDNN's fused path and on the unfused one, and tiny Llama / Qwen2 models.
TEST_P(TransformerGpu, LlamaLayersMatchCpu) {
  DType dt = GetParam();
  std::uint64_t seed = fresh_seed();
  for (std::int64_t cols : {64, 896}) {
    RMSNorm norm(cols, 1e-6);
    compare_layer(norm, random_cpu({3, 45, cols}, dt, seed, 2.0), {3, 45, cols}, dt, Context(),
                  dt == DType::F32 ? 64 : 16, seed + 1, "rmsnorm " + std::to_string(cols));
  }
  SwiGluMlp mlp(64, 160);
  compare_layer(mlp, random_cpu({2, 33, 64}, dt, seed + 2), {2, 33, 64}, dt, Context(),
                dt == DType::F32 ? 200 : 24, seed + 3, "swiglu mlp");
  for (std::int64_t head_dim : {64, 128}) {
    for (const char* unfused : {"0", "1"}) {
      setenv("KILN_ATTENTION_UNFUSED", unfused, 1);
      GroupedQueryAttentionConfig c = gqa_config(256, 4, 2, 256, 10000.0);
      c.head_dim = head_dim;
      GroupedQueryAttention attn(c);
      seed += 5;
      compare_layer(attn, random_cpu({2, 97, 256}, dt, seed), {2, 97, 256}, dt,
                    training_context(seed), dt == DType::F32 ? 200 : 24, seed + 1,
                    "gqa d=" + std::to_string(head_dim) + " unfused=" + unfused);
    }
  }
  unsetenv("KILN_ATTENTION_UNFUSED");
}

TEST_P(TransformerGpu, CudnnBackwardInBatchChunksIsBitwiseEqual) {
  // A workspace limit below one batch's dP makes cuDNN's backward run over halvings of the batch:
  // the sequences are independent, so the gradients equal the whole batch's bit for bit.
  DType dt = GetParam();
  if (dt == DType::F32) GTEST_SKIP() << "f32 takes the unfused path";
  std::uint64_t seed = fresh_seed();
  GroupedQueryAttentionConfig c;
  c.hidden = 256;
  c.heads = 4;
  c.kv_heads = 2;
  c.max_positions = 512;
  auto grads = [&](const char* limit_mb) {
    setenv("KILN_ATTENTION_WORKSPACE_MB", limit_mb, 1);
    GroupedQueryAttention attn(c);
    attn.to(kGpu, dt);
    Context ctx = training_context(seed);
    ctx.run.precision.activation = dt;
    ctx.run.precision.matmul = dt;
    Tensor x = random_cpu({8, 512, 256}, dt, seed).to(kGpu, dt);
    attn.forward(ctx, x);
    std::vector<std::vector<float>> out;
    out.push_back(attn.backward(ctx, random_cpu({8, 512, 256}, dt, seed + 1).to(kGpu, dt))
                      .to(Device::cpu(), DType::F32)
                      .to_vector<float>());
    for (Parameter* p : attn.parameters())
      out.push_back(p->grad.to(Device::cpu(), DType::F32).to_vector<float>());
    return out;
  };
  const auto whole = grads("1024");  // 8 x 4 x 512 x 512 x 2 bytes: 16 MiB
  const auto chunked = grads("9");   // chunks of a few sequences
  unsetenv("KILN_ATTENTION_WORKSPACE_MB");
  ASSERT_EQ(whole.size(), chunked.size());
  for (std::size_t i = 0; i < whole.size(); ++i) EXPECT_EQ(whole[i], chunked[i]) << "tensor " << i;
}

TEST_P(TransformerGpu, TinyLlamaModelsMatchCpu) {
  DType dt = GetParam();
  std::uint64_t seed = fresh_seed();
  for (bool qwen : {false, true}) {
    ModelOptions o;
    o.name = qwen ? "qwen2" : "llama";
    o.vocab_size = 101;
    o.hidden_size = 256;
    o.num_layers = 2;
    o.num_heads = 4;
    o.intermediate_size = 384;
    o.seq_len = 40;
    o.max_positions = 64;
    o.llama.num_kv_heads = 2;
    o.llama.tie_embeddings = qwen;
    o.llama.qkv_bias = qwen;
    o.llama.rope_theta = qwen ? 1e6 : 5e5;
    if (!qwen) o.llama.rope_llama3_factor = 32;
    Model m = make_model(o);
    std::vector<std::int64_t> id(2 * 40);
    for (std::size_t i = 0; i < id.size(); ++i)
      id[i] = static_cast<std::int64_t>((seed + 7 * i) % 101);
    compare_layer(*m.net, Tensor::from_vector(id, {2, 40}), {2, 40, 101}, dt,
                  training_context(seed), dt == DType::F32 ? 1000 : 64, seed + 1,
                  qwen ? "tiny qwen2" : "tiny llama");
  }
}

TEST_P(TransformerGpu, GroupedQueryAttentionOnFlashKernelsMatchesCpu) {
  // With cuDNN off, grouped-query attention at d = 64 in half takes Kiln's flash kernels on the
  // packed rows (f32 the unfused path): groups of 1, 2 and 7 query heads per key/value head
  // (Qwen2.5-0.5B's 14 / 2), T whole tiles and T with a partial last one, forward and backward.
  DType dt = GetParam();
  std::uint64_t seed = fresh_seed();
  ASSERT_EQ(setenv("KILN_ATTENTION_CUDNN", "0", 1), 0);
  ASSERT_EQ(unsetenv("KILN_ATTENTION_UNFUSED"), 0);
  for (std::int64_t kv_heads : {14, 7, 2}) {
    for (std::int64_t t : {256, 97}) {
      GroupedQueryAttention attn(gqa_config(896, 14, kv_heads, 256, 1e6));
      seed += 5;
      // x in +-0.5: at E = 896 the scores stay as spread as the 256-wide layers' above.
      compare_layer(attn, random_cpu({2, t, 896}, dt, seed, 0.5), {2, t, 896}, dt,
                    training_context(seed), dt == DType::F32 ? 200 : 32, seed + 1,
                    "gqa flash H=14 H_kv=" + std::to_string(kv_heads) + " T=" + std::to_string(t));
    }
  }
  ASSERT_EQ(unsetenv("KILN_ATTENTION_CUDNN"), 0);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, TransformerGpu,
                         ::testing::Values(DType::F32, DType::F16, DType::BF16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(dtype_name(info.param));
                         });

// ---------------------------------------------------------------------------------------------
// The flash kernels with grouped-query heads, called directly on packed rows.

constexpr std::int64_t kFlashDim = 64;

struct FlashResult {
  Tensor out, lse, dqkv;  // on the CPU; out and dqkv in f32
};

// Kiln's flash kernels forward and backward on packed rows qkv (B*T, (H + 2 H_kv) 64) on the GPU,
// their outputs poisoned first; dropout (p > 0) at key 1234, step 7.
FlashResult flash_run(const Tensor& qkv, const Tensor& dout, std::int64_t b, std::int64_t h,
                      std::int64_t hkv, const Tensor& mask, bool causal, double p) {
  const DType dt = qkv.dtype();
  const std::int64_t n = qkv.size(0);
  Tensor out = poisoned({n, h * kFlashDim}, dt), lse = poisoned({b * h, n / b}, DType::F32);
  Tensor dqkv = poisoned(qkv.shape(), dt);
  cuda::flash_attention_forward(qkv, b, h, hkv, mask, Tensor(), causal, p, 1234, 7, nullptr, out,
                                lse);
  cuda::flash_attention_backward(qkv, out, dout, lse, mask, Tensor(), b, h, hkv, causal, p, 1234, 7,
                                 nullptr, dqkv);
  return {out.to(Device::cpu(), DType::F32), lse.to(Device::cpu()),
          dqkv.to(Device::cpu(), DType::F32)};
}

// Columns [lo, hi) of (N, C) rows, contiguous.
Tensor columns(const Tensor& rows, std::int64_t lo, std::int64_t hi) {
  return rows.slice(1, lo, hi).contiguous();
}

TEST(FlashGroupedQueryAttention, MatchesTheKernelsOnReplicatedHeads) {
  // Grouped-query rows against the same rows with K and V copied per query head (multi-head, the
  // path GPT-2 and BERT take): out, lse and dQ bit for bit (the same arithmetic on the same
  // values), dK and dV the replicated heads' gradients summed over each group. Causal, a padding
  // mask, dropout; T with a partial last tile.
  if (cuda_device_count() == 0) GTEST_FAIL() << "no GPU visible: the gpu suite needs one";
  std::uint64_t seed = fresh_seed();
  const std::int64_t b = 3, t = 197, n = b * t, d = kFlashDim;
  struct Heads {
    std::int64_t h, hkv;
  };
  struct Variant {
    bool causal, masked;
    double p;
  };
  for (DType dt : {DType::F16, DType::BF16}) {
    for (Heads z : {Heads{14, 7}, Heads{14, 2}, Heads{4, 1}}) {
      for (Variant v :
           {Variant{true, false, 0.0}, Variant{false, true, 0.1}, Variant{true, true, 0.1}}) {
        const std::int64_t g = z.h / z.hkv, width = (z.h + 2 * z.hkv) * d, wide = 3 * z.h * d;
        const std::string what = std::string(dtype_name(dt)) + " H=" + std::to_string(z.h) +
                                 " H_kv=" + std::to_string(z.hkv) + (v.causal ? " causal" : "") +
                                 (v.masked ? " masked" : "") + " p=" + std::to_string(v.p);
        std::vector<float> packed = random_cpu({n, width}, dt, ++seed, 2.0).to_vector<float>();
        // Query head i's copy of key/value head i / g.
        std::vector<float> replicated(static_cast<std::size_t>(n * wide));
        for (std::int64_t r = 0; r < n; ++r)
          for (std::int64_t i = 0; i < z.h; ++i)
            for (std::int64_t x = 0; x < d; ++x) {
              const std::size_t to = static_cast<std::size_t>(r * wide + i * d + x);
              const std::size_t from = static_cast<std::size_t>(r * width);
              replicated[to] = packed[from + static_cast<std::size_t>(i * d + x)];
              for (std::int64_t part = 1; part <= 2; ++part)
                replicated[to + static_cast<std::size_t>(part * z.h * d)] =
                    packed[from + static_cast<std::size_t>(z.h * d + (part - 1) * z.hkv * d +
                                                           i / g * d + x)];
            }
        Tensor dout = random_cpu({n, z.h * d}, dt, ++seed).to(kGpu, dt);
        Tensor mask = v.masked ? padding_mask(b, t).to(kGpu) : Tensor();
        FlashResult gqa = flash_run(Tensor::from_vector(packed, {n, width}).to(kGpu, dt), dout, b,
                                    z.h, z.hkv, mask, v.causal, v.p);
        FlashResult mha = flash_run(Tensor::from_vector(replicated, {n, wide}).to(kGpu, dt), dout,
                                    b, z.h, z.h, mask, v.causal, v.p);
        EXPECT_EQ(gqa.out.to_vector<float>(), mha.out.to_vector<float>()) << what << " out";
        EXPECT_EQ(gqa.lse.to_vector<float>(), mha.lse.to_vector<float>()) << what << " lse";
        EXPECT_EQ(columns(gqa.dqkv, 0, z.h * d).to_vector<float>(),
                  columns(mha.dqkv, 0, z.h * d).to_vector<float>())
            << what << " dq";
        expect_close(columns(gqa.dqkv, 0, z.h * d), columns(mha.dqkv, 0, z.h * d), dt, what + " dq",
                     1);  // refuses an all-zero dQ
        std::vector<float> rep = mha.dqkv.to_vector<float>();
        for (std::int64_t part = 1; part <= 2; ++part) {
          // The replicated heads' rounded gradients, summed over each group in double.
          std::vector<double> sum(static_cast<std::size_t>(n * z.hkv * d), 0.0);
          for (std::int64_t r = 0; r < n; ++r)
            for (std::int64_t i = 0; i < z.h; ++i)
              for (std::int64_t x = 0; x < d; ++x)
                sum[static_cast<std::size_t>((r * z.hkv + i / g) * d + x)] +=
                    rep[static_cast<std::size_t>(r * wide + part * z.h * d + i * d + x)];
          const std::int64_t lo = z.h * d + (part - 1) * z.hkv * d;
          expect_close(columns(gqa.dqkv, lo, lo + z.hkv * d),
                       Tensor::from_vector(sum, {n, z.hkv * d}), dt,
                       what + (part == 1 ? " dk" : " dv"), 8);
        }
      }
    }
  }
}

TEST(FlashGroupedQueryAttention, BackwardInWorkspaceChunksIsBitwiseEqual) {
  // 14 query heads over 2 key/value heads at T = 197: a group's dS^T is 7 x 128 KiB. A limit of
  // 2 MiB holds 2 of the 6 groups (three chunks), 0.5 MiB less than one (one group a chunk):
  // both must give the gradients of one chunk bit for bit.
  if (cuda_device_count() == 0) GTEST_FAIL() << "no GPU visible: the gpu suite needs one";
  std::uint64_t seed = fresh_seed();
  const std::int64_t b = 3, t = 197, n = b * t, h = 14, hkv = 2;
  for (DType dt : {DType::F16, DType::BF16}) {
    Tensor qkv = random_cpu({n, (h + 2 * hkv) * kFlashDim}, dt, ++seed, 2.0).to(kGpu, dt);
    Tensor dout = random_cpu({n, h * kFlashDim}, dt, ++seed).to(kGpu, dt);
    Tensor mask = padding_mask(b, t).to(kGpu);
    std::vector<std::vector<float>> dqkv;
    for (const char* limit : {"", "2", "0.5"}) {
      if (*limit == '\0') {
        ASSERT_EQ(unsetenv("KILN_ATTENTION_WORKSPACE_MB"), 0);
      } else {
        ASSERT_EQ(setenv("KILN_ATTENTION_WORKSPACE_MB", limit, 1), 0);
      }
      dqkv.push_back(flash_run(qkv, dout, b, h, hkv, mask, true, 0.1).dqkv.to_vector<float>());
    }
    ASSERT_EQ(unsetenv("KILN_ATTENTION_WORKSPACE_MB"), 0);
    EXPECT_TRUE(dqkv[0] == dqkv[1]) << dtype_name(dt) << ": three chunks differ from one";
    EXPECT_TRUE(dqkv[0] == dqkv[2]) << dtype_name(dt) << ": chunks of one group differ from one";
  }
}

TEST(FlashGroupedQueryAttention, MatchesCudnn) {
  // The same packed GQA rows through cuDNN's fused attention and through the flash kernels,
  // causal and not: out, dQ, dK and dV agree within the half tolerance, so either path may serve
  // a run (the flash kernels take over where cuDNN declines or KILN_ATTENTION_CUDNN=0).
  if (cuda_device_count() == 0) GTEST_FAIL() << "no GPU visible: the gpu suite needs one";
  ASSERT_EQ(unsetenv("KILN_ATTENTION_CUDNN"), 0);
  std::uint64_t seed = fresh_seed();
  const std::int64_t b = 2, h = 14, d = kFlashDim;
  for (DType dt : {DType::F16, DType::BF16}) {
    for (std::int64_t hkv : {14, 7, 2}) {
      for (std::int64_t t : {256, 197}) {
        for (bool causal : {true, false}) {
          const std::int64_t n = b * t, width = (h + 2 * hkv) * d;
          const std::string what = std::string(dtype_name(dt)) + " H_kv=" + std::to_string(hkv) +
                                   " T=" + std::to_string(t) + (causal ? " causal" : "");
          Tensor qkv = random_cpu({n, width}, dt, ++seed, 2.0).to(kGpu, dt);
          Tensor dout = random_cpu({n, h * d}, dt, ++seed).to(kGpu, dt);
          Tensor out = poisoned({n, h * d}, dt), lse = poisoned({b * h, t}, DType::F32);
          Tensor dqkv = poisoned({n, width}, dt);
          ASSERT_TRUE(cuda::cudnn_attention_forward(qkv, b, h, hkv, causal, out, lse))
              << what << ": cuDNN declined (its stderr line says why)";
          cuda::cudnn_attention_backward(qkv, out, dout, lse, b, h, hkv, causal, dqkv);
          ASSERT_TRUE(cuda::flash_attention_supported(dt, b, h, hkv, d, t)) << what;
          FlashResult flash = flash_run(qkv, dout, b, h, hkv, Tensor(), causal, 0.0);
          expect_close(flash.out, out.to(Device::cpu(), DType::F32), dt, what + " out", 24);
          Tensor want = dqkv.to(Device::cpu(), DType::F32);
          const std::int64_t bounds[4] = {0, h * d, (h + hkv) * d, width};
          const char* names[3] = {" dq", " dk", " dv"};
          for (int i = 0; i < 3; ++i)
            expect_close(columns(flash.dqkv, bounds[i], bounds[i + 1]),
                         columns(want, bounds[i], bounds[i + 1]), dt, what + names[i], 24);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Determinism.

TEST(TransformerGpuDeterminism, EmbeddingBackwardIsBitwiseReproducible) {
  if (cuda_device_count() == 0) GTEST_FAIL() << "no GPU visible: the gpu suite needs one";
  std::uint64_t seed = fresh_seed();
  const std::int64_t num = 7, dim = 768, n = 8 * 512;  // every id repeated hundreds of times
  std::vector<std::int64_t> id(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    id[static_cast<std::size_t>(i)] = static_cast<std::int64_t>((seed + i * 31) % num);
  Tensor ids = Tensor::from_vector(id, {n}).to(kGpu);
  Tensor dy = random_cpu({n, dim}, DType::F32, seed + 1).to(kGpu);
  std::vector<std::vector<float>> results;
  for (int run = 0; run < 2; ++run) {
    Tensor grad = Tensor::zeros({num, dim}, DType::F32, kGpu);
    cuda::embedding_backward(ids, dy, Embedding::kNoPadding, grad);
    results.push_back(grad.to_vector<float>());
  }
  ASSERT_EQ(results[0].size(), results[1].size());
  EXPECT_EQ(0,
            std::memcmp(results[0].data(), results[1].data(), results[0].size() * sizeof(float)));
  // And it is the sum, in position order, of the rows of each id.
  auto d = dy.to_vector<float>();
  std::vector<double> want(static_cast<std::size_t>(num * dim), 0.0);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t c = 0; c < dim; ++c)
      want[static_cast<std::size_t>(id[static_cast<std::size_t>(i)] * dim + c)] +=
          d[static_cast<std::size_t>(i * dim + c)];
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(results[0][i], want[i], 1e-3) << i;
}

// ---------------------------------------------------------------------------------------------
// Full size: BERT-base and ViT-B/16 run a bf16 step with finite results (and print their speed).

// With KILN_PROFILE_LAYERS set, prints the time per layer kind (inclusive, synchronised at each
// layer boundary, so the total is slower than the unprofiled step).
void profile_layers(Layer& net, Context ctx, const Tensor& x, const Tensor& dy) {
  if (!std::getenv("KILN_PROFILE_LAYERS")) return;
  std::map<std::string, double> total;
  std::vector<std::chrono::steady_clock::time_point> starts;
  ctx.observers.push_back([&](Layer& layer, bool forward, bool begin) {
    const std::string& name = layer.name();
    device_synchronize(kGpu);
    if (begin) {
      starts.push_back(std::chrono::steady_clock::now());
      return;
    }
    double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - starts.back()).count();
    starts.pop_back();
    std::string kind;  // the name without layer indices
    for (char c : name) kind += std::isdigit(static_cast<unsigned char>(c)) ? '#' : c;
    total[kind + (forward ? " fwd" : " bwd")] += s;
  });
  net.forward(ctx, x);
  net.backward(ctx, dy);
  for (const auto& [kind, s] : total) std::printf("  %-70s %8.3f ms\n", kind.c_str(), s * 1e3);
}

double timed_steps(Layer& net, Context& ctx, const Tensor& x, const Tensor& dy, int steps) {
  net.forward(ctx, x);
  net.backward(ctx, dy);
  device_synchronize(kGpu);
  profile_layers(net, ctx, x, dy);
  auto start = std::chrono::steady_clock::now();
  HostWrittenScalars step(kGpu);
  ctx.step = step.scalars();
  for (int i = 0; i < steps; ++i) {
    step.set_step(static_cast<std::uint64_t>(i));
    net.forward(ctx, x);
    net.backward(ctx, dy);
  }
  device_synchronize(kGpu);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / steps;
}

void expect_finite(const Tensor& t, const std::string& what) {
  auto v = t.to_vector<float>();
  std::size_t bad = 0;
  double sum = 0;
  for (float f : v) {
    if (!std::isfinite(f)) ++bad;
    sum += std::fabs(f);
  }
  EXPECT_EQ(bad, 0u) << what;
  EXPECT_GT(sum, 0.0) << what;
}

TEST(TransformerGpuFullSize, BertBaseAndVitB16StepInBf16) {
  if (cuda_device_count() == 0) GTEST_FAIL() << "no GPU visible: the gpu suite needs one";
  std::uint64_t seed = fresh_seed();
  Context ctx = training_context(seed);
  ctx.run.device = kGpu;
  ctx.run.precision.activation = DType::BF16;
  ctx.run.precision.matmul = DType::BF16;
  {
    ModelOptions o;
    o.name = "bert_base";
    Model m = make_model(o);
    m.net->to(kGpu, DType::BF16);
    const std::int64_t b = 32, t = 128;
    std::vector<std::int64_t> id(static_cast<std::size_t>(b * t));
    for (std::size_t i = 0; i < id.size(); ++i)
      id[i] = static_cast<std::int64_t>((seed + i * 7919) % 30522);
    Tensor ids = Tensor::from_vector(id, {b, t}).to(kGpu);
    Tensor y = m.net->forward(ctx, ids);
    EXPECT_EQ(y.shape(), (Shape{b, t, 30522}));
    expect_finite(y, "bert logits");
    Tensor dy = random_cpu({b, t, 30522}, DType::BF16, seed, 1e-3).to(kGpu, DType::BF16);
    double s = timed_steps(*m.net, ctx, ids, dy, 3);
    double flops = 3 * m.net->forward_flops({b, t});
    std::printf("bert_base bf16 B=%lld T=%lld: %.2f ms/step, %.1f TFLOP/s\n",
                static_cast<long long>(b), static_cast<long long>(t), s * 1e3, flops / s / 1e12);
    for (Parameter* p : m.net->parameters()) {
      if (p->name == "bert.embeddings.word_embeddings.weight" ||
          p->name == "bert.encoder.layer.0.attention.self.query.weight")
        expect_finite(p->grad, p->name);
    }
  }
  {
    ModelOptions o;
    o.name = "vit_b16";
    o.image_size = 224;
    o.image_channels = 3;
    o.num_classes = 1000;
    Model m = make_model(o);
    for (Parameter* p : m.net->parameters())  // torchvision's zero head would stop the gradient
      if (p->name == "heads.head.weight") ops::fill_normal(p->value, 0.0, 0.02, seed);
    m.net->to(kGpu, DType::BF16);
    const std::int64_t b = 32;
    Tensor images = random_cpu({b, 3, 224, 224}, DType::BF16, seed + 1).to(kGpu, DType::F32);
    Tensor y = m.net->forward(ctx, images);
    EXPECT_EQ(y.shape(), (Shape{b, 1000}));
    Tensor dy = random_cpu({b, 1000}, DType::BF16, seed + 2).to(kGpu, DType::BF16);
    double s = timed_steps(*m.net, ctx, images, dy, 3);
    double flops = 3 * m.net->forward_flops({b, 3, 224, 224});
    std::printf("vit_b16 bf16 B=%lld: %.2f ms/step, %.1f TFLOP/s\n", static_cast<long long>(b),
                s * 1e3, flops / s / 1e12);
    for (Parameter* p : m.net->parameters()) {
      if (p->name == "conv_proj.weight" || p->name == "encoder.pos_embedding")
        expect_finite(p->grad, p->name);
    }
  }
}

}  // namespace
}  // namespace kiln
