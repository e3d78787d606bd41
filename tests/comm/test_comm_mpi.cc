// Multi-rank tests of comm/ on the CPU, run under mpirun with 2 and 3 ranks (label mpi): the
// collectives against closed-form answers (each rank contributes values built from its rank, so
// the result is known exactly), the host helpers, and DataParallel against a single-process run.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>

#include "comm/bandwidth.h"
#include "comm/gradient_reduction.h"
#include "comm/mpi_communicator.h"
#include "comm/watchdog.h"
#include "comm/world.h"
#include "tests/comm/dp_training.h"

namespace kiln {
namespace {

using testing::DpRun;

MpiCommunicator& comm() {
  static MpiCommunicator* c = [] {
    CommunicatorOptions options;
    options.timeout_s = 120;  // a rank stuck in a test fails the job instead of hanging CI
    return new MpiCommunicator(world(), options);
  }();
  return *c;
}

const DType kFloatTypes[] = {DType::F32, DType::F64, DType::BF16, DType::F16};

TEST(World, MatchesTheLauncher) {
  const World& w = world();
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  ASSERT_NE(size, nullptr) << "these tests run under mpirun";
  EXPECT_EQ(w.size, std::atoi(size));
  EXPECT_EQ(w.rank, std::atoi(std::getenv("OMPI_COMM_WORLD_RANK")));
  EXPECT_EQ(w.local_size, w.size);  // one host in CI
  EXPECT_EQ(w.local_rank, w.rank);
  EXPECT_NE(process_identity().find("rank " + std::to_string(w.rank) + "/"), std::string::npos);
}

TEST(MpiCommunicator, AllReduceMaxIsTheLargestOfEveryRank) {
  const int P = comm().size(), r = comm().rank();
  for (DType dtype : {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I64}) {
    std::vector<double> values(37);
    // Element i's largest sits on rank i % P; negative values too.
    for (std::size_t i = 0; i < values.size(); ++i)
      values[i] = (static_cast<int>(i) % P == r ? 3.0 : -1.0 - r) * static_cast<double>(i + 1);
    Tensor t = Tensor::from_vector(values, {37}).to(dtype);
    comm().all_reduce(t, ReduceOp::Max);
    const std::vector<double> got = t.to_vector<double>();
    for (std::size_t i = 0; i < got.size(); ++i)
      EXPECT_EQ(got[i], 3.0 * static_cast<double>(i + 1)) << dtype_name(dtype) << " element " << i;
  }
  std::vector<float> nan(3, static_cast<float>(r));
  if (r == P - 1) nan[1] = NAN;
  Tensor t = Tensor::from_vector(nan, {3});
  comm().all_reduce(t, ReduceOp::Max);
  const std::vector<float> got = t.to_vector<float>();
  EXPECT_EQ(got[0], static_cast<float>(P - 1));
  EXPECT_TRUE(std::isnan(got[1])) << "a NaN on one rank is the maximum, as in NCCL";
}

TEST(MpiCommunicator, AllReduceSumAndAverageAreExact) {
  const int P = comm().size(), r = comm().rank();
  for (DType dtype : kFloatTypes) {
    for (std::int64_t n : {std::int64_t{1}, std::int64_t{1037}}) {
      std::vector<double> values(n);
      for (std::int64_t i = 0; i < n; ++i) values[i] = (r + 1) * (i % 7 + 1);
      Tensor t = Tensor::from_vector(values, {n}).to(dtype);
      Tensor a = t.clone();
      comm().all_reduce(t, ReduceOp::Sum);
      comm().all_reduce(a, ReduceOp::Average);
      std::vector<double> sum = t.to_vector<double>(), avg = a.to_vector<double>();
      int wrong = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        const double expected = P * (P + 1) / 2.0 * (i % 7 + 1);
        wrong += sum[i] != expected;
        wrong += avg[i] != expected / P;
      }
      EXPECT_EQ(wrong, 0) << dtype_name(dtype) << " n=" << n;
    }
  }
}

TEST(MpiCommunicator, AllReduceOfALargeTensorCrossesChunks) {
  const int P = comm().size(), r = comm().rank();
  const std::int64_t n = (std::int64_t{1} << 22) + 3;  // more than one 4M-element chunk
  Tensor t = Tensor::full({n}, r + 1.0, DType::F32);
  comm().all_reduce(t, ReduceOp::Sum);
  std::vector<float> v = t.to_vector<float>();
  std::int64_t wrong = 0;
  for (float x : v) wrong += x != P * (P + 1) / 2.0f;
  EXPECT_EQ(wrong, 0);
}

TEST(MpiCommunicator, AllReduceOfIntegers) {
  const int P = comm().size(), r = comm().rank();
  Tensor t = Tensor::from_vector(std::vector<std::int64_t>{r, 10 * r, 1}, {3});
  comm().all_reduce(t, ReduceOp::Sum);
  EXPECT_EQ(t.to_vector<std::int64_t>(),
            (std::vector<std::int64_t>{P * (P - 1) / 2, 10 * P * (P - 1) / 2, P}));
  EXPECT_THROW(comm().all_reduce(t, ReduceOp::Average), Error);
}

TEST(MpiCommunicator, BroadcastFromTheLastRank) {
  const int P = comm().size(), r = comm().rank();
  for (DType dtype : kFloatTypes) {
    Tensor t = Tensor::full({2, 9}, 3.0 + r, dtype);
    comm().broadcast(t, P - 1);
    for (double v : t.to_vector<double>()) ASSERT_EQ(v, 3.0 + (P - 1)) << dtype_name(dtype);
  }
}

TEST(MpiCommunicator, AllGatherPlacesEachRanksBlock) {
  const int P = comm().size(), r = comm().rank();
  for (DType dtype : kFloatTypes) {
    const std::int64_t n = 11;
    std::vector<double> mine(n);
    for (std::int64_t i = 0; i < n; ++i) mine[i] = 20 * r + i;
    Tensor in = Tensor::from_vector(mine, {n}).to(dtype);
    Tensor out = Tensor::full({P * n}, NAN, dtype);
    comm().all_gather(in, out);
    std::vector<double> v = out.to_vector<double>();
    int wrong = 0;
    for (int q = 0; q < P; ++q) {
      for (std::int64_t i = 0; i < n; ++i) wrong += v[q * n + i] != 20 * q + i;
    }
    EXPECT_EQ(wrong, 0) << dtype_name(dtype);
  }
}

TEST(MpiCommunicator, ReduceScatterGivesEachRankItsBlockSum) {
  const int P = comm().size(), r = comm().rank();
  for (DType dtype : kFloatTypes) {
    const std::int64_t n = 5;
    std::vector<double> in_values(P * n);
    for (std::int64_t j = 0; j < P * n; ++j) in_values[j] = (r + 1) * (j % 9 + 1);
    Tensor in = Tensor::from_vector(in_values, {P * n}).to(dtype);
    Tensor out = Tensor::full({n}, NAN, dtype);
    comm().reduce_scatter(in, out, ReduceOp::Sum);
    std::vector<double> v = out.to_vector<double>();
    for (std::int64_t i = 0; i < n; ++i) {
      EXPECT_EQ(v[i], P * (P + 1) / 2.0 * ((r * n + i) % 9 + 1)) << dtype_name(dtype);
    }
  }
}

TEST(MpiCommunicator, RejectsMisuse) {
  Tensor t = Tensor::zeros({4, 4}, DType::F32);
  Tensor strided = t.transpose(0, 1);
  EXPECT_THROW(comm().all_reduce(strided), Error);
  Tensor out = Tensor::zeros({3}, DType::F32);
  EXPECT_THROW(comm().all_gather(t, out), Error);
}

TEST(MakeCommunicator, MpiAndAutoOnTheCpuGiveAWorkingMpiCommunicator) {
  const int P = comm().size();
  for (CommBackend backend : {CommBackend::Auto, CommBackend::Mpi}) {
    CommunicatorOptions options;
    options.timeout_s = 120;
    options.backend = backend;
    std::unique_ptr<Communicator> c = make_communicator(world(), Device::cpu(), options);
    ASSERT_NE(dynamic_cast<MpiCommunicator*>(c.get()), nullptr) << comm_backend_name(backend);
    EXPECT_EQ(c->backend_name(), "mpi");
    EXPECT_TRUE(c->device().is_cpu());
    EXPECT_EQ(c->size(), P);
    Tensor t = Tensor::full({5}, c->rank() + 1, DType::F32);
    c->all_reduce(t, ReduceOp::Sum);
    for (float v : t.to_vector<float>()) EXPECT_EQ(v, P * (P + 1) / 2.0f);
  }
  CommunicatorOptions nccl;
  nccl.backend = CommBackend::Nccl;
  try {
    make_communicator(world(), Device::cpu(), nccl);
    ADD_FAILURE() << "NCCL on the CPU was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.backend"), std::string::npos) << e.what();
  }
}

