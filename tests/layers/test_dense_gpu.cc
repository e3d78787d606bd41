// Dense layers on CUDA against the CPU backend: fresh random inputs each run (the seed is in
// every failure message), the caching allocator pre-filled with NaN so an output element the
// GPU forgets to write shows up, outputs required finite and not all zero, and one tolerance
// rule: |gpu - cpu| <= factor * eps(dtype) * (max|cpu| + |cpu|). A failing comparison writes
// both tensors to dense_gpu_<case>.txt in the working directory.

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <memory>

#include "core/ops.h"
#include "core/stream.h"
#include "layers/activations.h"
#include "layers/dropout.h"
#include "layers/linear.h"
#include "layers/models/model.h"
#include "layers/reshape.h"
#include "layers/softmax_cross_entropy.h"
#include "tests/gpu_test_util.h"

namespace kiln {
namespace {

using kiln::testing::eps_of;
using kiln::testing::fresh_seed;
using kiln::testing::kGpu;
using kiln::testing::poison_gpu_cache;
using kiln::testing::Precision;
using kiln::testing::worst;

Tensor random_cpu(const Shape& shape, std::uint64_t seed, double low = -1.0, double high = 1.0) {
  Tensor t = Tensor::empty(shape, DType::F32);
  ops::fill_uniform(t, low, high, seed);
  return t;
}

void expect_close(const Tensor& gpu, const Tensor& cpu, DType dtype, const std::string& what,
                  double factor = 32.0) {
  kiln::testing::expect_close(gpu, cpu, dtype, what, factor, "dense_gpu_");
}

class DenseGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_FAIL() << "no GPU visible: the gpu suite needs one";
    poison_gpu_cache();
  }
};

const Precision kPrecisions[] = {
    {"f32", DType::F32, DType::F32, DType::F32},
    {"f16", DType::F16, DType::F16, DType::F16},  // O2/O3-like: half weights
    {"bf16", DType::BF16, DType::BF16, DType::BF16},
    {"o1_f16", DType::F32, DType::F16, DType::F16},  // fp32 weights, half GEMM (cached cast)
    {"o1_bf16_f32_activations", DType::F32, DType::F32, DType::BF16},
};

Context gpu_context(const Precision& p) {
  Context ctx;
  ctx.run.device = kGpu;
  ctx.run.precision.activation = p.activation;
  ctx.run.precision.matmul = p.matmul;
  return ctx;
}

