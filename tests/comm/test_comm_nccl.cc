// NCCL tests on two GPUs (label gpu2, run under mpirun -np 2): collectives against closed-form
// answers for every float dtype, DataParallel against a single-process run, and all-reduce bus
// bandwidth at 1, 16, 64 and 256 MiB (rank 0 prints). Without enough GPUs every test FAILS.

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include "comm/nccl_communicator.h"
#include "comm/world.h"
#include "core/allocator.h"
#include "core/cuda_graph.h"
#include "core/stream.h"
#include "tests/comm/dp_training.h"

namespace kiln {
namespace {

using testing::DpRun;

Communicator* g_comm = nullptr;

Communicator& comm() {
  if (g_comm == nullptr) {
    ADD_FAILURE() << "no NCCL communicator: this test needs one GPU per rank";
    throw Error("no communicator");
  }
  return *g_comm;
}

const DType kFloatTypes[] = {DType::F32, DType::F64, DType::F16, DType::BF16};

Tensor on_device(const std::vector<double>& values, DType dtype) {
  return Tensor::from_vector(values, {static_cast<std::int64_t>(values.size())})
      .to(comm().device(), dtype);
}

TEST(Nccl, UsesOneGpuPerRank) {
  ASSERT_GE(cuda_device_count(), 2) << "gpu2 tests need two GPUs";
  EXPECT_EQ(comm().device(), Device::cuda(world().local_rank));
  EXPECT_EQ(comm().backend_name(), "nccl");
}

TEST(Nccl, AllReduceSumAndAverageAreExact) {
  const int P = comm().size(), r = comm().rank();
  for (DType dtype : kFloatTypes) {
    for (std::int64_t n : {std::int64_t{1}, std::int64_t{1037}, std::int64_t{1} << 20}) {
      std::vector<double> values(n);
      for (std::int64_t i = 0; i < n; ++i) values[i] = (r + 1) * (i % 7 + 1);
      Tensor t = on_device(values, dtype);
      Tensor a = t.clone();
      comm().all_reduce(t, ReduceOp::Sum);
      comm().all_reduce(a, ReduceOp::Average);
      std::vector<double> sum = t.to_vector<double>(), avg = a.to_vector<double>();
      std::int64_t wrong = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        const double expected = P * (P + 1) / 2.0 * (i % 7 + 1);
        wrong += sum[i] != expected;
        wrong += std::fabs(avg[i] - expected / P) > 1e-2 * expected / P;
      }
      EXPECT_EQ(wrong, 0) << dtype_name(dtype) << " n=" << n;
    }
  }
}

// train.cuda_graphs captures the bucket all-reduces with the step: an NCCL collective on the
// communication stream, forked from and joined back to the captured stream, replays right on any
// number of ranks (gpu-check also runs this test alone on one GPU, a one-rank communicator).
TEST(Nccl, AllReduceReplaysInsideACudaGraph) {
  const int P = comm().size(), r = comm().rank();
  const std::int64_t n = 4099;
  Stream stream = Stream::create(comm().device());
  StreamGuard guard(comm().device(), stream.handle());
  Tensor t = on_device(std::vector<double>(n, r + 1.0), DType::F32);
  const Tensor fresh = t.clone();
  CudaGraph graph;
  int pool = 0;
  std::string why;
  ASSERT_TRUE(graph.capture(
      comm().device(), stream.handle(), &pool, [&] { comm().all_reduce(t, ReduceOp::Sum); }, &why))
      << why;
  for (int replay = 0; replay < 3; ++replay) {
    t.copy_from(fresh);
    graph.replay(stream.handle());
    std::vector<double> sum = t.to_vector<double>();
    std::int64_t wrong = 0;
    for (double v : sum) wrong += v != P * (P + 1) / 2.0;
    EXPECT_EQ(wrong, 0) << "replay " << replay;
  }
  stream.synchronize();
  cuda_allocator(comm().device().index).release_pool(&pool);
}

TEST(Nccl, BroadcastAllGatherReduceScatter) {
  const int P = comm().size(), r = comm().rank();
  for (DType dtype : kFloatTypes) {
    Tensor b = on_device(std::vector<double>(33, 3.0 + r), dtype);
    comm().broadcast(b, P - 1);
    for (double v : b.to_vector<double>()) ASSERT_EQ(v, 3.0 + (P - 1)) << dtype_name(dtype);

    const std::int64_t n = 11;
    std::vector<double> mine(n);
    for (std::int64_t i = 0; i < n; ++i) mine[i] = 20 * r + i;
    Tensor gathered = Tensor::full({P * n}, NAN, dtype, comm().device());  // poisoned
    comm().all_gather(on_device(mine, dtype), gathered);
    std::vector<double> g = gathered.to_vector<double>();
    int wrong = 0;
    for (int q = 0; q < P; ++q) {
      for (std::int64_t i = 0; i < n; ++i) wrong += g[q * n + i] != 20 * q + i;
    }
    EXPECT_EQ(wrong, 0) << "all_gather " << dtype_name(dtype);

    std::vector<double> in(P * n);
    for (std::int64_t j = 0; j < P * n; ++j) in[j] = (r + 1) * (j % 9 + 1);
    Tensor out = Tensor::full({n}, NAN, dtype, comm().device());
    comm().reduce_scatter(on_device(in, dtype), out, ReduceOp::Sum);
    std::vector<double> o = out.to_vector<double>();
    for (std::int64_t i = 0; i < n; ++i) {
      EXPECT_EQ(o[i], P * (P + 1) / 2.0 * ((r * n + i) % 9 + 1)) << dtype_name(dtype);
    }
  }
  comm().barrier();
  EXPECT_EQ(comm().all_reduce_host(static_cast<std::int64_t>(r), HostReduceOp::Max), P - 1);
}

TEST(Nccl, DataParallelMatchesSingleProcess) {
  const Device gpu = comm().device();
  for (DType dtype : {DType::F64, DType::F32}) {
    DpRun run;
    run.options.bucket_bytes = 1024;  // several buckets, so all-reduces overlap backward
    auto result = testing::data_parallel_run(comm(), 7, dtype, run);
    auto reference = testing::reference_run(7, gpu, dtype, run.steps, run.global_batch, run.lr);
    auto initial = testing::reference_run(7, gpu, dtype, 0, run.global_batch, run.lr);
    EXPECT_TRUE(testing::bitwise_equal_on_all_ranks(comm(), result.values)) << dtype_name(dtype);
    const double tolerance = dtype == DType::F64 ? 1e-10 : 1e-5;
    EXPECT_LT(testing::max_relative_difference(result.values, reference), tolerance)
        << dtype_name(dtype);
    EXPECT_GT(testing::max_relative_difference(initial, reference), 1e-3);
    EXPECT_EQ(result.bucket_all_reduces, run.steps * result.buckets);

    DpRun accumulate = run;
    accumulate.micro_steps = 2;
    auto acc = testing::data_parallel_run(comm(), 7, dtype, accumulate);
    EXPECT_LT(testing::max_relative_difference(acc.values, reference), tolerance)
        << "accumulation " << dtype_name(dtype);
    EXPECT_EQ(acc.bucket_all_reduces, run.steps * acc.buckets);
  }
  DpRun half;
  half.options.compression = GradientCompression::Half;
  auto h = testing::data_parallel_run(comm(), 7, DType::F32, half);
  auto reference =
      testing::reference_run(7, gpu, DType::F32, half.steps, half.global_batch, half.lr);
  EXPECT_TRUE(testing::bitwise_equal_on_all_ranks(comm(), h.values));
  EXPECT_LT(testing::max_relative_difference(h.values, reference), 2e-2);
}

TEST(Nccl, AllReduceBusBandwidth) {
  const int P = comm().size();
  for (std::int64_t mib : {1, 16, 64, 256}) {
    const std::int64_t n = mib * (1 << 20) / 4;
    Tensor t = Tensor::full({n}, 1.0, DType::F32, comm().device());
    const int warmup = 5, iterations = 20;
    comm().comm_stream_wait_for_current();  // the fill above ran on the compute stream
    for (int i = 0; i < warmup; ++i) comm().all_reduce_on_comm_stream(t, ReduceOp::Average);
    comm().synchronize();
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; ++i) comm().all_reduce_on_comm_stream(t, ReduceOp::Average);
    comm().synchronize();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
        iterations;
    // The average of ones is one: count elements that are not.
    std::vector<float> v = t.to_vector<float>();
    std::int64_t wrong = 0;
    for (float x : v) wrong += x != 1.0f;
    EXPECT_EQ(wrong, 0);
    const double bytes = static_cast<double>(n) * 4;
    const double algbw = bytes / seconds / 1e9;
    const double busbw = algbw * 2.0 * (P - 1) / P;
    if (comm().rank() == 0) {
      std::printf(
          "all_reduce f32 %4lld MiB over %d ranks: %8.1f us  algbw %7.2f GB/s  "
          "busbw %7.2f GB/s  wrong %lld\n",
          static_cast<long long>(mib), P, seconds * 1e6, algbw, busbw,
          static_cast<long long>(wrong));
    }
  }
}