// kiln doctor's pieces: strings of different lengths gathered by rank, and the all-reduce
// bandwidth with nccl-tests' bus factor and a closed-form check of the sums.
TEST(Doctor, AllGatherStringsIndexesByRank) {
  std::string mine(static_cast<std::size_t>(comm().rank()) * 3, 'x');
  mine += "rank " + std::to_string(comm().rank());
  std::vector<std::string> all = all_gather_strings(world(), mine, 120);
  ASSERT_EQ(static_cast<int>(all.size()), comm().size());
  for (int r = 0; r < comm().size(); ++r) {
    EXPECT_EQ(all[r],
              std::string(static_cast<std::size_t>(r) * 3, 'x') + "rank " + std::to_string(r));
  }
}

TEST(Doctor, BusBandwidthFactorAndSizes) {
  EXPECT_EQ(all_reduce_bus_factor(1), 0.0);
  EXPECT_EQ(all_reduce_bus_factor(2), 1.0);
  EXPECT_EQ(all_reduce_bus_factor(8), 1.75);
  EXPECT_EQ(all_reduce_sizes(1024, 4 << 20),
            (std::vector<std::size_t>{1024, 4096, 16384, 65536, 262144, 1 << 20, 4 << 20}));
  EXPECT_EQ(all_reduce_sizes(1 << 20, 1 << 20), (std::vector<std::size_t>{1 << 20}));
  EXPECT_EQ(all_reduce_sizes(1 << 20, 3 << 20), (std::vector<std::size_t>{1 << 20, 3 << 20}));
}

TEST(Doctor, AllReduceBandwidthIsPositiveAndSumsAreRight) {
  AllReduceBandwidth r = measure_all_reduce(comm(), 64 << 10, 3);
  EXPECT_EQ(r.bytes, std::size_t{64} << 10);
  EXPECT_EQ(r.iterations, 3);
  EXPECT_GT(r.seconds, 0);
  EXPECT_GT(r.algbw_gbs, 0);
  EXPECT_DOUBLE_EQ(r.busbw_gbs, r.algbw_gbs * all_reduce_bus_factor(comm().size()));
  EXPECT_EQ(r.wrong, 0);
}

