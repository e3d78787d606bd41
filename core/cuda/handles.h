#pragma once
// Library handles, one per device, created on first use and kept for the process. Callers bind
// the current stream on every use (handles are shared by the streams of one device).

#include <cublasLt.h>
#include <cublas_v2.h>

#include "core/dtype.h"

namespace kiln::cuda {

cublasHandle_t cublas_handle();      // for the current device, bound to its current stream
cublasLtHandle_t cublaslt_handle();  // for the current device
int current_device();
// The cuBLAS/cuBLASLt data type of a floating dtype; an error for the others.
cudaDataType_t cuda_data_type(DType t);

}  // namespace kiln::cuda