TEST_F(DenseGpu, LinearMatchesCpu) {
  struct Size {
    Shape input;
    std::int64_t out;
  };
  const Size sizes[] = {{{7, 13}, 5}, {{64, 128}, 96}, {{33, 257}, 130}, {{2, 5, 24}, 17}};
  for (const Precision& prec : kPrecisions) {
    for (Activation act :
         {Activation::None, Activation::ReLU, Activation::GELU, Activation::GELUErf}) {
      for (bool bias : {true, false}) {
        for (const Size& size : sizes) {
          std::uint64_t seed = fresh_seed();
          std::int64_t in = size.input.back();
          std::string name = std::string("linear_") + prec.name + "_" + activation_name(act) +
                             (bias ? "_bias_" : "_nobias_") + shape_str(size.input);
          SCOPED_TRACE(name + " seed " + std::to_string(seed));
          Linear gpu_layer(in, size.out, bias, act), cpu_layer(in, size.out, bias, act);
          gpu_layer.reset_parameters(seed);
          gpu_layer.to(kGpu, prec.parameters);
          std::vector<Parameter*> gp = gpu_layer.parameters(), cp = cpu_layer.parameters();
          for (std::size_t i = 0; i < gp.size(); ++i) {
            cp[i]->value.copy_from(gp[i]->value);  // the same (rounded) values on both
            // Gradients start non-zero to check that they accumulate.
            Tensor g0 = random_cpu(gp[i]->grad.shape(), seed + 100 + i);
            gp[i]->grad.copy_from(g0);
            cp[i]->grad.copy_from(gp[i]->grad);
          }
          Context gctx = gpu_context(prec), cctx;
          Tensor x = random_cpu(size.input, seed + 1).to(kGpu, prec.activation);
          Shape out_shape = size.input;
          out_shape.back() = size.out;
          Tensor dy = random_cpu(out_shape, seed + 2);
          Tensor y_gpu = gpu_layer.forward(gctx, x);
          Tensor y_cpu = cpu_layer.forward(cctx, x.to(Device::cpu(), DType::F32));
          if (act == Activation::ReLU) {
            // A pre-activation within rounding of 0 may have either sign on the two sides; such
            // an output's ReLU derivative legitimately differs, so its gradient is left out.
            std::vector<float> yg = y_gpu.to_vector<float>(), yc = y_cpu.to_vector<float>(),
                               g = dy.to_vector<float>();
            std::size_t flips = 0;
            for (std::size_t i = 0; i < g.size(); ++i) {
              if ((yg[i] > 0) != (yc[i] > 0)) {
                g[i] = 0;
                ++flips;
              }
            }
            EXPECT_LE(flips, 1 + g.size() / 100) << name << ": ReLU masks differ too often";
            dy = Tensor::from_vector(g, out_shape);
          }
          dy = dy.to(kGpu, prec.activation);
          Tensor dx_gpu = gpu_layer.backward(gctx, dy);
          Tensor dx_cpu = cpu_layer.backward(cctx, dy.to(Device::cpu(), DType::F32));
          EXPECT_EQ(y_gpu.dtype(), prec.activation);
          EXPECT_EQ(dx_gpu.dtype(), prec.activation);
          DType tol = worst(prec);
          expect_close(y_gpu, y_cpu, tol, name + "_y");
          expect_close(dx_gpu, dx_cpu, tol, name + "_dx");
          for (std::size_t i = 0; i < gp.size(); ++i) {
            EXPECT_EQ(gp[i]->grad.dtype(), prec.parameters);
            expect_close(gp[i]->grad, cp[i]->grad, tol, name + "_" + gp[i]->name + "_grad");
          }
          if (::testing::Test::HasFailure()) return;  // one failing case is enough to read
        }
      }
    }
  }
}

TEST_F(DenseGpu, LinearCachesTheHalfWeightPerWeightsVersion) {
  Linear layer(8, 4);
  layer.reset_parameters(fresh_seed());
  layer.to(kGpu, DType::F32);
  Context ctx = gpu_context(kPrecisions[3]);  // fp32 weights, f16 GEMM
  Tensor x = random_cpu({3, 8}, fresh_seed()).to(kGpu, DType::F16);
  std::vector<float> before = layer.forward(ctx, x).to_vector<float>();
  layer.weight().value.fill(0.0);  // not announced through weights_version: the cache stays
  EXPECT_EQ(layer.forward(ctx, x).to_vector<float>(), before);
  ++ctx.weights_version;  // announced: the cast is redone
  std::vector<float> after = layer.forward(ctx, x).to_vector<float>();
  std::vector<float> bias = layer.bias()->value.to_vector<float>();
  for (std::size_t i = 0; i < after.size(); ++i) EXPECT_NEAR(after[i], bias[i % 4], 1e-3);
}

TEST_F(DenseGpu, GeluMatchesCpu) {
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    for (GeluForm form : {GeluForm::Erf, GeluForm::Tanh}) {
      for (Shape shape : {Shape{1}, Shape{3, 333}, Shape{4097}, Shape{2, 3, 1025}}) {
        std::uint64_t seed = fresh_seed();
        std::string name = std::string("gelu_") + dtype_name(dtype) +
                           (form == GeluForm::Erf ? "_erf_" : "_tanh_") + shape_str(shape);
        SCOPED_TRACE(name + " seed " + std::to_string(seed));
        GELU layer(form);
        Context gctx, cctx;
        gctx.run.device = kGpu;
        gctx.run.precision.activation = gctx.run.precision.matmul = dtype;
        Tensor x = random_cpu(shape, seed, -4, 4).to(kGpu, dtype);
        Tensor dy = random_cpu(shape, seed + 1).to(kGpu, dtype);
        Tensor y_gpu = layer.forward(gctx, x), dx_gpu = layer.backward(gctx, dy);
        Tensor y_cpu = layer.forward(cctx, x.to(Device::cpu(), DType::F32));
        Tensor dx_cpu = layer.backward(cctx, dy.to(Device::cpu(), DType::F32));
        expect_close(y_gpu, y_cpu, dtype, name + "_y", 4);
        expect_close(dx_gpu, dx_cpu, dtype, name + "_dx", 4);
      }
    }
  }
}