TEST(HostCollectives, ScalarsAndTheFoundInfFlag) {
  const int P = comm().size(), r = comm().rank();
  EXPECT_EQ(comm().all_reduce_host(r + 0.5, HostReduceOp::Sum), P * (P - 1) / 2.0 + 0.5 * P);
  EXPECT_EQ(comm().all_reduce_host(static_cast<std::int64_t>(r), HostReduceOp::Max), P - 1);
  EXPECT_EQ(comm().all_reduce_host(static_cast<std::int64_t>(r) + 4, HostReduceOp::Min), 4);
  // An inf or NaN on one rank reaches every rank, so all skip the same step.
  double flag = r == P - 1 ? NAN : 0.0;
  EXPECT_TRUE(std::isnan(comm().all_reduce_host(flag, HostReduceOp::Max)));
  std::vector<double> metrics{1.0 * r, 2.0};
  comm().all_reduce_host(metrics, HostReduceOp::Average);
  EXPECT_EQ(metrics[0], (P - 1) / 2.0);
  EXPECT_EQ(metrics[1], 2.0);
}

TEST(HostCollectives, ConfigHashMismatchNamesTheRanks) {
  const int P = comm().size(), r = comm().rank();
  EXPECT_NO_THROW(comm().check_same_on_all_ranks(0xabcdefull, "config hash"));
  try {
    comm().check_same_on_all_ranks(r == P - 1 ? 2 : 1, "config hash");
    FAIL() << "no error for differing hashes";
  } catch (const InputError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("config hash differs between ranks"), std::string::npos) << m;
    EXPECT_NE(m.find("rank " + std::to_string(P - 1) + " has 0x0000000000000002"),
              std::string::npos)
        << m;
  }
}

// DataParallel against a single-process run on the whole global batch.
class DataParallelCpu : public ::testing::TestWithParam<DType> {};

TEST_P(DataParallelCpu, MatchesSingleProcessAndRanksAgreeBitwise) {
  const DType dtype = GetParam();
  DpRun run;
  auto result = testing::data_parallel_run(comm(), 7, dtype, run);
  auto reference =
      testing::reference_run(7, Device::cpu(), dtype, run.steps, run.global_batch, run.lr);
  EXPECT_TRUE(testing::bitwise_equal_on_all_ranks(comm(), result.values));
  // f32 sums in a different order than the single process; f64 leaves no room at all.
  EXPECT_LT(testing::max_relative_difference(result.values, reference), 1e-6);
  // The parameters moved: the comparison is not of two untouched initialisations.
  auto initial = testing::reference_run(7, Device::cpu(), dtype, 0, run.global_batch, run.lr);
  EXPECT_GT(testing::max_relative_difference(initial, reference), 1e-3);
  EXPECT_EQ(result.bucket_all_reduces, run.steps * result.buckets);
}

