#include "core/cuda/cuda_check.h"

namespace kiln {

int current_cuda_device_or_minus_one() {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) return -1;
  return device;
}

std::string cuda_error_hint(cudaError_t status) {
  switch (status) {
    case cudaErrorMemoryAllocation:
      return "the GPU is out of memory: lower train.batch_per_gpu, use mixed precision, or run "
             "kiln autobatch";
    case cudaErrorIllegalAddress:
      return "a kernel read or wrote outside its buffers; rerun under compute-sanitizer "
             "--tool memcheck (with CUDA_LAUNCH_BLOCKING=1) to find it";
    case cudaErrorInsufficientDriver:
      return "the NVIDIA driver is older than this CUDA runtime: update the driver or build "
             "with an older toolkit";
    case cudaErrorNoDevice:
      return "no CUDA GPU is visible: check nvidia-smi and CUDA_VISIBLE_DEVICES, or run with "
             "train.device: CPU";
    case cudaErrorInvalidDevice:
      return "the device index does not exist: more ranks per node than GPUs, or "
             "CUDA_VISIBLE_DEVICES hides it";
    case cudaErrorNoKernelImageForDevice:
      return "Kiln was not compiled for this GPU's architecture: add it to "
             "CMAKE_CUDA_ARCHITECTURES";
    default:
      return "";
  }
}

void report_cuda_failure(cudaError_t status, const SourceSite& site) {
  std::string text = std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
  report_failure("CUDA", text, site, cuda_error_hint(status));
}

std::string cublas_status_string(cublasStatus_t status) {
  return std::string(cublasGetStatusName(status)) + ": " + cublasGetStatusString(status);
}

std::string cublas_error_hint(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "cuBLAS could not start: usually the GPU is out of memory or the CUDA context is "
             "broken by an earlier error; check memory use and earlier messages";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "cuBLAS could not allocate its workspace: the GPU is out of memory";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "this GPU lacks a feature the call needs (e.g. bf16 before sm_80)";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "no cuBLAS kernel for these types, layouts or alignments";
    default:
      return "";
  }
}

}  // namespace kiln
