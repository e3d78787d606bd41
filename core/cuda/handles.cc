#include "core/cuda/handles.h"

#include <array>
#include <mutex>

#include "core/cuda/cuda_check.h"
#include "core/stream.h"

namespace kiln::cuda {
namespace {

constexpr int kMaxDevices = 64;
std::mutex g_mutex;
std::array<cublasHandle_t, kMaxDevices> g_cublas{};
std::array<cublasLtHandle_t, kMaxDevices> g_cublaslt{};

}  // namespace

int current_device() {
  int device = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

cublasHandle_t cublas_handle() {
  int device = current_device();
  cublasHandle_t handle;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_cublas[device] == nullptr) {
      KILN_CUBLAS_CHECK(cublasCreate(&g_cublas[device]));
      // Exact fp32 by default (no TF32), so CUDA results match the CPU ones.
      KILN_CUBLAS_CHECK(cublasSetMathMode(g_cublas[device], CUBLAS_DEFAULT_MATH));
    }
    handle = g_cublas[device];
  }
  KILN_CUBLAS_CHECK(
      cublasSetStream(handle, static_cast<cudaStream_t>(current_stream(Device::cuda(device)))));
  return handle;
}

cudaDataType_t cuda_data_type(DType t) {
  switch (t) {
    case DType::F32:
      return CUDA_R_32F;
    case DType::F64:
      return CUDA_R_64F;
    case DType::F16:
      return CUDA_R_16F;
    case DType::BF16:
      return CUDA_R_16BF;
    default:
      KILN_CHECK(false, std::string("no cuBLAS data type for ") + dtype_name(t));
  }
  return CUDA_R_32F;
}

cublasLtHandle_t cublaslt_handle() {
  int device = current_device();
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_cublaslt[device] == nullptr) KILN_CUBLAS_CHECK(cublasLtCreate(&g_cublaslt[device]));
  return g_cublaslt[device];
}

}  // namespace kiln::cuda
