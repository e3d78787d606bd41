// FP8 delayed scaling across data-parallel ranks (train/fp8_amax_reduction.h), under mpirun on
// the CPU: each rank casts tensors of its own magnitudes (the CPU twin's casts), then the
// reduction leaves every rank with the same state, whose history is the elementwise largest of
// the ranks' and whose next scale is the one the largest amax gives.

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "comm/mpi_communicator.h"
#include "comm/world.h"
#include "layers/cuda/fp8_projection_cuda.h"  // the state row layout
#include "layers/fp8_projection.h"
#include "train/fp8_amax_reduction.h"

namespace kiln::train {

MpiCommunicator& comm() {
  static MpiCommunicator* c = [] {
    CommunicatorOptions options;
    options.timeout_s = 120;
    return new MpiCommunicator(world(), options);
  }();
  return *c;
}

namespace {

Tensor filled(float magnitude) {
  std::vector<float> v(64);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = (i % 2 ? -1.0f : 0.5f) * magnitude;
  return Tensor::from_vector(v, {8, 8});
}

TEST(Fp8AmaxReduction, RanksAgreeOnTheLargestHistoryAndItsScale) {
  const int P = comm().size(), r = comm().rank();
  ASSERT_GE(P, 2) << "run under mpirun with two ranks or more";
  Fp8Settings settings;
  settings.enabled = true;
  settings.scaling.recipe = Fp8Recipe::Delayed;
  settings.scaling.history = 4;
  std::vector<Buffer> buffers(2);
  std::vector<Buffer*> pointers;
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    buffers[i].name = "h." + std::to_string(i) + ".fp8_scaling";
    buffers[i].value = Tensor::zeros(Fp8Projection::state_shape(settings), DType::F32);
    pointers.push_back(&buffers[i]);
  }
  std::vector<Fp8Projection> projections;
  for (Buffer& b : buffers) projections.emplace_back(b, settings);
  // Two steps' casts; the ranks' magnitudes differ and the largest moves between ranks.
  for (int step = 0; step < 2; ++step) {
    for (std::size_t i = 0; i < projections.size(); ++i) {
      const float m = 1.0f + static_cast<float>((r + step) % P) + 10.0f * static_cast<float>(i);
      projections[i].emulate(Fp8Projection::Input, filled(m), true);
      projections[i].emulate(Fp8Projection::Weight, filled(0.25f * m), true);
      projections[i].emulate(Fp8Projection::Gradient, filled(1e-3f * m), true);
    }
  }
  // What every rank held before: the merged state is their elementwise largest, its next scale
  // taken from the merged history.
  const Shape shape = Fp8Projection::state_shape(settings);
  std::vector<std::vector<float>> expected;
  for (Buffer& b : buffers) {
    Tensor all = Tensor::empty({P * shape[0], shape[1]}, DType::F32);
    comm().all_gather(b.value, all);
    const std::vector<float> v = all.to_vector<float>();
    const std::size_t n = v.size() / P;
    std::vector<float> largest(v.begin(), v.begin() + n);
    for (int q = 1; q < P; ++q)
      for (std::size_t k = 0; k < n; ++k) largest[k] = std::max(largest[k], v[q * n + k]);
    expected.push_back(largest);
  }
  Fp8AmaxReduction reduction(pointers, settings, comm());
  reduction.reduce();
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    const std::vector<float> got = buffers[i].value.to_vector<float>();
    const std::int64_t row = shape[1];
    for (int role = 0; role < Fp8Projection::kRoles; ++role) {
      const float* want = expected[i].data() + role * row;
      const float* have = got.data() + role * row;
      const Fp8Format format = role == Fp8Projection::Gradient ? Fp8Format::E5M2 : Fp8Format::E4M3;
      // The largest amax any rank cast: magnitude P (+10 i), times the role's factor.
      const float factor = role == 0 ? 1.0f : role == 1 ? 0.25f : 1e-3f;
      const float amax = (static_cast<float>(P) + 10.0f * static_cast<float>(i)) * factor;
      EXPECT_EQ(have[kFp8RowState], fp8_max(format) / amax)
          << "projection " << i << " role " << role;
      for (int k = 1; k < kFp8StateHeader + settings.scaling.history; ++k) {
        EXPECT_EQ(have[kFp8RowState + k], want[kFp8RowState + k])
            << "projection " << i << " role " << role << " field " << k;
      }
    }
    // Every rank holds the same bytes.
    Tensor all = Tensor::empty({P * shape[0], shape[1]}, DType::F32);
    comm().all_gather(buffers[i].value, all);
    const std::vector<float> v = all.to_vector<float>();
    for (int q = 1; q < P; ++q)
      EXPECT_TRUE(std::equal(v.begin(), v.begin() + got.size(), v.begin() + q * got.size()))
          << "rank " << q << " differs from rank 0 (projection " << i << ")";
  }
}

TEST(Fp8AmaxReduction, OnlyForSeveralRanksAndDelayedScaling) {
  Fp8Settings settings;
  settings.enabled = true;
  Buffer b;
  b.name = "attn.fp8_qkv_scaling";
  b.value = Tensor::zeros(Fp8Projection::state_shape(settings), DType::F32);
  std::vector<Buffer*> buffers = {&b};
  EXPECT_NE(make_fp8_amax_reduction(buffers, settings, &comm()), nullptr);
  EXPECT_EQ(make_fp8_amax_reduction(buffers, settings, nullptr), nullptr);
  settings.scaling.recipe = Fp8Recipe::Current;
  EXPECT_EQ(make_fp8_amax_reduction(buffers, settings, &comm()), nullptr);
  settings.scaling.recipe = Fp8Recipe::Delayed;
  settings.enabled = false;
  EXPECT_EQ(make_fp8_amax_reduction(buffers, settings, &comm()), nullptr);
}

}  // namespace
}  // namespace kiln::train

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  kiln::init_world(&argc, &argv);
  const int status = RUN_ALL_TESTS();
  // A failure on any rank fails every rank's exit code.
  const bool all_passed = kiln::train::comm().all_reduce_host(static_cast<std::int64_t>(status),
                                                              kiln::HostReduceOp::Max) == 0;
  kiln::finalize_world();
  return all_passed ? 0 : 1;
}
