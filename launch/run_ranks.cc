#include "launch/run_ranks.h"

#include <mpi.h>

#include <cstdio>
#include <iostream>
#include <string>

#include "configs/experiment.h"
#include "core/check.h"

namespace kiln::launch {

int run_on_all_ranks(const char* command, const std::function<int(const World&)>& body) {
  const World& world = init_world();
  const std::string rank_tag =
      world.size > 1 ? " [rank " + std::to_string(world.rank) + "]" : std::string();
  int code = 0;
  bool failed = false;  // an exception: the other ranks may be waiting in a collective
  try {
    code = body(world);
  } catch (const config::ConfigError& e) {
    // Every rank loaded the same experiment: one copy of the message is enough.
    if (world.rank == 0) std::cerr << "kiln " << command << ": " << e.what() << "\n";
    code = 2;
    failed = true;
  } catch (const InputError& e) {
    std::cerr << "kiln " << command << rank_tag << ": " << e.what() << "\n";
    code = 2;
    failed = true;
  } catch (const std::exception& e) {
    std::cerr << "kiln " << command << rank_tag << ": " << e.what() << "\n";
    code = 1;
    failed = true;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  // A code body returned (kiln train's 130 after SIGINT) is every rank's, agreed: no abort.
  if (failed && world.size > 1) MPI_Abort(MPI_COMM_WORLD, code);
  finalize_world();
  return code;
}

}  // namespace kiln::launch