TEST_P(DataParallelCpu, GradientAccumulationReducesOncePerStep) {
  const DType dtype = GetParam();
  DpRun run;
  run.micro_steps = 2;
  auto result = testing::data_parallel_run(comm(), 7, dtype, run);
  auto reference =
      testing::reference_run(7, Device::cpu(), dtype, run.steps, run.global_batch, run.lr);
  EXPECT_TRUE(testing::bitwise_equal_on_all_ranks(comm(), result.values));
  EXPECT_LT(testing::max_relative_difference(result.values, reference), 1e-6);
  EXPECT_EQ(result.bucket_all_reduces, run.steps * result.buckets);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, DataParallelCpu, ::testing::Values(DType::F64, DType::F32),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// Each gradient reduction strategy on its own (comm/gradient_reduction.h), against closed forms:
// rank r's bucket holds (r + 1) * (i % 5 + 1), whose average over P ranks is (P + 1) / 2 * (i % 5 +
// 1) (exact in f32 and bf16 for these values).
std::vector<double> bucket_values(std::int64_t n, int rank) {
  std::vector<double> v(n);
  for (std::int64_t i = 0; i < n; ++i) v[i] = (rank + 1) * (i % 5 + 1);
  return v;
}

double bucket_average(std::int64_t i, int ranks) {
  return (ranks + 1) / 2.0 * (i % 5 + 1);
}

std::unique_ptr<GradientReduction> reduction(GradientReductionOptions::Kind kind) {
  GradientReductionOptions o;
  o.kind = kind;
  o.half_dtype = DType::BF16;
  o.powersgd.rank = 1;
  o.powersgd_start_step = 2;
  return make_gradient_reduction(o, comm());
}

TEST(GradientReduction, AllReduceAndHalfAllReduceAverage) {
  using Kind = GradientReductionOptions::Kind;
  const int P = comm().size(), r = comm().rank();
  const std::int64_t n = 37;
  for (Kind kind : {Kind::AllReduce, Kind::HalfAllReduce}) {
    auto strategy = reduction(kind);
    EXPECT_FALSE(strategy->scatters());
    Tensor f32 = Tensor::from_vector(bucket_values(n, r), {n}).to(DType::F32);
    Tensor f64 = Tensor::from_vector(bucket_values(n, r), {n});
    Tensor unused;
    strategy->add_bucket(0, DType::F32, n, {f32});
    strategy->add_bucket(1, DType::F64, n, {f64});
    strategy->reduce(0, f32, unused, 0);
    strategy->reduce(1, f64, unused, 0);
    const std::vector<double> a = f32.to_vector<double>(), b = f64.to_vector<double>();
    for (std::int64_t i = 0; i < n; ++i) {
      EXPECT_EQ(a[i], bucket_average(i, P)) << i;
      EXPECT_EQ(b[i], bucket_average(i, P)) << i;
    }
    EXPECT_TRUE(strategy->state().empty());
  }
  // Half rounds what travels: a value bf16 cannot hold comes back rounded to it (f32 kept as is).
  auto half = reduction(Kind::HalfAllReduce);
  auto plain = reduction(Kind::AllReduce);
  Tensor x = Tensor::from_vector(std::vector<double>{1.0 + 1.0 / 1024}, {1}).to(DType::F32);
  Tensor y = x.clone(), unused;
  half->add_bucket(0, DType::F32, 1, {x});
  half->reduce(0, x, unused, 0);
  plain->reduce(0, y, unused, 0);
  EXPECT_EQ(x.to_vector<double>()[0], 1.0);
  EXPECT_EQ(y.to_vector<double>()[0], 1.0 + 1.0 / 1024);
}

TEST(GradientReduction, ReduceScatterLeavesEachRankItsShardOfTheAverage) {
  const int P = comm().size(), r = comm().rank();
  const std::int64_t shard = 6, n = shard * P;
  auto strategy = reduction(GradientReductionOptions::Kind::ReduceScatter);
  EXPECT_TRUE(strategy->scatters());
  Tensor flat = Tensor::from_vector(bucket_values(n, r), {n}).to(DType::F32);
  Tensor mine = Tensor::zeros({shard}, DType::F32);
  strategy->add_bucket(0, DType::F32, n, {flat});
  strategy->reduce(0, flat, mine, 0);
  const std::vector<double> got = mine.to_vector<double>();
  for (std::int64_t i = 0; i < shard; ++i) EXPECT_EQ(got[i], bucket_average(r * shard + i, P)) << i;
}

TEST(GradientReduction, PowerSgdStartsAtItsStepAndKeepsItsState) {
  const int P = comm().size(), r = comm().rank();
  const std::int64_t rows = 8, cols = 6;
  auto strategy = reduction(GradientReductionOptions::Kind::PowerSgd);
  // A rank-1 gradient, the same direction on every rank: rank-1 PowerSGD reduces it exactly.
  std::vector<double> base(rows * cols);
  for (std::int64_t i = 0; i < rows * cols; ++i) base[i] = (i / cols + 1) * (i % cols + 1);
  const auto scaled = [&](int rank) {
    std::vector<double> v = base;
    for (double& x : v) x *= rank + 1;
    return v;
  };
  Tensor grad = Tensor::from_vector(scaled(r), {rows, cols});
  Tensor flat = grad.view({rows * cols}), unused;
  strategy->add_bucket(0, DType::F64, rows * cols, {grad});
  const NamedTensors state = strategy->state();
  ASSERT_EQ(state.size(), 2u);
  EXPECT_EQ(state[0].first, "bucket0.error");
  EXPECT_EQ(state[1].first, "bucket0.q");
  // Before the start step: the plain all-reduce, exact.
  strategy->reduce(0, flat, unused, 1);
  std::vector<double> got = grad.to_vector<double>();
  for (std::int64_t i = 0; i < rows * cols; ++i) EXPECT_EQ(got[i], base[i] * (P + 1) / 2.0) << i;
  // From it on: compressed, still the average up to rounding.
  grad.copy_from(Tensor::from_vector(scaled(r), {rows, cols}));
  strategy->reduce(0, flat, unused, 2);
  got = grad.to_vector<double>();
  for (std::int64_t i = 0; i < rows * cols; ++i) {
    EXPECT_NEAR(got[i], base[i] * (P + 1) / 2.0, 1e-9 * base[i] * P) << i;
  }
  // Its state travels through checkpoints by name; a checkpoint without it is refused.
  strategy->load_state(strategy->state(), "here");
  try {
    strategy->load_state({}, "ckpt/compression.safetensors");
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("ckpt/compression.safetensors: no PowerSGD state "
                                         "bucket0."),
              std::string::npos)
        << e.what();
  }
}

TEST(DataParallel, BucketSizesGiveIdenticalResults) {
  DpRun one_bucket;  // 25 MiB: the whole model in one bucket
  DpRun per_parameter;
  per_parameter.options.bucket_bytes = 1;  // every parameter alone
  DpRun medium;
  medium.options.bucket_bytes = 1024;  // fc2.bias, fc2.weight, fc1.bias | fc1.weight
  auto a = testing::data_parallel_run(comm(), 3, DType::F32, one_bucket);
  auto b = testing::data_parallel_run(comm(), 3, DType::F32, per_parameter);
  auto c = testing::data_parallel_run(comm(), 3, DType::F32, medium);
  EXPECT_EQ(a.buckets, 1u);
  EXPECT_EQ(b.buckets, 4u);
  EXPECT_GT(c.buckets, 1u);
  EXPECT_LT(c.buckets, 4u);
  EXPECT_EQ(a.values, b.values);
  EXPECT_EQ(a.values, c.values);
}