// ZeRO over NCCL: bucket reduce-scatters on the communication stream land the average in each
// rank's shard, stage 2 frees the full buffers, and the all-gather returns every rank's pieces.
TEST(Nccl, ZeroShardsAverageAndGather) {
  const int r = comm().rank(), n = comm().size();
  for (int stage : {1, 2}) {
    auto model = testing::make_tiny_model(11, comm().device(), DType::F32);
    DataParallelOptions options;
    options.bucket_bytes = 1024;
    options.zero_stage = stage;
    DataParallel dp(model->parameters(), model->buffers(), comm(), options);
    dp.zero_grad();
    for (Parameter* p : model->parameters()) p->grad.fill(r + 1.0);
    dp.finish();
    for (const ShardPiece& piece : dp.shard_pieces()) {
      for (float v : piece.grad.to_vector<float>()) ASSERT_EQ(v, (n + 1) / 2.0f) << stage;
    }
    if (stage == 2) {
      for (Parameter* p : model->parameters()) EXPECT_FALSE(p->grad.defined());
    }
    dp.zero_grad();
    for (const ShardPiece& piece : dp.shard_pieces()) {
      piece.parameter->value.view({piece.parameter->value.numel()})
          .slice(0, piece.offset, piece.offset + piece.numel)
          .fill(10.0 + r);
    }
    dp.gather_parameters();
    std::vector<double> all;
    for (Parameter* p : model->parameters()) {
      for (float v : p->value.to_vector<float>()) {
        ASSERT_TRUE(v >= 10.0f && v < 10.0f + n) << p->name << " " << v;
        all.push_back(v);
      }
    }
    EXPECT_TRUE(testing::bitwise_equal_on_all_ranks(comm(), all)) << stage;
  }
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const kiln::World& w = kiln::init_world(&argc, &argv);
  std::unique_ptr<kiln::Communicator> communicator;
  try {
    kiln::Device device = kiln::select_local_device(w);
    communicator = std::make_unique<kiln::NcclCommunicator>(w, device);
    kiln::g_comm = communicator.get();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cannot set up NCCL: %s\n", e.what());  // every test then fails
  }
  int status = RUN_ALL_TESTS();
  communicator.reset();
  kiln::finalize_world();
  return status;
}