TEST_F(DenseGpu, DropoutMatchesCpuMask) {
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    for (Shape shape : {Shape{5}, Shape{7, 129}, Shape{100003}}) {
      std::uint64_t seed = fresh_seed();
      std::string name = std::string("dropout_") + dtype_name(dtype) + "_" + shape_str(shape);
      SCOPED_TRACE(name + " seed " + std::to_string(seed));
      Dropout layer(0.25);  // one layer on both devices: the same layer_id, the same mask
      Context gctx, cctx;
      gctx.run.device = kGpu;
      gctx.run.precision.activation = dtype;
      gctx.run.seed = cctx.run.seed = seed;
      const std::uint64_t step = seed % 1000;
      HostWrittenScalars gpu_step(kGpu, step);
      gctx.step = gpu_step.scalars();
      cctx.step.step = &step;
      Tensor x = random_cpu(shape, seed, 0.5, 1.5).to(kGpu, dtype);
      Tensor dy = random_cpu(shape, seed + 1, 0.5, 1.5).to(kGpu, dtype);
      Tensor y_gpu = layer.forward(gctx, x), dx_gpu = layer.backward(gctx, dy);
      Tensor y_cpu = layer.forward(cctx, x.to(Device::cpu(), DType::F32));
      Tensor dx_cpu = layer.backward(cctx, dy.to(Device::cpu(), DType::F32));
      expect_close(y_gpu, y_cpu, dtype, name + "_y", 2);
      expect_close(dx_gpu, dx_cpu, dtype, name + "_dx", 2);
    }
  }
}

TEST_F(DenseGpu, DropoutStepCounterIsReadWhenTheKernelRuns) {
  // Context::step.step in device memory (CUDA graphs replay it), read by the kernel as it runs.
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    std::uint64_t seed = fresh_seed();
    SCOPED_TRACE(std::string(dtype_name(dtype)) + " seed " + std::to_string(seed));
    Dropout layer(0.25);
    Context ctx;
    ctx.run.device = kGpu;
    ctx.run.precision.activation = dtype;
    ctx.run.seed = seed;
    Tensor x = random_cpu({7, 129}, seed, 0.5, 1.5).to(kGpu, dtype);
    Tensor dy = random_cpu({7, 129}, seed + 1, 0.5, 1.5).to(kGpu, dtype);
    auto host = [](const Tensor& t) { return t.to(Device::cpu(), DType::F32).to_vector<float>(); };
    HostWrittenScalars written(kGpu, 3);
    ctx.step = written.scalars();
    std::vector<float> y3 = host(layer.forward(ctx, x)), dx3 = host(layer.backward(ctx, dy));
    written.set_step(4);
    std::vector<float> y4 = host(layer.forward(ctx, x)), dx4 = host(layer.backward(ctx, dy));
    ASSERT_NE(y3, y4);
    Tensor step = Tensor::from_vector<std::int64_t>({3}, {1}).to(kGpu);
    ctx.step.step = reinterpret_cast<const std::uint64_t*>(step.data());
    EXPECT_EQ(host(layer.forward(ctx, x)), y3);
    EXPECT_EQ(host(layer.backward(ctx, dy)), dx3);
    ops::increment(step);
    EXPECT_EQ(host(layer.forward(ctx, x)), y4);
    EXPECT_EQ(host(layer.backward(ctx, dy)), dx4);
  }
}

TEST_F(DenseGpu, ReshapeOnGpu) {
  Flatten flatten;
  Context ctx;
  ctx.run.device = kGpu;
  Tensor x = random_cpu({3, 2, 5}, fresh_seed()).to(kGpu);
  Tensor y = flatten.forward(ctx, x);
  EXPECT_EQ(y.shape(), (Shape{3, 10}));
  EXPECT_TRUE(y.device().is_cuda());
  EXPECT_EQ(y.to_vector<float>(), x.to_vector<float>());
  EXPECT_EQ(flatten.backward(ctx, y).shape(), (Shape{3, 2, 5}));
}

