#pragma once
// One way for every multi-rank command (train, eval, bench) to run its body and end the job on
// an error, so that no rank waits forever in a collective for a rank that has given up.

#include <functional>

#include "comm/world.h"

namespace kiln::launch {

// Starts the world, runs `body` on every rank and finalises the world. An error on any rank is
// printed ("kiln COMMAND: ...", configuration errors once, by rank 0; others tagged with the
// rank) and ends the whole job with MPI_Abort. Returns body's exit code (each rank returns its
// own, without an abort), 2 for bad input (ConfigError, InputError), 1 for any other exception.
int run_on_all_ranks(const char* command, const std::function<int(const World&)>& body);

}  // namespace kiln::launch