TEST(DataParallel, SmallFirstBucketClosesEarly) {
  auto model = testing::make_tiny_model(5, Device::cpu(), DType::F32);
  DataParallelOptions options;  // 25 MiB buckets: the whole model fits one
  options.first_bucket_bytes = 1;
  DataParallel dp(model->parameters(), model->buffers(), comm(), options);
  auto layout = dp.bucket_layout();
  ASSERT_EQ(layout.size(), 2u);  // the first parameter alone, then all the others
  EXPECT_EQ(layout[0].parameter_names, std::vector<std::string>{"fc2.bias"});
  EXPECT_EQ(layout[1].parameter_names.size(), model->parameters().size() - 1);
  DpRun small_first;
  small_first.options.first_bucket_bytes = 1;
  EXPECT_EQ(testing::data_parallel_run(comm(), 3, DType::F32, small_first).values,
            testing::data_parallel_run(comm(), 3, DType::F32, DpRun{}).values);
}

TEST(DataParallel, TimingFollowsEachBucket) {
  auto model = testing::make_tiny_model(6, Device::cpu(), DType::F32);
  DataParallelOptions options;
  options.bucket_bytes = 1;
  DataParallel dp(model->parameters(), model->buffers(), comm(), options);
  dp.set_timing(true);
  EXPECT_THROW(dp.step_timing(nullptr, std::chrono::steady_clock::now()), Error);
  const auto t0 = std::chrono::steady_clock::now();
  auto hook = dp.grad_ready_hook();
  dp.zero_grad();
  auto params = model->parameters();
  for (auto it = params.rbegin(); it != params.rend(); ++it) {  // backward's order
    (*it)->grad.fill(1.0 + comm().rank());
    hook(**it);
  }
  dp.finish();
  CommStepTiming t = dp.step_timing(nullptr, t0);
  ASSERT_EQ(t.buckets.size(), dp.bucket_count());
  double previous_end = 0;
  for (const BucketTiming& b : t.buckets) {
    EXPECT_GE(b.ready_ms, 0);
    EXPECT_GE(b.start_ms, b.ready_ms);
    EXPECT_GE(b.end_ms, b.start_ms);
    EXPECT_GE(b.start_ms, previous_end);  // in bucket order, one after the other
    previous_end = b.end_ms;
  }
  // Every bucket was reduced during "backward" (the hooks), before finish() was called.
  EXPECT_GE(t.backward_end_ms, previous_end);
  EXPECT_GE(t.reduced_ms, t.backward_end_ms);
  EXPECT_GE(t.exposed_ms, t.reduced_ms - t.backward_end_ms);
  const float mean = (1.0f + static_cast<float>(comm().size())) / 2;  // of 1, 2, ..., size
  for (Parameter* p : params) EXPECT_EQ(p->grad.to_vector<float>()[0], mean);
}

TEST(DataParallel, UnusedParametersAndMissingHooksDoNotHang) {
  DpRun unused;
  unused.with_unused = true;
  unused.options.bucket_bytes = 1;
  auto a = testing::data_parallel_run(comm(), 5, DType::F64, unused);
  DpRun no_hook;
  no_hook.install_hook = false;  // finish() reduces every bucket
  auto b = testing::data_parallel_run(comm(), 5, DType::F64, no_hook);
  auto reference = testing::reference_run(5, Device::cpu(), DType::F64, unused.steps,
                                          unused.global_batch, unused.lr);
  ASSERT_EQ(a.values.size(), reference.size() + 3 * testing::kOut + 3);
  std::vector<double> used(a.values.begin(), a.values.begin() + reference.size());
  EXPECT_LT(testing::max_relative_difference(used, reference), 1e-6);
  EXPECT_LT(testing::max_relative_difference(b.values, reference), 1e-6);
  EXPECT_TRUE(testing::bitwise_equal_on_all_ranks(comm(), a.values));
}

TEST(DataParallel, HalfPrecisionReductionStaysClose) {
  DpRun run;
  run.options.compression = GradientCompression::Half;
  run.options.half_dtype = DType::BF16;
  auto result = testing::data_parallel_run(comm(), 7, DType::F32, run);
  auto reference =
      testing::reference_run(7, Device::cpu(), DType::F32, run.steps, run.global_batch, run.lr);
  EXPECT_TRUE(testing::bitwise_equal_on_all_ranks(comm(), result.values));
  const double diff = testing::max_relative_difference(result.values, reference);
  EXPECT_LT(diff, 2e-2);
}

TEST(DataParallel, GradientsAreViewsOfBucketsAndBuffersBroadcast) {
  const int r = comm().rank();
  auto model = testing::make_tiny_model(11 + r, Device::cpu(), DType::F32);
  for (Buffer* b : model->buffers()) b->value.fill(r + 1.0);
  DataParallelOptions options;
  options.bucket_bytes = 1;
  DataParallel dp(model->parameters(), model->buffers(), comm(), options);
  // Reverse registration order: the last parameter (fc2.bias) leads the first bucket.
  auto layout = dp.bucket_layout();
  ASSERT_EQ(layout.size(), 4u);
  EXPECT_EQ(layout[0].parameter_names, std::vector<std::string>{"fc2.bias"});
  EXPECT_EQ(layout[3].parameter_names, std::vector<std::string>{"fc1.weight"});
  for (Buffer* b : model->buffers()) EXPECT_EQ(b->value.item(), 1.0);  // rank 0's
  // Buffers broadcast on request.
  for (Buffer* b : model->buffers()) b->value.fill(5.0 + r);
  dp.broadcast_buffers();
  for (Buffer* b : model->buffers()) EXPECT_EQ(b->value.item(), 5.0);
  // zero_grad clears the views through the flat buffers.
  for (Parameter* p : model->parameters()) p->grad.fill(3.0);
  dp.zero_grad();
  for (Parameter* p : model->parameters()) {
    for (float v : p->grad.to_vector<float>()) ASSERT_EQ(v, 0.0f) << p->name;
  }
  // Replacing a gradient behind DataParallel's back is caught.
  Parameter* first = model->parameters()[0];
  first->grad = Tensor::zeros(first->value.shape(), DType::F32);
  EXPECT_THROW(dp.grad_ready_hook()(*first), Error);
  dp.finish();
}