TEST_F(DenseGpu, SoftmaxCrossEntropyMatchesCpu) {
  struct Case {
    std::int64_t rows, classes;
  };
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    for (Case c : {Case{7, 10}, Case{64, 1000}, Case{5, 30522}, Case{1031, 3}}) {
      for (double smoothing : {0.0, 0.1}) {
        std::uint64_t seed = fresh_seed();
        std::string name = std::string("xent_") + dtype_name(dtype) + "_" + std::to_string(c.rows) +
                           "x" + std::to_string(c.classes) + (smoothing > 0 ? "_smooth" : "");
        SCOPED_TRACE(name + " seed " + std::to_string(seed));
        Tensor logits = random_cpu({c.rows, c.classes}, seed, -4, 4).to(kGpu, dtype);
        std::vector<std::int64_t> t(static_cast<std::size_t>(c.rows));
        for (std::int64_t r = 0; r < c.rows; ++r) {
          t[r] = r % 5 == 2 ? -100 : static_cast<std::int64_t>((seed / 7 + 13 * r) % c.classes);
        }
        Tensor targets = Tensor::from_vector<std::int64_t>(t, {c.rows});
        SoftmaxCrossEntropy gpu_loss(smoothing), cpu_loss(smoothing);
        Context gctx, cctx;
        gctx.run.device = kGpu;
        HostWrittenScalars gpu_scale(kGpu, 0, 1024.0);
        const double cpu_scale = 1024.0;
        gctx.step = gpu_scale.scalars();
        cctx.step.loss_scale = &cpu_scale;
        Tensor lg = gpu_loss.forward(gctx, logits, targets.to(kGpu));
        Tensor dg = gpu_loss.backward(gctx);
        Tensor lc = cpu_loss.forward(cctx, logits.to(Device::cpu(), DType::F32), targets);
        Tensor dc = cpu_loss.backward(cctx);
        EXPECT_TRUE(lg.device().is_cuda());
        EXPECT_EQ(lg.dtype(), DType::F32);
        EXPECT_EQ(dg.dtype(), dtype);
        expect_close(lg, lc, DType::F32, name + "_loss", 64);
        EXPECT_EQ(gpu_loss.counted_rows().item(), cpu_loss.counted_rows().item());
        EXPECT_EQ(gpu_loss.correct_count().item(), cpu_loss.correct_count().item());
        expect_close(dg, dc, dtype, name + "_dlogits", 8);
        EXPECT_NO_THROW(gpu_loss.check_targets());
        // Written over the logits instead: the same gradient bit for bit, in their storage.
        Tensor own = logits.clone();
        gpu_loss.forward(gctx, own, targets.to(kGpu));
        Tensor reused = gpu_loss.backward(gctx, /*reuse_logits=*/true);
        EXPECT_EQ(reused.data(), own.data());
        EXPECT_EQ(reused.to(Device::cpu()).to_vector<float>(),
                  dg.to(Device::cpu()).to_vector<float>());
        // The loss and the gradient in one pass (the fused kernel where the rows are 16-byte
        // aligned: 1000 columns; the two kernels otherwise): the same figures as the CPU's.
        Tensor fused = logits.clone();
        Tensor lf = gpu_loss.forward_with_gradient(gctx, fused, targets.to(kGpu));
        Tensor df = gpu_loss.backward(gctx, /*reuse_logits=*/true);
        EXPECT_EQ(df.data(), fused.data());
        expect_close(lf, lc, DType::F32, name + "_fused_loss", 64);
        EXPECT_EQ(gpu_loss.counted_rows().item(), cpu_loss.counted_rows().item());
        EXPECT_EQ(gpu_loss.correct_count().item(), cpu_loss.correct_count().item());
        expect_close(df, dc, dtype, name + "_fused_dlogits", 8);
      }
    }
  }
}

