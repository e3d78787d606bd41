// One process without mpirun (label cpu): MPI starts as a singleton, the world has one rank, and
// the communicator and DataParallel work (collectives are the identity).

#include <gtest/gtest.h>

#include "comm/mpi_communicator.h"
#include "comm/world.h"
#include "tests/comm/dp_training.h"

namespace kiln {
namespace {

TEST(Singleton, WorldOfOneRank) {
  const World& w = init_world();
  EXPECT_EQ(w.size, 1);
  EXPECT_EQ(w.rank, 0);
  EXPECT_EQ(w.local_size, 1);
  MpiCommunicator comm(w);
  Tensor t = Tensor::full({5}, 2.5, DType::BF16);
  comm.all_reduce(t, ReduceOp::Average);
  for (double v : t.to_vector<double>()) EXPECT_EQ(v, 2.5);
  Tensor gathered = Tensor::full({5}, NAN, DType::BF16);
  comm.all_gather(t, gathered);
  for (double v : gathered.to_vector<double>()) EXPECT_EQ(v, 2.5);
  EXPECT_EQ(comm.all_reduce_host(3.0, HostReduceOp::Sum), 3.0);
  comm.barrier();

  testing::DpRun run;
  run.micro_steps = 2;
  auto result = testing::data_parallel_run(comm, 7, DType::F64, run);
  auto reference =
      testing::reference_run(7, Device::cpu(), DType::F64, run.steps, run.global_batch, run.lr);
  EXPECT_LT(testing::max_relative_difference(result.values, reference), 1e-12);
  finalize_world();
}

}  // namespace
}  // namespace kiln
