#include "comm/world.h"

#include <mpi.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>

#include "comm/mpi_check.h"
#include "comm/watchdog.h"
#include "core/check.h"

#if KILN_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda/cuda_check.h"
#endif

namespace kiln {
namespace {

std::mutex g_world_mutex;
World g_world;
bool g_world_ready = false;
bool g_mpi_initialised_here = false;

std::string this_host() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown-host";
  return buf;
}

bool launcher_in_environment() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  return false;
}

}  // namespace

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) {
    return "MPI error code " + std::to_string(code);
  }
  int error_class = code;
  KILN_IGNORE_ERROR(MPI_Error_class(code, &error_class));
  return std::string(text, static_cast<std::size_t>(length)) + " (MPI error class " +
         std::to_string(error_class) + ")";
}

std::string mpi_error_hint(int code) {
  int error_class = code;
  KILN_IGNORE_ERROR(MPI_Error_class(code, &error_class));
  switch (error_class) {
    case MPI_ERR_COUNT:
    case MPI_ERR_BUFFER:
      return "a message is larger than MPI's int counts allow, or a buffer is null; "
             "this is a bug in the caller";
    case MPI_ERR_TRUNCATE:
      return "ranks called the same collective with different sizes: check that every rank "
             "builds the same model and bucket layout";
    case MPI_ERR_COMM:
      return "the communicator is not valid: was it used after finalize_world()?";
#ifdef MPI_ERR_PROC_FAILED
    case MPI_ERR_PROC_FAILED:
      return "another rank died; look for its error earlier in the log";
#endif
    case MPI_ERR_OTHER:
    case MPI_ERR_INTERN:
      return "a rank may have died or the network failed; look for the first error in the log "
             "of every rank";
    default:
      return "";
  }
}

const World& init_world(int* argc, char*** argv, double init_timeout_s) {
  std::lock_guard<std::mutex> lock(g_world_mutex);
  if (g_world_ready) return g_world;
  int initialised = 0;
  KILN_MPI_CHECK(MPI_Initialized(&initialised));
  const bool under_launcher = launcher_in_environment();
  if (!initialised) {
    // A singleton MPI_Init (no mpirun) can hang when the runtime cannot start its helper
    // daemon; a watch turns that into an exit with a message.
    std::uint64_t watch = Watchdog::instance().begin(
        "MPI_Init", 0, init_timeout_s, {},
        "run under mpirun, or check that Open MPI can start (OMPI_MCA_* settings, /tmp writable)");
    int provided = 0;
    int status = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    Watchdog::instance().end(watch);
    KILN_MPI_CHECK(status);
    g_mpi_initialised_here = true;
  }
  KILN_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  World w;
  KILN_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &w.rank));
  KILN_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &w.size));
  MPI_Comm local = MPI_COMM_NULL;
  KILN_MPI_CHECK(
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, w.rank, MPI_INFO_NULL, &local));
  KILN_MPI_CHECK(MPI_Comm_rank(local, &w.local_rank));
  KILN_MPI_CHECK(MPI_Comm_size(local, &w.local_size));
  KILN_MPI_CHECK(MPI_Comm_free(&local));
  w.host = this_host();
  w.under_launcher = under_launcher || w.size > 1;
  set_process_identity(w.rank, w.size);
  Watchdog::instance().set_rank(w.rank);
  g_world = w;
  g_world_ready = true;
  return g_world;
}

const World& world() {
  std::lock_guard<std::mutex> lock(g_world_mutex);
  KILN_CHECK(g_world_ready, "kiln::world() was called before kiln::init_world()");
  return g_world;
}

void finalize_world() {
  std::lock_guard<std::mutex> lock(g_world_mutex);
  if (!g_mpi_initialised_here) return;
  int finalised = 0;
  KILN_IGNORE_ERROR(MPI_Finalized(&finalised));
  if (!finalised) KILN_MPI_CHECK(MPI_Finalize());
  g_mpi_initialised_here = false;
  g_world_ready = false;
}

std::vector<std::string> all_gather_strings(const World& world, const std::string& mine,
                                            double timeout_s) {
  KILN_CHECK(mine.size() < static_cast<std::size_t>(1) << 30,
             "all_gather_strings: string too long");
  const int length = static_cast<int>(mine.size());
  std::vector<int> lengths(world.size), offsets(world.size);
  WatchdogScope watch("collective all_gather_strings", 0, timeout_s);
  KILN_MPI_CHECK(MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, MPI_COMM_WORLD));
  long long total = 0;
  for (int r = 0; r < world.size; ++r) {
    offsets[r] = static_cast<int>(total);
    total += lengths[r];
  }
  KILN_CHECK(total < (1LL << 31), "all_gather_strings: more than 2 GiB in all");
  std::string all(static_cast<std::size_t>(total), '\0');
  KILN_MPI_CHECK(MPI_Allgatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(),
                                offsets.data(), MPI_CHAR, MPI_COMM_WORLD));
  std::vector<std::string> out(world.size);
  for (int r = 0; r < world.size; ++r) out[r] = all.substr(offsets[r], lengths[r]);
  return out;
}

void check_local_gpu_count(int local_size, int gpu_count, const std::string& host) {
  if (local_size <= gpu_count) return;
  throw InputError(
      std::to_string(local_size) + " ranks on host " + host + " but only " +
      std::to_string(gpu_count) + " GPU" + (gpu_count == 1 ? "" : "s") +
      " visible: each rank needs its own GPU. Start at most " + std::to_string(gpu_count) +
      " ranks per host (mpirun -npernode " + std::to_string(gpu_count > 0 ? gpu_count : 1) +
      "), or check CUDA_VISIBLE_DEVICES (set: " +
      (std::getenv("CUDA_VISIBLE_DEVICES") ? std::getenv("CUDA_VISIBLE_DEVICES") : "no") +
      "), or train on the CPU with device: cpu");
}

Device select_local_device(const World& world) {
  check_local_gpu_count(world.local_size, cuda_device_count(), world.host);
#if KILN_WITH_CUDA
  KILN_CUDA_CHECK(cudaSetDevice(world.local_rank));
#endif
  return Device::cuda(world.local_rank);
}

}  // namespace kiln
