// Convolutional layers on CUDA against the CPU backend: fresh random inputs each run (the seed is
// in every failure message), the caching allocator pre-filled with NaN so that an element the GPU
// forgets to write shows up, references required not all zero, and one tolerance rule:
// |gpu - cpu| <= factor * eps(dtype) * (max|cpu| + |cpu|). A failing comparison writes both
// tensors to conv_gpu_<case>.txt in the working directory.

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>

#include "core/ops.h"
#include "core/stream.h"
#include "layers/batchnorm.h"
#include "layers/conv2d.h"
#include "layers/cuda/conv2d_cuda.h"
#include "layers/cuda/conv_bn_fusion_cuda.h"
#include "layers/models/model.h"
#include "layers/pooling.h"
#include "layers/relu.h"
#include "tests/gpu_test_util.h"

namespace kiln {
namespace {

using kiln::testing::eps_of;
using kiln::testing::fresh_seed;
using kiln::testing::kGpu;
using kiln::testing::poison_gpu_cache;
using kiln::testing::Precision;
using kiln::testing::worst;
using Pair = std::pair<std::int64_t, std::int64_t>;

// A CPU tensor of `dtype` holding uniform values (already rounded to dtype, so both sides see
// the same numbers).
Tensor random_cpu(const Shape& shape, std::uint64_t seed, DType dtype) {
  Tensor t = Tensor::empty(shape, DType::F32);
  ops::fill_uniform(t, -1.0, 1.0, seed);
  return t.to(dtype);
}

void expect_close(const Tensor& gpu, const Tensor& cpu, DType dtype, const std::string& what,
                  double factor = 16.0) {
  kiln::testing::expect_close(gpu, cpu, dtype, what, factor, "conv_gpu_");
}

// ||gpu - cpu|| / ||cpu|| for whole networks, where elementwise bounds are meaningless.
double relative_l2(const Tensor& gpu, const Tensor& cpu) {
  std::vector<double> g = gpu.to_vector<double>(), c = cpu.to_vector<double>();
  double diff = 0, ref = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    diff += (g[i] - c[i]) * (g[i] - c[i]);
    ref += c[i] * c[i];
  }
  return std::sqrt(diff / std::max(ref, 1e-300));
}

class ConvGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_FAIL() << "no GPU visible: the gpu suite needs one";
    poison_gpu_cache();
  }
};

const Precision kPrecisions[] = {
    {"f32", DType::F32, DType::F32, DType::F32},
    {"f16", DType::F16, DType::F16, DType::F16},  // O2-like: half weights
    {"bf16", DType::BF16, DType::BF16, DType::BF16},
    {"o1_f16", DType::F32, DType::F32, DType::F16},  // fp32 weights and activations, half conv
};

Context gpu_context(const Precision& p, bool channels_last) {
  Context ctx;
  ctx.run.device = kGpu;
  ctx.run.precision.activation = p.activation;
  ctx.run.precision.matmul = p.matmul;
  ctx.run.channels_last = channels_last;
  return ctx;
}

// Runs `cpu_layer` on the CPU and `gpu_layer` (same parameters) on the GPU, forward and backward,
// and compares output, input gradient and every parameter gradient.
void compare_layers(Layer& cpu_layer, Layer& gpu_layer, const Precision& p, bool channels_last,
                    const Shape& input, std::uint64_t seed, const std::string& what,
                    double factor = 16.0) {
  SCOPED_TRACE(what + " seed " + std::to_string(seed));
  Tensor x = random_cpu(input, seed, p.activation);
  Context cpu_ctx;
  cpu_ctx.run.channels_last = channels_last;
  // The CPU computes halves in f32 from the same rounded values; it sees the O1 cast too.
  Tensor x_cpu = is_half(p.matmul) ? x.to(p.matmul) : x;
  Tensor y_cpu = cpu_layer.forward(cpu_ctx, x_cpu);
  Context gpu_ctx = gpu_context(p, channels_last);
  // The GPU input arrives in the context's memory order, as inside a network.
  Tensor x_gpu = input.size() == 4 && channels_last
                     ? from_physical(to_physical(x, true).to(kGpu), true)
                     : x.to(kGpu);
  Tensor y_gpu = gpu_layer.forward(gpu_ctx, x_gpu);
  EXPECT_EQ(y_gpu.dtype(), x.dtype()) << what;
  if (y_gpu.dim() == 4) {
    EXPECT_EQ(is_channels_last(y_gpu), channels_last) << what;
  }
  expect_close(y_gpu, y_cpu, worst(p), what + " y", factor);
  Tensor dy = random_cpu(y_cpu.shape(), seed + 1, p.activation);
  Tensor dy_cpu = is_half(p.matmul) ? dy.to(p.matmul) : dy;
  Tensor dx_cpu = cpu_layer.backward(cpu_ctx, dy_cpu);
  Tensor dx_gpu = gpu_layer.backward(gpu_ctx, dy.to(kGpu));
  EXPECT_EQ(dx_gpu.dtype(), x.dtype()) << what;
  expect_close(dx_gpu, dx_cpu, worst(p), what + " dx", factor);
  auto cpu_params = cpu_layer.parameters(), gpu_params = gpu_layer.parameters();
  ASSERT_EQ(cpu_params.size(), gpu_params.size());
  for (std::size_t i = 0; i < cpu_params.size(); ++i) {
    expect_close(gpu_params[i]->grad, cpu_params[i]->grad, worst(p),
                 what + " d" + cpu_params[i]->name, factor);
  }
}

