#pragma once
// What gathers one rank's facts for `kiln doctor`: the system-touching half (CUDA and NVML,
// getifaddrs, the environment, a write test of the checkpoint directory). The checks never call
// these; they read the facts every rank gathered.

#include <vector>

#include "comm/world.h"
#include "launch/doctor/facts.h"
#include "launch/doctor/options.h"

namespace kiln::launch::doctor {

// The write test of a directory on a dead network file system ends the process after this long.
constexpr double kWriteTimeoutS = 300;

// This rank's facts; a host's local rank 0 also tests peer access and writes the checkpoint
// directory (ranks of a host share its GPUs' links and its disks). Never throws for a failed
// write: the failure is a fact.
RankFacts gather_local_facts(const World& world, const DoctorOptions& options);

// The interface NCCL's socket transport most likely takes among `interfaces`: the first that is
// up and matches `socket_ifname` (NCCL_SOCKET_IFNAME's syntax, null when unset), else NCCL's own
// order. Empty when none fits.
std::string likely_nccl_interface(const std::vector<Interface>& interfaces,
                                  const char* socket_ifname);

}  // namespace kiln::launch::doctor
