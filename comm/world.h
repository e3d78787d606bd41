#pragma once
// The world of ranks this process belongs to: MPI rank and size, and the local rank among the
// ranks of this host (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)), which picks the GPU. Without
// mpirun MPI_Init starts a singleton and the world has one rank.

#include <string>
#include <vector>

#include "core/device.h"

namespace kiln {

struct World {
  int rank = 0;
  int size = 1;
  int local_rank = 0;  // among the ranks on this host
  int local_size = 1;
  std::string host;
  // Started by a launcher (mpirun, srun, a PMI): read from the environment before MPI_Init, since
  // the singleton MPI_Init of a plain `kiln` sets the same OMPI_* variables mpirun does.
  bool under_launcher = false;
};

// Initialises MPI (unless the program already did; thread level FUNNELED), sets
// MPI_ERRORS_RETURN on MPI_COMM_WORLD, discovers the world and calls set_process_identity() so
// every error message names the rank. Idempotent. MPI_Init runs under a watchdog: if it has not
// returned in `init_timeout_s` the process exits with a message instead of hanging.
const World& init_world(int* argc = nullptr, char*** argv = nullptr, double init_timeout_s = 120);
// The world after init_world(); calling it before is a usage error.
const World& world();
// MPI_Finalize if init_world() initialised MPI. Call after every communicator is destroyed.
void finalize_world();

// Every rank's `mine`, indexed by rank (MPI_Allgatherv over MPI_COMM_WORLD), for reports that one
// rank prints about all. Collective; watched: a rank that does not arrive within `timeout_s` ends
// the process with a message.
std::vector<std::string> all_gather_strings(const World& world, const std::string& mine,
                                            double timeout_s);

// The CUDA device of this rank: local_rank, made current with cudaSetDevice. Throws
// InputError when the host has more local ranks than visible GPUs.
Device select_local_device(const World& world);
// The check behind it: "3 ranks on host X but only 2 GPUs visible: ...". Throws InputError.
void check_local_gpu_count(int local_size, int gpu_count, const std::string& host);

}  // namespace kiln
