#pragma once
// NVTX ranges, so Nsight Systems shows layers and phases of a step. Without CUDA they cost nothing.

#if KILN_WITH_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

namespace kiln {

class NvtxRange {
 public:
  explicit NvtxRange(const char* name) {
#if KILN_WITH_CUDA
    nvtxRangePushA(name);
#else
    (void)name;
#endif
  }
  ~NvtxRange() {
#if KILN_WITH_CUDA
    nvtxRangePop();
#endif
  }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace kiln