// ZeRO: every parameter element is in exactly one rank's shard (uneven splits included), the
// shards receive the average over ranks, and gather_parameters() gives every rank the pieces
// every other rank updated.
class DataParallelZero : public ::testing::TestWithParam<int> {};

TEST_P(DataParallelZero, ShardsPartitionTheModelAverageAndGather) {
  const int r = comm().rank(), n = comm().size();
  auto model = testing::make_tiny_model(11, Device::cpu(), DType::F32);
  DataParallelOptions options;
  options.bucket_bytes = 1024;  // several buckets whose sizes do not divide by 2 or 3
  options.zero_stage = GetParam();
  DataParallel dp(model->parameters(), model->buffers(), comm(), options);
  const std::vector<Parameter*> params = model->parameters();
  std::vector<double> covered(params.size(), 0.0);
  for (const ShardPiece& piece : dp.shard_pieces()) {
    const auto at = std::find(params.begin(), params.end(), piece.parameter) - params.begin();
    ASSERT_LT(static_cast<std::size_t>(at), params.size());
    ASSERT_EQ(covered[at], 0.0) << "two pieces of " << piece.parameter->name << " on one rank";
    covered[at] = static_cast<double>(piece.numel);
    EXPECT_GE(piece.offset, 0);
    EXPECT_LE(piece.offset + piece.numel, piece.parameter->value.numel());
  }
  comm().all_reduce_host(covered, HostReduceOp::Sum);
  for (std::size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(covered[i], static_cast<double>(params[i]->value.numel())) << params[i]->name;
  }

  // Rank k's gradients are all k + 1: each shard receives the average (n + 1) / 2, exactly.
  const std::size_t full_bytes = dp.gradient_buffer_bytes();
  dp.zero_grad();
  for (Parameter* p : params) p->grad.fill(r + 1.0);
  dp.finish();  // no hook installed: every bucket is reduce-scattered here
  for (const ShardPiece& piece : dp.shard_pieces()) {
    for (float v : piece.grad.to_vector<float>()) ASSERT_EQ(v, (n + 1) / 2.0f);
  }
  if (GetParam() == 2) {  // the full buffers are gone until the next zero_grad()
    for (Parameter* p : params) EXPECT_FALSE(p->grad.defined()) << p->name;
    EXPECT_LT(dp.gradient_buffer_bytes(), full_bytes);
  }
  dp.zero_grad();
  for (Parameter* p : params) {
    ASSERT_TRUE(p->grad.defined());
    for (float v : p->grad.to_vector<float>()) ASSERT_EQ(v, 0.0f);
  }

  // Each rank writes 10 + rank into its pieces; after the gather all ranks hold the same model,
  // every element from its owner.
  for (const ShardPiece& piece : dp.shard_pieces()) {
    piece.parameter->value.view({piece.parameter->value.numel()})
        .slice(0, piece.offset, piece.offset + piece.numel)
        .fill(10.0 + r);
  }
  dp.gather_parameters();
  std::vector<double> all;
  for (Parameter* p : params) {
    for (float v : p->value.to_vector<float>()) {
      ASSERT_TRUE(v >= 10.0f && v < 10.0f + n && v == std::floor(v)) << p->name << " " << v;
      all.push_back(v);
    }
  }
  EXPECT_TRUE(testing::bitwise_equal_on_all_ranks(comm(), all));
  for (const ShardPiece& piece : dp.shard_pieces()) {
    auto mine = piece.parameter->value.view({piece.parameter->value.numel()})
                    .slice(0, piece.offset, piece.offset + piece.numel)
                    .to_vector<float>();
    for (float v : mine) ASSERT_EQ(v, 10.0f + r);
  }
}

// Step `step` of a 12-sample global batch: this rank's slice forward and backward (MSE loss).
void forward_backward_on_this_rank(Layer& model, Context& ctx, int step) {
  const std::int64_t shard = 12 / comm().size();
  Tensor x, t;
  testing::global_batch(static_cast<std::uint64_t>(step), 12, Device::cpu(), DType::F32, x, t);
  const std::int64_t begin = comm().rank() * shard;
  Tensor xm = x.slice(0, begin, begin + shard).contiguous();
  Tensor tm = t.slice(0, begin, begin + shard).contiguous();
  Tensor y = model.forward(ctx, xm);
  model.backward(ctx, testing::mse_grad(y, tm, shard));
}

