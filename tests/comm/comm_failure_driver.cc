// Driver for the process-level failure tests (run by run_failure_test.sh under mpirun):
//   comm_failure_driver kill <timeout_s>   rank 1 dies (SIGKILL) between collectives
//   comm_failure_driver hang <timeout_s>   rank 1 stops (SIGSTOP): the others' watchdog fires
// Every other rank keeps calling all_reduce; the job must end non-zero within a bounded time.

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "comm/mpi_communicator.h"
#include "comm/world.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s kill|hang <timeout_s>\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  try {
    const kiln::World& world = kiln::init_world(&argc, &argv);
    kiln::CommunicatorOptions options;
    options.timeout_s = std::atof(argv[2]);
    kiln::MpiCommunicator comm(world, options);
    kiln::Tensor t = kiln::Tensor::full({1024}, 1.0, kiln::DType::F32);
    for (int i = 0; i < 1000000; ++i) {
      if (i == 5 && world.rank == 1) {
        std::fprintf(stderr, "rank 1: %s now\n", mode == "kill" ? "dying" : "stopping");
        std::raise(mode == "kill" ? SIGKILL : SIGSTOP);
      }
      comm.all_reduce(t, kiln::ReduceOp::Average);
    }
    kiln::finalize_world();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "the job was expected to fail\n");
  return 0;
}
