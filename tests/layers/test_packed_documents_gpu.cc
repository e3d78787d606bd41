// Packed documents (CallInputs::document_starts) on the GPU against the CPU: grouped-query
// attention with rotary positions restarting per document, in bf16 and f16 from the same
// parameters and fresh random inputs, through each path that serves document masks: Kiln's flash
// kernels (head dim 64), the unfused path (head dim 128, and 64 with KILN_ATTENTION_UNFUSED=1).
// Documents of many lengths cross the 64-token tiles (one longer than a tile, several inside one).
// Outputs come from NaN-poisoned memory. Tolerance: |gpu - cpu| <= 24 eps(dtype) (rms + |cpu|).

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/ops.h"
#include "core/stream.h"
#include "layers/grouped_query_attention.h"
#include "tests/gpu_test_util.h"

namespace kiln {
namespace {

using kiln::testing::eps_of;
using kiln::testing::fresh_seed;
using kiln::testing::kGpu;

Tensor random_cpu(const Shape& shape, DType dt, std::uint64_t seed) {
  Tensor t = Tensor::empty(shape, DType::F32);
  ops::fill_uniform(t, -1.0, 1.0, seed);
  return t.to(dt).to(DType::F32);  // representable in dt
}

// Row 0: documents of 3, 70, 1, 20, 50, 56 tokens; row 1: a window opening inside a document
// (its first 90 tokens), then 2, 64 and 44.
Tensor document_starts(std::int64_t t) {
  const std::vector<std::vector<std::int64_t>> rows = {{3, 70, 1, 20, 50, 56}, {90, 2, 64, 44}};
  std::vector<std::int32_t> starts;
  for (const auto& lengths : rows) {
    std::int32_t at = 0;
    for (std::int64_t length : lengths) {
      for (std::int64_t i = 0; i < length; ++i) starts.push_back(at);
      at += static_cast<std::int32_t>(length);
    }
    EXPECT_EQ(at, t);
  }
  return Tensor::from_vector(starts, {2, t});
}

void expect_close(const Tensor& got, const Tensor& want, DType dt, const std::string& what) {
  ASSERT_TRUE(got.device().is_cuda()) << what;
  ASSERT_EQ(got.numel(), want.numel()) << what;
  auto g = got.to_vector<double>(), w = want.to_vector<double>();
  double rms = 0;
  for (double v : w) rms += v * v;
  rms = std::sqrt(rms / static_cast<double>(w.size()));
  ASSERT_GT(rms, 0.0) << what << ": the CPU reference is all zero";
  int bad = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double tol = 24 * eps_of(dt) * (rms + std::fabs(w[i]));
    if (!(std::fabs(g[i] - w[i]) <= tol) && ++bad <= 5)
      ADD_FAILURE() << what << "[" << i << "]: gpu " << g[i] << ", cpu " << w[i];
  }
  EXPECT_EQ(bad, 0) << what << " (" << g.size() << " elements, rms " << rms << ")";
}

struct Result {
  Tensor y, dx;
  std::vector<Tensor> grads;
};

Result run(GroupedQueryAttention& attn, const Tensor& x, const Tensor& dy, const Tensor& starts,
           Device device, DType dt) {
  Context ctx;
  ctx.run.device = device;
  ctx.run.precision.activation = dt;
  ctx.run.precision.matmul = dt;
  ctx.call.document_starts = starts.to(device);
  for (Parameter* p : attn.parameters()) p->grad.fill(0.0);
  Result r;
  r.y = attn.forward(ctx, x.to(device, dt));
  r.dx = attn.backward(ctx, dy.to(device, dt));
  for (Parameter* p : attn.parameters()) r.grads.push_back(p->grad.to(Device::cpu()).clone());
  return r;
}

class PackedDocumentsGpu : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_FAIL() << "no GPU visible: the gpu suite needs one";
  }
};

TEST_P(PackedDocumentsGpu, GroupedQueryAttentionMatchesCpu) {
  const DType dt = GetParam();
  std::uint64_t seed = fresh_seed();
  const std::int64_t b = 2, t = 200, hidden = 256;
  const Tensor starts = document_starts(t);
  struct Case {
    std::int64_t head_dim;
    const char* unfused;
  };
  for (const Case& c : {Case{64, "0"}, Case{64, "1"}, Case{128, "0"}}) {
    setenv("KILN_ATTENTION_UNFUSED", c.unfused, 1);
    GroupedQueryAttentionConfig config;
    config.hidden = hidden;
    config.heads = 4;
    config.kv_heads = 2;
    config.head_dim = c.head_dim;
    config.max_positions = 256;
    config.rotary.theta = 10000.0;
    GroupedQueryAttention attn(config);
    for (Parameter* p : attn.parameters()) {
      ops::fill_uniform(p->value, -0.5, 0.5, ++seed);
      p->value.copy_from(p->value.to(dt));
    }
    const Tensor x = random_cpu({b, t, hidden}, dt, ++seed),
                 dy = random_cpu({b, t, hidden}, dt, ++seed);
    attn.to(Device::cpu(), DType::F32);
    const Result want = run(attn, x, dy, starts, Device::cpu(), DType::F32);
    attn.to(kGpu, dt);
    kiln::testing::poison_gpu_cache();
    const Result got = run(attn, x, dy, starts, kGpu, dt);
    const std::string what = "d=" + std::to_string(c.head_dim) + " unfused=" + c.unfused + " " +
                             dtype_name(dt) + " seed " + std::to_string(seed);
    expect_close(got.y, want.y, dt, what + " y");
    expect_close(got.dx, want.dx, dt, what + " dx");
    std::vector<Parameter*> params = attn.parameters();
    for (std::size_t i = 0; i < params.size(); ++i)
      expect_close(got.grads[i].to(kGpu), want.grads[i], dt, what + " grad " + params[i]->name);
  }
  unsetenv("KILN_ATTENTION_UNFUSED");
}

INSTANTIATE_TEST_SUITE_P(HalfTypes, PackedDocumentsGpu, ::testing::Values(DType::BF16, DType::F16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(dtype_name(info.param));
                         });

}  // namespace
}  // namespace kiln
