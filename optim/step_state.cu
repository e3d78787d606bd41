// The resident step's two one-thread kernels: the skip decision and the advance of the scaler,
// the counts and the LR (the arithmetic is optim/step_state.h's, shared with the CPU).

#include "core/cuda/cuda_check.h"
#include "optim/step_state.h"

namespace kiln::optim::detail {
namespace {

__global__ void resident_decide_kernel(StepState* state, const float* stats, ScalerRule scaler) {
  resident_decide(*state, stats[0], stats[1], scaler);
}

__global__ void resident_advance_kernel(StepState* state, ScalerRule scaler, const double* lr_table,
                                        std::int64_t lr_table_size) {
  resident_advance(*state, scaler, lr_table, lr_table_size);
}

}  // namespace

void cuda_resident_decide(StepState* state, const float* stats, const ScalerRule& scaler,
                          void* stream) {
  resident_decide_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(state, stats, scaler);
  KILN_CUDA_LAUNCH_CHECK();
}

void cuda_resident_advance(StepState* state, const ScalerRule& scaler, const double* lr_table,
                           std::int64_t lr_table_size, void* stream) {
  resident_advance_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(state, scaler, lr_table,
                                                                          lr_table_size);
  KILN_CUDA_LAUNCH_CHECK();
}

}  // namespace kiln::optim::detail