TEST_F(DenseGpu, SoftmaxCrossEntropyFusedOnPaddedRowsMatchesCpu) {
  // GPT-2's LM head: 50257 logits in rows of 50304 (the padding holds zeros, left untouched), the
  // loss scale in device memory over 3 micro-steps, a row ignored and a tie for the maximum.
  for (DType dtype : {DType::BF16, DType::F16, DType::F32}) {
    std::uint64_t seed = fresh_seed();
    SCOPED_TRACE(std::string(dtype_name(dtype)) + " seed " + std::to_string(seed));
    const std::int64_t rows = 37, classes = 50257, ld = 50304;
    Tensor padded = Tensor::zeros({rows, ld}, dtype, kGpu);
    Tensor logits = padded.slice(1, 0, classes);
    Tensor values = random_cpu({rows, classes}, seed, -6, 6);
    values.data<float>()[classes + 7] = 9.0f;  // row 1: a tie at columns 7 and 9
    values.data<float>()[classes + 9] = 9.0f;
    logits.copy_from(values.to(kGpu, dtype));
    std::vector<std::int64_t> t(static_cast<std::size_t>(rows));
    for (std::int64_t r = 0; r < rows; ++r)
      t[r] = r == 4 ? -100 : static_cast<std::int64_t>((seed / 3 + 1361 * r) % classes);
    t[1] = 7;
    Tensor targets = Tensor::from_vector<std::int64_t>(t, {rows});
    const double loss_scale = 4096.0;
    Tensor source = Tensor::from_vector<double>({loss_scale}, {1}).to(kGpu);
    Context gctx, cctx;
    gctx.run.device = kGpu;
    gctx.step.loss_scale = static_cast<const double*>(source.data());
    gctx.step.loss_scale_divisor = 3;
    cctx.step.loss_scale = &loss_scale;
    cctx.step.loss_scale_divisor = 3;
    SoftmaxCrossEntropy gpu_loss(0.0), cpu_loss(0.0);
    Tensor lc = cpu_loss.forward(cctx, logits.to(Device::cpu(), DType::F32), targets);
    Tensor dc = cpu_loss.backward(cctx);
    Tensor lf = gpu_loss.forward_with_gradient(gctx, logits, targets.to(kGpu));
    Tensor df = gpu_loss.backward(gctx, /*reuse_logits=*/true);
    EXPECT_EQ(df.data(), padded.data());
    expect_close(lf, lc, DType::F32, "padded_fused_loss", 64);
    EXPECT_EQ(gpu_loss.counted_rows().item(), static_cast<double>(rows - 1));
    EXPECT_EQ(gpu_loss.correct_count().item(), cpu_loss.correct_count().item());
    expect_close(df, dc, dtype, "padded_fused_dlogits", 8);
    for (float v : padded.slice(1, classes, ld).to(Device::cpu(), DType::F32).to_vector<float>())
      ASSERT_EQ(v, 0.0f);
  }
}

TEST_F(DenseGpu, SoftmaxCrossEntropyLossScaleOverDivisorIsBitIdenticalToTheQuotient) {
  // Context::step in device memory (CUDA graphs replay it): (*loss_scale / divisor) / counted, as
  // the host's quotient S / M gives it, computed by the kernel as it runs.
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    std::uint64_t seed = fresh_seed();
    SCOPED_TRACE(std::string(dtype_name(dtype)) + " seed " + std::to_string(seed));
    const std::int64_t rows = 45, classes = 1000;
    Tensor logits = random_cpu({rows, classes}, seed, -4, 4).to(kGpu, dtype);
    std::vector<std::int64_t> t(static_cast<std::size_t>(rows));
    for (std::int64_t r = 0; r < rows; ++r)
      t[r] = r % 7 == 3 ? -100 : static_cast<std::int64_t>((seed + 31 * r) % classes);
    Tensor targets = Tensor::from_vector<std::int64_t>(t, {rows}).to(kGpu);
    SoftmaxCrossEntropy loss_fn(0.1);
    auto host = [](const Tensor& g) { return g.to(Device::cpu(), DType::F32).to_vector<float>(); };
    const double loss_scale = 32768.0;
    for (std::int64_t micro_steps : {1, 3, 7}) {
      Context ctx;
      ctx.run.device = kGpu;
      HostWrittenScalars quotient(kGpu, 0, loss_scale / micro_steps);
      ctx.step = quotient.scalars();
      loss_fn.forward(ctx, logits, targets);
      std::vector<float> want = host(loss_fn.backward(ctx));
      Tensor source = Tensor::from_vector<double>({loss_scale}, {1}).to(kGpu);
      ctx.step.loss_scale = static_cast<const double*>(source.data());
      ctx.step.loss_scale_divisor = micro_steps;
      loss_fn.forward(ctx, logits, targets);
      EXPECT_EQ(host(loss_fn.backward(ctx)), want) << micro_steps;
      // The value at the address acts.
      source.fill(loss_scale / 4);
      loss_fn.forward(ctx, logits, targets);
      EXPECT_NE(host(loss_fn.backward(ctx)), want) << micro_steps;
    }
  }
}