// ZeRO-2 without the full gradients at the start of backward: buckets are allocated as the
// backward of a layer that writes them begins, and (MPI's collectives block) released as soon as
// they are reduce-scattered; the training is bit for bit stage 1's.
TEST(DataParallel, ZeroStage2AllocatesBucketsAsBackwardReachesThem) {
  auto train = [](int stage, std::size_t* first_bytes, std::size_t* most_bytes,
                  std::size_t* shard_bytes, std::size_t* full_bytes) {
    auto model = testing::make_tiny_model(5, Device::cpu(), DType::F32);
    DataParallelOptions options;
    options.bucket_bytes = 64;  // a bucket per parameter: the second layer's go before the first's
    options.zero_stage = stage;
    DataParallel dp(model->parameters(), model->buffers(), comm(), options);
    if (full_bytes != nullptr) *full_bytes = dp.gradient_buffer_bytes();
    Context ctx;
    ctx.on_grad_ready = dp.grad_ready_hook();
    std::size_t seen = 0, most = 0, first = 0;
    auto allocate = dp.gradient_allocation_hook();
    ctx.observers.push_back([&](Layer& layer, bool forward, bool begin) {
      if (!forward && begin) {
        if (seen++ == 0) first = dp.gradient_buffer_bytes();
        if (allocate) allocate(layer.written_parameters());
        most = std::max(most, dp.gradient_buffer_bytes());
      }
    });
    auto params = model->parameters();
    std::vector<double> after;
    for (int step = 0; step < 3; ++step) {
      dp.zero_grad_lazily();
      seen = most = 0;
      forward_backward_on_this_rank(*model, ctx, step);
      dp.finish();
      if (shard_bytes != nullptr) *shard_bytes = dp.gradient_buffer_bytes();
      // The update on the reduced shards, then every rank's pieces to every rank.
      for (const ShardPiece& piece : dp.shard_pieces()) {
        Tensor v = piece.parameter->value.view({piece.parameter->value.numel()})
                       .slice(0, piece.offset, piece.offset + piece.numel);
        ops::axpy(-0.05, piece.grad, v);
      }
      dp.gather_parameters();
    }
    if (first_bytes != nullptr) *first_bytes = first;
    if (most_bytes != nullptr) *most_bytes = most;
    return testing::parameter_values(*model);
  };
  const std::vector<double> stage1 = train(1, nullptr, nullptr, nullptr, nullptr);
  std::size_t first = 0, most = 0, shards = 0, full = 0;
  const std::vector<double> stage2 = train(2, &first, &most, &shards, &full);
  EXPECT_EQ(stage1, stage2);
  EXPECT_EQ(first, shards) << "full buckets held when backward began";
  EXPECT_LT(most - shards, full - shards) << "every full bucket held at once during backward";
}

// ZeRO-2 accumulating in the shards: each micro-step reduces its buckets (twice the reductions
// for two micro-steps) and gives its full buffers back before the next, and the update is the
// whole buffers' within rounding (the sums are added in another order).
TEST(DataParallel, ZeroAccumulationInShardsReducesEachMicroStep) {
  auto train = [](bool in_shards, std::size_t* held_between, std::uint64_t* reductions) {
    auto model = testing::make_tiny_model(5, Device::cpu(), DType::F32);
    DataParallelOptions options;
    options.bucket_bytes = 64;
    options.zero_stage = 2;
    options.accumulate_in_shards = in_shards;
    DataParallel dp(model->parameters(), model->buffers(), comm(), options);
    Context ctx;
    ctx.on_grad_ready = dp.grad_ready_hook();
    auto allocate = dp.gradient_allocation_hook();
    ctx.observers.push_back([&](Layer& layer, bool forward, bool begin) {
      if (!forward && begin && allocate) allocate(layer.written_parameters());
    });
    for (int step = 0; step < 3; ++step) {
      dp.zero_grad_lazily();
      for (int micro = 0; micro < 2; ++micro) {
        dp.set_accumulation_micro_step(micro == 0);
        forward_backward_on_this_rank(*model, ctx, 2 * step + micro);
        if (micro == 0) {
          dp.end_micro_step();
          *held_between = dp.gradient_buffer_bytes();
        }
      }
      dp.finish();
      for (const ShardPiece& piece : dp.shard_pieces()) {
        Tensor v = piece.parameter->value.view({piece.parameter->value.numel()})
                       .slice(0, piece.offset, piece.offset + piece.numel);
        ops::axpy(-0.05, piece.grad, v);
      }
      dp.gather_parameters();
    }
    *reductions = dp.bucket_all_reduces();
    return testing::parameter_values(*model);
  };
  std::size_t whole_held = 0, shards_held = 0;
  std::uint64_t whole_reductions = 0, shard_reductions = 0;
  const std::vector<double> whole = train(false, &whole_held, &whole_reductions);
  const std::vector<double> in_shards = train(true, &shards_held, &shard_reductions);
  EXPECT_EQ(shard_reductions, 2 * whole_reductions);
  EXPECT_LT(shards_held, whole_held) << "full buffers kept between micro-steps";
  ASSERT_EQ(whole.size(), in_shards.size());
  for (std::size_t i = 0; i < whole.size(); ++i) {
    EXPECT_NEAR(in_shards[i], whole[i], 1e-6 * std::max(1.0, std::abs(whole[i]))) << i;
  }
}

