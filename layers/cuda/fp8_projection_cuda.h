#pragma once
// FP8 projections' casts on CUDA (layers/cuda/fp8_projection.cu); see layers/fp8_projection.h.
// `slot` is one role's row of the state buffer on the device, 16-byte aligned (cuBLASLt refuses
// to run with a scale pointer that is not): the inverse of the last cast's scale (what the GEMM
// reads), that scale, the kernels' scratch (the amax's bits and the count of blocks done, zero
// between launches), then core/fp8.h's state (kFp8StateHeader + history floats).

#include "core/cuda_op.h"
#include "core/fp8.h"
#include "core/tensor.h"

namespace kiln {
constexpr int kFp8RowInverse = 0, kFp8RowScale = 1, kFp8RowScratch = 2, kFp8RowState = 4;
}  // namespace kiln

namespace kiln::cuda {

// The amax of x, and from it the scale of the next cast (the Current recipe's pass before the
// cast). `only_unrecorded`: only where the state has recorded nothing yet (a Delayed scaling's
// first cast, which would otherwise cast at scale 1); a no-op on the device otherwise.
KILN_CUDA_OP("FP8 projections", void fp8_projection_amax(const Tensor& x, float* slot,
                                                         const Fp8ScalingOptions& options,
                                                         Fp8Format format, bool only_unrecorded));
// x (R, C) -> rows (R, C) and/or transposed (C, R) bytes (either may be null), at the slot's
// scale (`record`) or its last cast's scale (not `record`: nothing is measured or recorded).
KILN_CUDA_OP("FP8 projections",
             void fp8_projection_cast(const Tensor& x, float* slot,
                                      const Fp8ScalingOptions& options, Fp8Format format,
                                      bool record, Tensor* rows, Tensor* transposed));

// rows (N, row length) F32: N / 3 projections' state buffers one after another (roles input,
// weight, gradient); each row's next scale from its amax history (core/fp8.h's
// fp8_scale_from_history), the gradient's rows in `gradient_format`, the others in E4M3.
KILN_CUDA_OP("FP8 projections",
             void fp8_projection_scales_from_history(Tensor& rows, const Fp8ScalingOptions& options,
                                                     Fp8Format gradient_format));

}  // namespace kiln::cuda
