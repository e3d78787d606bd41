#pragma once
// The command line of `kiln doctor`, as the probes and checks read it.

#include <string>

namespace kiln::launch::doctor {

struct DoctorOptions {
  bool json = false;
  std::string dir;
  bool dir_from_config = false;  // checkpoint.dir may not exist yet: test its nearest parent
  int write_mb = 128;
  int max_mb = 0;  // 0: 1024 on CUDA, 4 on the CPU
  bool use_cuda = true;
  // This kiln was built with CUDA (KILN_WITH_CUDA): with --device auto a job is meant for GPUs, so
  // a rank that sees none fails the world check instead of passing as a CPU job.
  bool cuda_build = false;
};

}  // namespace kiln::launch::doctor