// ---- Conv2d ------------------------------------------------------------------------------------

struct ConvCase {
  const char* label;
  std::int64_t in, out;
  Pair kernel, stride, padding, dilation;
  std::int64_t groups;
  bool bias;
  Shape input;
};

const ConvCase kConvCases[] = {
    {"basic3x3", 8, 16, {3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, true, {4, 8, 12, 10}},
    {"stride2_odd", 3, 16, {3, 3}, {2, 2}, {1, 1}, {1, 1}, 1, true, {2, 3, 13, 11}},
    {"resnet_stem", 3, 64, {7, 7}, {2, 2}, {3, 3}, {1, 1}, 1, false, {2, 3, 33, 31}},
    {"dilation2", 16, 8, {3, 3}, {1, 1}, {2, 2}, {2, 2}, 1, true, {2, 16, 9, 9}},
    {"groups4", 16, 32, {3, 3}, {1, 1}, {1, 1}, {1, 1}, 4, true, {2, 16, 8, 8}},
    {"depthwise", 32, 32, {3, 3}, {2, 2}, {1, 1}, {1, 1}, 32, true, {2, 32, 9, 9}},
    {"pointwise_stride2", 64, 128, {1, 1}, {2, 2}, {0, 0}, {1, 1}, 1, false, {2, 64, 14, 14}},
    {"rectangular", 8, 8, {3, 1}, {1, 2}, {1, 0}, {1, 1}, 1, true, {2, 8, 7, 9}},
};

std::unique_ptr<Conv2d> make_conv(const ConvCase& c) {
  return std::make_unique<Conv2d>(c.in, c.out, c.kernel, c.stride, c.padding, c.dilation, c.groups,
                                  c.bias);
}

TEST_F(ConvGpuTest, Conv2dMatchesCpuInEveryPrecisionLayoutAndSearchMode) {
  for (const ConvCase& c : kConvCases) {
    for (const Precision& p : kPrecisions) {
      for (bool cl : {false, true}) {
        for (ConvAlgorithmSearch search :
             {ConvAlgorithmSearch::Heuristic, ConvAlgorithmSearch::Benchmark}) {
          const std::uint64_t seed = fresh_seed();
          auto cpu_conv = make_conv(c), gpu_conv = make_conv(c);
          cpu_conv->reset_parameters(seed);
          gpu_conv->reset_parameters(seed);
          cpu_conv->to(Device::cpu(), p.parameters);
          gpu_conv->to(kGpu, p.parameters);
          ConvAlgorithmOptions options;
          options.search = search;
          gpu_conv->set_algorithm_options(options);
          std::string what =
              std::string("conv_") + c.label + "_" + p.name + (cl ? "_nhwc" : "_nchw") +
              (search == ConvAlgorithmSearch::Benchmark ? "_benchmark" : "_heuristic");
          compare_layers(*cpu_conv, *gpu_conv, p, cl, c.input, seed, what);
          const ConvAlgorithmChoice& a = gpu_conv->last_algorithms();
          // Each direction runs a graph-API plan or a legacy algorithm.
          EXPECT_TRUE(a.forward >= 0 || a.graph_forward >= 0) << what;
          EXPECT_TRUE(a.backward_data >= 0 || a.graph_backward_data >= 0) << what;
          EXPECT_TRUE(a.backward_filter >= 0 ||
                      (a.graph_backward_filter >= 0 && a.graph_backward_filter_accumulate >= 0))
              << what;
        }
      }
    }
  }
}

TEST_F(ConvGpuTest, WeightGradientsAccumulateOnTheGpu) {
  const ConvCase& c = kConvCases[0];
  for (const Precision& p : kPrecisions) {
    for (bool cl : {false, true}) {
      auto conv = make_conv(c);
      conv->to(kGpu, p.parameters);
      Context ctx = gpu_context(p, cl);
      Tensor x = random_cpu(c.input, fresh_seed(), p.activation).to(kGpu);
      Tensor y = conv->forward(ctx, x);
      Tensor dy = random_cpu(y.shape(), fresh_seed(), p.activation).to(kGpu);
      conv->backward(ctx, dy);
      Tensor once = conv->weight().grad.clone();
      conv->forward(ctx, x);
      conv->backward(ctx, dy);
      Tensor doubled = once.to(DType::F32);
      ops::scale(doubled, 2.0);
      expect_close(conv->weight().grad, doubled, worst(p), std::string("accumulate_") + p.name);
    }
  }
}

TEST_F(ConvGpuTest, LifecycleCanImplementSetupRun) {
  Conv2dGeometry g;
  g.batch = 2;
  g.in_channels = 8;
  g.height = 10;
  g.width = 9;
  g.out_channels = 16;
  g.kernel_h = g.kernel_w = 3;
  g.pad_h = g.pad_w = 1;
  g.dtype = DType::F16;
  g.channels_last = true;
  std::string why;
  EXPECT_TRUE(cudnn_conv::can_implement(g, &why)) << why;
  Conv2dGeometry f64 = g;
  f64.dtype = DType::F64;
  EXPECT_FALSE(cudnn_conv::can_implement(f64, &why));
  EXPECT_NE(why.find("f64"), std::string::npos) << why;
  Conv2dGeometry bad_groups = g;
  bad_groups.groups = 3;
  EXPECT_FALSE(cudnn_conv::can_implement(bad_groups, &why));

  // Deterministic algorithms, chosen once and cached, give bit-identical weight gradients.
  for (ConvAlgorithmSearch search :
       {ConvAlgorithmSearch::Heuristic, ConvAlgorithmSearch::Benchmark}) {
    ConvAlgorithmOptions options;
    options.search = search;
    options.deterministic = true;
    std::size_t plans_before = cudnn_conv::cached_plans();
    ConvAlgorithmChoice a = cudnn_conv::setup(g, options);
    EXPECT_EQ(cudnn_conv::cached_plans(), plans_before + 1);
    ConvAlgorithmChoice again = cudnn_conv::setup(g, options);
    EXPECT_EQ(cudnn_conv::cached_plans(), plans_before + 1);
    EXPECT_EQ(again.forward, a.forward);
    EXPECT_EQ(again.graph_forward, a.graph_forward);
    EXPECT_TRUE(a.forward_deterministic && a.backward_data_deterministic &&
                a.backward_filter_deterministic);
    const std::uint64_t seed = fresh_seed();
    Tensor x = random_cpu({2, 10, 9, 8}, seed, DType::F16).to(kGpu);      // NHWC
    Tensor w = random_cpu({16, 3, 3, 8}, seed + 1, DType::F16).to(kGpu);  // KRSC
    Tensor dy = random_cpu({2, 10, 9, 16}, seed + 2, DType::F16).to(kGpu);
    Tensor y = Tensor::full({2, 10, 9, 16}, NAN, DType::F16, kGpu);
    cudnn_conv::forward(g, a, x, w, y);
    // The CPU reference through the layer API.
    Conv2d conv(8, 16, {3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, false);
    conv.weight().value.copy_from(w.to(Device::cpu()).permute({0, 3, 1, 2}));
    Context cpu_ctx;
    Tensor y_ref = conv.forward(cpu_ctx, from_physical(x.to(Device::cpu()), true));
    expect_close(from_physical(y, true).contiguous(), y_ref, DType::F16, "lifecycle_forward");
    Tensor dw1 = Tensor::full({16, 3, 3, 8}, NAN, DType::F16, kGpu);
    Tensor dw2 = Tensor::full({16, 3, 3, 8}, NAN, DType::F16, kGpu);
    cudnn_conv::backward_filter(g, a, x, dy, dw1, 0.0);
    cudnn_conv::backward_filter(g, a, x, dy, dw2, 0.0);
    EXPECT_EQ(dw1.to_vector<float>(), dw2.to_vector<float>());
    Tensor dx = Tensor::full({2, 10, 9, 8}, NAN, DType::F16, kGpu);
    cudnn_conv::backward_data(g, a, dy, w, dx);
    for (float v : dx.to_vector<float>()) ASSERT_TRUE(std::isfinite(v));
  }
}

// ---- BatchNorm2d, pooling, ReLU ----------------------------------------------------------------

TEST_F(ConvGpuTest, BatchNormMatchesCpu) {
  for (const Precision& p : kPrecisions) {
    if (p.matmul != p.activation) continue;  // batch norm has no O1 cast
    for (bool cl : {false, true}) {
      for (bool training : {true, false}) {
        for (const Shape& shape : {Shape{4, 16, 9, 7}, Shape{2, 64, 16, 16}, Shape{3, 5, 1, 3}}) {
          const std::uint64_t seed = fresh_seed();
          BatchNorm2d cpu_bn(shape[1]), gpu_bn(shape[1]);
          for (BatchNorm2d* bn : {&cpu_bn, &gpu_bn}) {
            ops::fill_uniform(bn->weight().value, 0.5, 1.5, seed);
            ops::fill_uniform(bn->bias().value, -0.5, 0.5, seed + 1);
            ops::fill_uniform(bn->running_mean().value, -0.2, 0.2, seed + 2);
            ops::fill_uniform(bn->running_var().value, 0.5, 1.5, seed + 3);
            bn->set_training(training);
          }
          cpu_bn.to(Device::cpu(), p.parameters);
          gpu_bn.to(kGpu, p.parameters);
          EXPECT_EQ(gpu_bn.weight().value.dtype(), DType::F32);  // fp32_in_half
          std::string what = std::string("batchnorm_") + p.name + (cl ? "_nhwc" : "_nchw") +
                             (training ? "_train_" : "_eval_") + shape_str(shape);
          compare_layers(cpu_bn, gpu_bn, p, cl, shape, seed, what);
          expect_close(gpu_bn.running_mean().value, cpu_bn.running_mean().value, DType::F32,
                       what + " running_mean", 64);
          expect_close(gpu_bn.running_var().value, cpu_bn.running_var().value, DType::F32,
                       what + " running_var", 64);
          EXPECT_EQ(gpu_bn.num_batches_tracked().value.item(), training ? 1.0 : 0.0);
        }
      }
    }
  }
}

// The fused ReLU recomputes its mask in backward from the saved input: bitwise the results of
// BatchNorm2d then ReLU on the GPU, in every dtype and layout (packed NHWC, unpacked, planes).
TEST_F(ConvGpuTest, BatchNormFusedReluEqualsBatchNormThenRelu) {
  for (const Precision& p : kPrecisions) {
    if (p.matmul != p.activation) continue;
    for (bool cl : {false, true}) {
      for (bool training : {true, false}) {
        for (const Shape& shape : {Shape{4, 16, 9, 7}, Shape{2, 64, 16, 16}, Shape{3, 5, 1, 3}}) {
          const std::uint64_t seed = fresh_seed();
          BatchNorm2d fused(shape[1]), plain(shape[1]);
          ReLU relu;
          for (BatchNorm2d* bn : {&fused, &plain}) {
            ops::fill_uniform(bn->weight().value, 0.5, 1.5, seed);
            ops::fill_uniform(bn->bias().value, -0.5, 0.5, seed + 1);
            ops::fill_uniform(bn->running_var().value, 0.5, 1.5, seed + 3);
            bn->set_training(training);
            bn->to(kGpu, p.parameters);
          }
          fused.set_fused_relu(true);
          const std::string what = std::string("bn_relu_") + p.name + (cl ? "_nhwc" : "_nchw") +
                                   (training ? "_train_" : "_eval_") + shape_str(shape) + " seed " +
                                   std::to_string(seed);
          Context ctx = gpu_context(p, cl);
          Tensor x = random_cpu(shape, seed + 4, p.activation);
          Tensor x_gpu = cl ? from_physical(to_physical(x, true).to(kGpu), true) : x.to(kGpu);
          Tensor dy = random_cpu(shape, seed + 5, p.activation).to(kGpu);
          Tensor y_fused = fused.forward(ctx, x_gpu);
          Tensor y_plain = relu.forward(ctx, plain.forward(ctx, x_gpu));
          Tensor dx_fused = fused.backward(ctx, dy);
          Tensor dx_plain = plain.backward(ctx, relu.backward(ctx, dy));
          EXPECT_EQ(y_fused.to_vector<double>(), y_plain.to_vector<double>()) << what;
          EXPECT_EQ(dx_fused.to_vector<double>(), dx_plain.to_vector<double>()) << what;
          EXPECT_EQ(fused.weight().grad.to_vector<double>(),
                    plain.weight().grad.to_vector<double>())
              << what;
          EXPECT_EQ(fused.bias().grad.to_vector<double>(), plain.bias().grad.to_vector<double>())
              << what;
        }
      }
    }
  }
}

// ReLU with a residual (a block's fused sum): bitwise an addition then ReLU on the GPU.
TEST_F(ConvGpuTest, ReluResidualEqualsAddThenRelu) {
  for (const Precision& p : kPrecisions) {
    if (p.matmul != p.activation) continue;
    for (bool cl : {false, true}) {
      for (const Shape& shape : {Shape{4, 16, 9, 7}, Shape{3, 5, 1, 3}}) {
        const std::uint64_t seed = fresh_seed();
        const std::string what = std::string("relu_residual_") + p.name +
                                 (cl ? "_nhwc_" : "_nchw_") + shape_str(shape) + " seed " +
                                 std::to_string(seed);
        Context ctx = gpu_context(p, cl);
        auto on_gpu = [&](const Tensor& t) {
          return cl ? from_physical(to_physical(t, true).to(kGpu), true) : t.to(kGpu);
        };
        Tensor x = on_gpu(random_cpu(shape, seed, p.activation));
        Tensor r = on_gpu(random_cpu(shape, seed + 1, p.activation));
        Tensor dy = on_gpu(random_cpu(shape, seed + 2, p.activation));
        ReLU fused, plain;
        fused.set_residual(r);
        Tensor y_fused = fused.forward(ctx, x);
        Tensor xp = to_physical(x, cl), rp = to_physical(r, cl);
        Tensor sum = Tensor::empty(xp.shape(), xp.dtype(), kGpu);
        ops::add(xp, rp, sum);
        Tensor y_plain = plain.forward(ctx, from_physical(sum, cl));
        EXPECT_EQ(is_channels_last(y_fused), cl) << what;
        EXPECT_EQ(y_fused.to_vector<double>(), y_plain.to_vector<double>()) << what;
        EXPECT_EQ(fused.backward(ctx, dy).to_vector<double>(),
                  plain.backward(ctx, dy).to_vector<double>())
            << what;
      }
    }
  }
}

TEST_F(ConvGpuTest, PoolingAndReluMatchCpu) {
  for (const Precision& p : kPrecisions) {
    if (p.matmul != p.activation) continue;  // no O1 cast here
    for (bool cl : {false, true}) {
      for (int kind = 0; kind < 6; ++kind) {
        std::unique_ptr<Layer> cpu_layer, gpu_layer;
        const char* label = "";
        for (std::unique_ptr<Layer>* l : {&cpu_layer, &gpu_layer}) {
          switch (kind) {
            case 0:
              *l = std::make_unique<MaxPool2d>(3, 2, 1), label = "maxpool3s2p1";
              break;
            case 1:
              *l = std::make_unique<MaxPool2d>(2), label = "maxpool2";
              break;
            case 2:
              *l = std::make_unique<AvgPool2d>(3, 2, 1), label = "avgpool3s2p1";
              break;
            case 3:
              *l = std::make_unique<AvgPool2d>(2), label = "avgpool2";
              break;
            case 4:
              *l = std::make_unique<GlobalAvgPool>(), label = "globalavg";
              break;
            default:
              *l = std::make_unique<ReLU>(), label = "relu";
          }
        }
        const std::uint64_t seed = fresh_seed();
        std::string what = std::string(label) + "_" + p.name + (cl ? "_nhwc" : "_nchw");
        compare_layers(*cpu_layer, *gpu_layer, p, cl, {3, 24, 13, 11}, seed, what, 4.0);
      }
    }
  }
}

// ---- ResNet-50 ---------------------------------------------------------------------------------

// Whole-network gradients are compared loosely, because ReLU and max-pool are not smooth: where a
// value the two sides compute slightly differently sits next to a ReLU's 0 or a max-pool tie,
// the whole gradient goes one way on one side and the other way on the other, and a fraction p
// of such flips gives a relative L2 error of about sqrt(p) that grows layer by layer backwards
// (measured on an H200: f32 up to ~1.3e-2, f16 up to ~0.4 at layer1, bf16 ~1). Train-mode batch
// norm on a batch of 2 adds ill-conditioning (the CPU in f32 and f64 differ by ~1e-2 already).
// So: logits and running statistics tightly, f32 gradients to a few percent, half gradients in
// eval mode to their layer4 level and finite everywhere; each layer alone is checked tightly above.
TEST_F(ConvGpuTest, ResNet50ForwardBackwardMatchesCpu) {
  ModelOptions options;
  options.image_channels = 3;
  options.num_classes = 1000;
  options.image_size = 224;
  struct Run {
    const char* name;
    DType dtype;
    bool channels_last;
    ConvAlgorithmSearch search;
    double logits_tol, eval_grad_tol, train_grad_tol;
  };
  const Run runs[] = {
      {"f32_nchw_heuristic", DType::F32, false, ConvAlgorithmSearch::Heuristic, 1e-4, 5e-2, 0.1},
      {"f32_nhwc_benchmark", DType::F32, true, ConvAlgorithmSearch::Benchmark, 1e-4, 5e-2, 0.1},
      {"f16_nchw_heuristic", DType::F16, false, ConvAlgorithmSearch::Heuristic, 4e-2, 0.3, 0},
      {"f16_nhwc_benchmark", DType::F16, true, ConvAlgorithmSearch::Benchmark, 4e-2, 0.3, 0},
      {"bf16_nhwc_heuristic", DType::BF16, true, ConvAlgorithmSearch::Heuristic, 1.5e-1, 0, 0},
  };
  const std::uint64_t seed = fresh_seed();
  Tensor x = random_cpu({2, 3, 224, 224}, seed, DType::F32);
  Tensor dy = random_cpu({2, 1000}, seed + 1, DType::F32);

  // The CPU reference: one training step's forward and backward, then one in eval mode.
  Model cpu = make_resnet(options, 50);
  auto cpu_params = cpu.net->parameters();
  auto grads_of = [](const std::vector<Parameter*>& params) {
    std::vector<Tensor> g;
    for (Parameter* p : params) {
      g.push_back(p->grad.to(Device::cpu(), DType::F32).clone());
      p->grad.zero();
    }
    return g;
  };
  Context cpu_ctx;
  Tensor train_logits_cpu = cpu.net->forward(cpu_ctx, x);
  cpu.net->backward(cpu_ctx, dy);
  std::vector<Tensor> train_grads_cpu = grads_of(cpu_params);
  std::vector<Tensor> buffers_cpu;
  for (Buffer* b : cpu.net->buffers()) buffers_cpu.push_back(b->value.clone());
  cpu.net->set_training(false);
  Tensor eval_logits_cpu = cpu.net->forward(cpu_ctx, x);
  cpu.net->backward(cpu_ctx, dy);
  std::vector<Tensor> eval_grads_cpu = grads_of(cpu_params);

  for (const Run& run : runs) {
    SCOPED_TRACE(std::string(run.name) + " seed " + std::to_string(seed));
    ConvAlgorithmOptions algo;
    algo.search = run.search;
    set_default_conv_algorithm_options(algo);
    Model gpu = make_resnet(options, 50);  // the same deterministic initialisation
    set_default_conv_algorithm_options(ConvAlgorithmOptions());
    gpu.net->to(kGpu, run.dtype);
    auto gpu_params = gpu.net->parameters();
    ASSERT_EQ(gpu_params.size(), 161u);
    Context ctx;
    ctx.run.device = kGpu;
    ctx.run.precision.activation = run.dtype;
    ctx.run.precision.matmul = run.dtype;
    ctx.run.channels_last = run.channels_last;
    Tensor x_gpu = run.channels_last
                       ? from_physical(to_physical(x.to(run.dtype), true).to(kGpu), true)
                       : x.to(kGpu, run.dtype);

    Tensor train_logits = gpu.net->forward(ctx, x_gpu);
    ASSERT_EQ(train_logits.shape(), (Shape{2, 1000}));
    const double train_logits_err = relative_l2(train_logits, train_logits_cpu);
    EXPECT_LE(train_logits_err, run.logits_tol) << "train logits";
    Tensor dx = gpu.net->backward(ctx, dy.to(kGpu, run.dtype));
    EXPECT_EQ(dx.shape(), x.shape());
    std::vector<Tensor> train_grads = grads_of(gpu_params);
    double train_worst = 0;
    for (std::size_t i = 0; i < train_grads.size(); ++i) {
      double err = relative_l2(train_grads[i], train_grads_cpu[i]);
      if (run.train_grad_tol > 0) {
        EXPECT_LE(err, run.train_grad_tol) << cpu_params[i]->name;
      }
      EXPECT_TRUE(std::isfinite(err)) << cpu_params[i]->name;
      train_worst = std::max(train_worst, err);
    }
    auto gpu_buffers = gpu.net->buffers();
    ASSERT_EQ(gpu_buffers.size(), buffers_cpu.size());
    double buffer_worst = 0;
    for (std::size_t i = 0; i < buffers_cpu.size(); ++i) {
      double err = relative_l2(gpu_buffers[i]->value, buffers_cpu[i]);
      EXPECT_LE(err, std::max(10 * run.logits_tol, 1e-3)) << gpu_buffers[i]->name;
      buffer_worst = std::max(buffer_worst, err);
    }

    gpu.net->set_training(false);
    Tensor eval_logits = gpu.net->forward(ctx, x_gpu);
    const double eval_logits_err = relative_l2(eval_logits, eval_logits_cpu);
    EXPECT_LE(eval_logits_err, run.logits_tol) << "eval logits";
    gpu.net->backward(ctx, dy.to(kGpu, run.dtype));
    std::vector<Tensor> eval_grads = grads_of(gpu_params);
    double eval_worst = 0;
    std::string eval_worst_name;
    for (std::size_t i = 0; i < eval_grads.size(); ++i) {
      double err = relative_l2(eval_grads[i], eval_grads_cpu[i]);
      EXPECT_TRUE(std::isfinite(err)) << cpu_params[i]->name;
      // Half: only layer4 and fc, before the flips have piled up (see above).
      const bool checked =
          run.dtype == DType::F32 ||
          (run.eval_grad_tol > 0 && (cpu_params[i]->name.rfind("layer4.", 0) == 0 ||
                                     cpu_params[i]->name.rfind("fc.", 0) == 0));
      if (checked) {
        EXPECT_LE(err, run.eval_grad_tol) << cpu_params[i]->name;
      }
      if (!(err <= eval_worst)) {
        eval_worst = err;
        eval_worst_name = cpu_params[i]->name;
      }
    }
    std::printf(
        "resnet50 %s: relative L2 error of train logits %.2e, running stats %.2e, train grads "
        "(worst) %.2e; eval logits %.2e, eval grads (worst) %.2e (%s)\n",
        run.name, train_logits_err, buffer_worst, train_worst, eval_logits_err, eval_worst,
        eval_worst_name.c_str());
  }
}

// model.fuse_conv_batch_norm: a ResNet trained with batch norm fused into cuDNN's convolutions
// is as close to the f32 CPU reference as its layers run one by one are (the same initialisation,
// input and output gradient, two training steps): logits, every parameter gradient and the
// running statistics, the same batch counts, then eval logits from those statistics. Halves differ
// from the reference by their roundings (ReLU masks flip), so each error is held against the
// layers' own. cuDNN 9 fuses f16 on Ampere and Hopper, so there the blocks must run fused; bf16
// has no engines and must fall back to the layers exactly.
TEST_F(ConvGpuTest, ResNetFusedBatchNormEqualsTheLayers) {
  int device = 0, major = 0, minor = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), cudaSuccess);
  struct Run {
    const char* name;
    int depth;
    bool cifar_stem;
    int image_size;
    DType dtype;
  };
  const Run runs[] = {
      {"resnet18_cifar_f16", 18, true, 32, DType::F16},
      {"resnet50_f16", 50, false, 64, DType::F16},
      {"resnet50_bf16", 50, false, 64, DType::BF16},
  };
  const std::uint64_t seed = fresh_seed();
  for (const Run& run : runs) {
    SCOPED_TRACE(std::string(run.name) + " seed " + std::to_string(seed));
    const bool fusable = run.dtype == DType::F16 && ((major == 8 && minor == 0) || major == 9);
    ModelOptions options;
    options.image_channels = 3;
    options.num_classes = 10;
    options.image_size = run.image_size;
    options.cifar_stem = run.cifar_stem;
    const std::int64_t batch = 8;
    // The input as the GPU sees it (rounded to the half type), for the reference too.
    Tensor x = random_cpu({batch, 3, run.image_size, run.image_size}, seed, DType::F32)
                   .to(run.dtype)
                   .to(DType::F32);
    Tensor dy = random_cpu({batch, 10}, seed + 1, DType::F32).to(run.dtype).to(DType::F32);
    struct Result {
      Tensor logits, eval_logits;
      std::vector<Tensor> grads, buffers;
      std::vector<std::string> names;
    };
    auto train = [&](bool gpu, bool fuse) {
      options.fuse_conv_batch_norm = fuse;
      Model m = make_resnet(options, run.depth);
      Context ctx;
      Tensor xin = x, dyin = dy;
      if (gpu) {
        m.net->to(kGpu, run.dtype);
        ctx.run.device = kGpu;
        ctx.run.precision.activation = run.dtype;
        ctx.run.precision.matmul = run.dtype;
        ctx.run.channels_last = true;
        xin = from_physical(to_physical(x.to(run.dtype), true).to(kGpu), true);
        dyin = dy.to(kGpu, run.dtype);
      }
      Result r;
      for (int step = 0; step < 2; ++step) {  // two batches: the running statistics move twice
        for (Parameter* p : m.net->parameters()) p->grad.zero();
        r.logits = m.net->forward(ctx, xin).to(Device::cpu(), DType::F32);
        m.net->backward(ctx, dyin);
      }
      for (Parameter* p : m.net->parameters()) {
        r.grads.push_back(p->grad.to(Device::cpu(), DType::F32));
        r.names.push_back(p->name);
      }
      for (Buffer* b : m.net->buffers())
        r.buffers.push_back(b->value.to(Device::cpu(), DType::F32));
      m.net->set_training(false);
      r.eval_logits = m.net->forward(ctx, xin).to(Device::cpu(), DType::F32);
      return r;
    };
    const Result cpu = train(false, false);
    const conv_bn_fusion::Counts before = conv_bn_fusion::counts();
    const Result layers = train(true, false);
    const conv_bn_fusion::Counts middle = conv_bn_fusion::counts();
    EXPECT_EQ(middle.fused + middle.refused, before.fused + before.refused)
        << "fuse_conv_batch_norm=false built fused plans";
    const Result fused = train(true, true);
    const conv_bn_fusion::Counts after = conv_bn_fusion::counts();
    if (fusable) {
      EXPECT_GT(after.fused, middle.fused) << "no convolution ran fused";
      EXPECT_EQ(after.refused, middle.refused) << "cuDNN refused a pattern (see stderr)";
    }
    if (run.dtype == DType::BF16) {
      EXPECT_EQ(after.fused, middle.fused) << "bf16 ran fused";
    }

    // Fused no further from the reference than the layers, up to a margin; exactly the layers
    // when nothing was fused.
    const bool exact = after.fused == middle.fused;
    auto check = [&](const Tensor& f, const Tensor& l, const Tensor& ref, double margin,
                     const std::string& what, double& worst_ratio, std::string& worst_name) {
      const double ef = relative_l2(f, ref), el = relative_l2(l, ref);
      if (exact) {
        EXPECT_EQ(relative_l2(f, l), 0.0) << what;
      } else {
        EXPECT_LE(ef, 1.5 * el + margin) << what << ": fused " << ef << ", layers " << el;
      }
      const double ratio = ef / std::max(el, 1e-12);
      if (!(ratio <= worst_ratio)) worst_ratio = ratio, worst_name = what;
    };
    double ratio = 0;
    std::string name;
    check(fused.logits, layers.logits, cpu.logits, 2e-3, "train logits", ratio, name);
    check(fused.eval_logits, layers.eval_logits, cpu.eval_logits, 2e-3, "eval logits", ratio, name);
    ASSERT_EQ(fused.grads.size(), cpu.grads.size());
    for (std::size_t i = 0; i < fused.grads.size(); ++i) {
      check(fused.grads[i], layers.grads[i], cpu.grads[i], 2e-2, cpu.names[i], ratio, name);
    }
    ASSERT_EQ(fused.buffers.size(), cpu.buffers.size());
    for (std::size_t i = 0; i < fused.buffers.size(); ++i) {
      if (fused.buffers[i].numel() == 1) {  // num_batches_tracked
        EXPECT_EQ(fused.buffers[i].item(), cpu.buffers[i].item());
        continue;
      }
      check(fused.buffers[i], layers.buffers[i], cpu.buffers[i], 2e-3,
            "buffer " + std::to_string(i), ratio, name);
    }
    std::printf(
        "%s: against the f32 CPU, fused / layers relative L2 error: logits %.2e / %.2e, "
        "worst ratio %.2f (%s); plans fused %lld, refused %lld\n",
        run.name, relative_l2(fused.logits, cpu.logits), relative_l2(layers.logits, cpu.logits),
        ratio, name.c_str(), static_cast<long long>(after.fused - middle.fused),
        static_cast<long long>(after.refused - middle.refused));
  }
}

}  // namespace
}  // namespace kiln
