#pragma once
// The checks of `kiln doctor` that run collectives: every rank takes part, so they take the
// communicator rather than gathered facts.

#include <string>

#include "comm/communicator.h"
#include "comm/world.h"
#include "launch/doctor/checks.h"

namespace kiln::launch::doctor {

// MPI and the collective backend (NCCL on GPUs) see the same world: each sums the rank ids and
// counts the ranks, and NCCL's own rank and size must be MPI's.
Check check_agree(Communicator& comm, const World& world);

// All-reduce bus bandwidth from small to --max-mb sizes, each sum checked. `note` (non-empty when
// the world check kept the GPUs out) turns an ok into a warn: NCCL was not what was measured.
Check check_bandwidth(Communicator& comm, const DoctorOptions& options, const std::string& note);

}  // namespace kiln::launch::doctor