TEST_F(DenseGpu, SoftmaxCrossEntropyEdgeCases) {
  Context ctx;
  ctx.run.device = kGpu;
  Tensor logits = random_cpu({4, 6}, fresh_seed()).to(kGpu);
  SoftmaxCrossEntropy loss_fn(0.1);
  // All rows ignored: loss 0, gradient 0, nothing counted.
  Tensor all_ignored = Tensor::full({4}, -100, DType::I64, kGpu);
  EXPECT_EQ(loss_fn.forward(ctx, logits, all_ignored).item(), 0.0);
  EXPECT_EQ(loss_fn.counted_rows().item(), 0.0);
  for (float g : loss_fn.backward(ctx).to_vector<float>()) EXPECT_EQ(g, 0.0f);
  // An out-of-range target: NaN loss, reported by the next check, which then resets.
  Tensor bad = Tensor::from_vector<std::int64_t>({0, 6, 1, -100}, {4}).to(kGpu);
  EXPECT_TRUE(std::isnan(loss_fn.forward(ctx, logits, bad).item()));
  EXPECT_THROW(loss_fn.check_targets(), InputError);
  EXPECT_NO_THROW(loss_fn.check_targets());
}

TEST_F(DenseGpu, MlpForwardBackwardMatchesCpu) {
  ModelOptions options;
  options.image_size = 9;  // odd sizes: 81 inputs
  options.mlp_hidden = {37, 19};
  for (const Precision& prec : {kPrecisions[0], kPrecisions[1], kPrecisions[2]}) {
    std::uint64_t seed = fresh_seed();
    std::string name = std::string("mlp_") + prec.name;
    SCOPED_TRACE(name + " seed " + std::to_string(seed));
    Model gpu_model = make_mlp(options), cpu_model = make_mlp(options);
    gpu_model.net->reset_parameters(seed);
    gpu_model.net->to(kGpu, prec.parameters);
    std::vector<Parameter*> gp = gpu_model.net->parameters(), cp = cpu_model.net->parameters();
    for (std::size_t i = 0; i < gp.size(); ++i) cp[i]->value.copy_from(gp[i]->value);
    Tensor x = random_cpu({13, 1, 9, 9}, seed + 1).to(kGpu, prec.activation);
    std::vector<std::int64_t> labels;
    for (int i = 0; i < 13; ++i) labels.push_back(i % 10);
    Tensor targets = Tensor::from_vector<std::int64_t>(labels, {13});
    Context gctx = gpu_context(prec), cctx;
    SoftmaxCrossEntropy gl, cl;
    Tensor loss_gpu = gl.forward(gctx, gpu_model.net->forward(gctx, x), targets.to(kGpu));
    gpu_model.net->backward(gctx, gl.backward(gctx));
    Tensor loss_cpu =
        cl.forward(cctx, cpu_model.net->forward(cctx, x.to(Device::cpu(), DType::F32)), targets);
    cpu_model.net->backward(cctx, cl.backward(cctx));
    expect_close(loss_gpu, loss_cpu, worst(prec), name + "_loss", 8);
    for (std::size_t i = 0; i < gp.size(); ++i) {
      expect_close(gp[i]->grad, cp[i]->grad, worst(prec), name + "_" + gp[i]->name, 64);
    }
  }
}

}  // namespace
}  // namespace kiln