// ZeRO-3: between uses a rank holds only its shard of the weights (Parameter::value has its shape
// but no memory); acquire_values() gathers whole buckets, every element from its owner's shard,
// and release_values(written) keeps what was written; per-layer gathering trains bit for bit as
// stage 1 does, and the buckets follow the units.
TEST(DataParallel, ZeroStage3ShardsTheWeightsAndGathersThemPerUnit) {
  const int r = comm().rank(), n = comm().size();
  auto model = testing::make_tiny_model(11, Device::cpu(), DType::F32);
  const std::vector<double> initial = testing::parameter_values(*model);
  const std::vector<Parameter*> params = model->parameters();
  std::size_t whole_bytes = 0;
  for (Parameter* p : params) whole_bytes += p->value.nbytes();
  DataParallelOptions options;
  options.zero_stage = 3;
  // fc2's parameters (registered last, laid out first) one unit, fc1's another: two buckets
  // under a bucket size that would take all four.
  options.units = {{params[0], params[1]}, {params[2], params[3]}};
  DataParallel dp(params, model->buffers(), comm(), options);
  EXPECT_EQ(dp.bucket_count(), 2u);
  for (Parameter* p : params) EXPECT_EQ(p->value.data(), nullptr) << p->name;
  std::size_t shard_bytes = 0;
  for (const GradientBucketInfo& b : dp.bucket_layout())
    shard_bytes += static_cast<std::size_t>(b.numel / n) * sizeof(float);
  EXPECT_EQ(dp.value_buffer_bytes(), shard_bytes);
  if (n > 1) {
    EXPECT_LT(shard_bytes, whole_bytes);
  }

  dp.acquire_values({params[2]});  // fc2's bucket only
  EXPECT_EQ(params[0]->value.data(), nullptr);
  ASSERT_NE(params[3]->value.data(), nullptr);
  dp.acquire_values(params);  // fc2's is held twice now
  EXPECT_EQ(testing::parameter_values(*model), initial);
  dp.release_values(params);
  EXPECT_EQ(params[0]->value.data(), nullptr);
  ASSERT_NE(params[2]->value.data(), nullptr) << "released while still held";
  dp.release_values({params[2]});
  EXPECT_EQ(params[2]->value.data(), nullptr);

  // Each rank writes 10 + rank into its pieces' shards; a gather gives every rank every owner's.
  for (const ShardPiece& piece : dp.shard_pieces()) {
    ASSERT_TRUE(piece.value.defined());
    Tensor mine = piece.value;
    mine.fill(10.0 + r);
  }
  dp.acquire_values(params);
  std::vector<double> all = testing::parameter_values(*model);
  for (double v : all) ASSERT_TRUE(v >= 10.0 && v < 10.0 + n && v == std::floor(v)) << v;
  EXPECT_TRUE(testing::bitwise_equal_on_all_ranks(comm(), all));
  // Written while whole (a checkpoint loaded): kept as the shards.
  for (Parameter* p : params) p->value.fill(3.0);
  dp.release_values(params, /*written=*/true);
  for (const ShardPiece& piece : dp.shard_pieces()) {
    for (float v : piece.value.to_vector<float>()) ASSERT_EQ(v, 3.0f);
  }

  // Training: each layer gathers its weights for its forward and its backward.
  auto train = [](int stage) {
    auto m = testing::make_tiny_model(5, Device::cpu(), DType::F32);
    DataParallelOptions o;
    o.bucket_bytes = 64;
    o.zero_stage = stage;
    DataParallel dp(m->parameters(), m->buffers(), comm(), o);
    const std::size_t shards = dp.value_buffer_bytes();
    Context ctx;
    ctx.on_grad_ready = dp.grad_ready_hook();
    auto allocate = dp.gradient_allocation_hook();
    ctx.observers.push_back([&](Layer& layer, bool forward, bool begin) {
      if (!layer.children().empty()) return;
      if (begin) {
        dp.acquire_values(layer.parameters());
        // Every other bucket prefetched: the later acquires take them, finish() drops the rest.
        dp.prefetch_values(m->parameters());
        if (!forward && allocate) allocate(layer.written_parameters());
      } else {
        dp.release_values(layer.parameters());
      }
    });
    for (int step = 0; step < 3; ++step) {
      dp.zero_grad_lazily();
      forward_backward_on_this_rank(*m, ctx, step);
      dp.finish();
      if (stage == 3) {
        EXPECT_EQ(dp.value_buffer_bytes(), shards) << "prefetched weights left";
      }
      for (const ShardPiece& piece : dp.shard_pieces()) {
        Tensor v = piece.value.defined()
                       ? Tensor(piece.value)
                       : piece.parameter->value.view({piece.parameter->value.numel()})
                             .slice(0, piece.offset, piece.offset + piece.numel);
        ops::axpy(-0.05, piece.grad, v);
      }
      dp.gather_parameters();
    }
    dp.acquire_values(m->parameters());
    std::vector<double> out = testing::parameter_values(*m);
    dp.release_values(m->parameters());
    return out;
  };
  EXPECT_EQ(train(1), train(3));
}

INSTANTIATE_TEST_SUITE_P(Stages, DataParallelZero, ::testing::Values(1, 2),
                         [](const auto& info) { return "stage" + std::to_string(info.param); });

}  // namespace
}  // namespace kiln

// Failures on ranks other than 0, whose progress printer is removed.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (result.failed()) {
      std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_,
                   result.file_name() ? result.file_name() : "?", result.line_number(),
                   result.summary());
    }
  }

 private:
  int rank_;
};

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const kiln::World& w = kiln::init_world(&argc, &argv);
  if (w.rank != 0) {
    // Only rank 0 prints progress; a failure on another rank still fails the job's exit code.
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(w.rank));
  }
  int status = RUN_ALL_TESTS();
  const bool all_passed =
      kiln::comm().all_reduce_host(static_cast<std::int64_t>(status), kiln::HostReduceOp::Max) == 0;
  if (w.rank == 0 && !all_passed) std::fprintf(stderr, "a test failed on some rank\n");
  kiln::finalize_world();
  return status;
}
