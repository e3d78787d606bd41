// The CUDA PowerSGD against the CPU one on random inputs (label gpu; one rank, one GPU): the
// orthonormalisation kernel (tall matrices, a zero column, f32 and f64) and a whole bucket's
// compressed all-reduce over a one-rank NCCL communicator against a one-rank MPI one.

#include <gtest/gtest.h>

#include <cstdio>
#include <memory>

#include "comm/mpi_communicator.h"
#include "comm/nccl_communicator.h"
#include "comm/powersgd.h"
#include "comm/world.h"
#include "core/ops.h"
#include "core/stream.h"
#include "tests/gpu_test_util.h"

namespace kiln {
namespace {

Tensor random_tensor(const Shape& shape, DType dtype, std::uint64_t seed) {
  Tensor t = Tensor::empty(shape, dtype);
  ops::fill_normal(t, 0.0, 1.0, seed);
  return t;
}

TEST(PowerSgdGpu, OrthogonalizeColumnsMatchesTheCpu) {
  const std::uint64_t seed = testing::fresh_seed();
  for (DType dtype : {DType::F32, DType::F64}) {
    for (std::int64_t rows : {1, 7, 256, 1000, 50257}) {
      for (std::int64_t cols : {1, 4, 8}) {
        Tensor cpu = random_tensor({rows, cols}, dtype, seed + rows * 10 + cols);
        if (cols > 2) {
          for (std::int64_t k = 0; k < rows; ++k) cpu.slice(0, k, k + 1).slice(1, 1, 2).fill(0.0);
        }
        Tensor gpu = cpu.to(testing::kGpu);
        orthogonalize_columns(cpu);
        orthogonalize_columns(gpu);
        device_synchronize(testing::kGpu);
        testing::expect_close(gpu, cpu, dtype,
                              std::string("orthogonalize ") + dtype_name(dtype) + " " +
                                  std::to_string(rows) + "x" + std::to_string(cols),
                              64.0, "powersgd_");
      }
    }
  }
}

TEST(PowerSgdGpu, BucketAllReduceMatchesTheCpu) {
  const World& w = world();
  MpiCommunicator cpu_comm(w);
  NcclCommunicator gpu_comm(w, testing::kGpu);
  const std::uint64_t seed = testing::fresh_seed();
  const std::vector<Shape> shapes = {{64, 3, 3, 3}, {64}, {512, 256}, {10, 512}, {10}};
  std::vector<Tensor> cpu_grads, gpu_grads;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    cpu_grads.push_back(random_tensor(shapes[i], DType::F32, seed + i));
    gpu_grads.push_back(cpu_grads.back().to(testing::kGpu));
  }
  PowerSgdOptions options;
  options.rank = 4;
  options.seed = 11;
  PowerSgdBucket cpu_bucket(cpu_grads, options);
  PowerSgdBucket gpu_bucket(gpu_grads, options);
  for (int step = 0; step < 3; ++step) {  // the later steps use the error and the warm Q
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      Tensor next = random_tensor(shapes[i], DType::F32, seed + 100 * (step + 1) + i);
      cpu_grads[i].copy_from(next);
      gpu_grads[i].copy_from(next);
    }
    cpu_bucket.all_reduce(cpu_comm);
    {
      StreamGuard guard(testing::kGpu, gpu_comm.comm_stream());
      gpu_bucket.all_reduce(gpu_comm);
    }
    gpu_comm.synchronize();
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      testing::expect_close(gpu_grads[i], cpu_grads[i], DType::F32,
                            "step " + std::to_string(step) + " gradient " + std::to_string(i),
                            256.0, "powersgd_");
    }
    testing::expect_close(gpu_bucket.state()[0].second, cpu_bucket.state()[0].second, DType::F32,
                          "step " + std::to_string(step) + " error", 256.0, "powersgd_");
  }
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  kiln::init_world(&argc, &argv);
  int status = RUN_ALL_TESTS();
  kiln::finalize_world();
  return status;
}
