#pragma once
// RAII owners of cuDNN descriptors, legacy (tensor, filter, convolution) and backend (graph API),
// in one place as flashlight's CudnnUtils.h keeps them. Creation failures throw through
// KILN_CUDNN_CHECK; destructors report a failure on stderr and never throw.

#include <cudnn.h>

#include <cstdint>
#include <cstdio>

#include "core/cuda/cudnn_check.h"

namespace kiln::cuda {

inline void report_cudnn_destroy(cudnnStatus_t status, const char* what) {
  if (status != CUDNN_STATUS_SUCCESS) {
    std::fprintf(stderr, "kiln: %s failed: %s\n", what, cudnnGetErrorString(status));
  }
}

// One legacy descriptor type: its handle and its create and destroy calls.
template <typename Handle, cudnnStatus_t (*Create)(Handle*), cudnnStatus_t (*Destroy)(Handle)>
class CudnnDescriptor {
 public:
  CudnnDescriptor() { KILN_CUDNN_CHECK(Create(&desc_)); }
  ~CudnnDescriptor() { report_cudnn_destroy(Destroy(desc_), "destroying a cuDNN descriptor"); }
  CudnnDescriptor(const CudnnDescriptor&) = delete;
  CudnnDescriptor& operator=(const CudnnDescriptor&) = delete;
  Handle get() const { return desc_; }

 private:
  Handle desc_ = nullptr;
};

// cuDNN 9 marks the legacy filter and convolution descriptors deprecated with the convolution
// API that uses them (layers/cuda/conv2d.cc says why Kiln still runs it).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
using TensorDescriptor = CudnnDescriptor<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor,
                                         cudnnDestroyTensorDescriptor>;
using FilterDescriptor = CudnnDescriptor<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor,
                                         cudnnDestroyFilterDescriptor>;
using ConvolutionDescriptor =
    CudnnDescriptor<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor,
                    cudnnDestroyConvolutionDescriptor>;
#pragma GCC diagnostic pop

// One backend (graph API) descriptor of any type, with its attribute setters.
class BackendDescriptor {
 public:
  explicit BackendDescriptor(cudnnBackendDescriptorType_t type) {
    KILN_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &desc_));
  }
  ~BackendDescriptor() {
    if (desc_ == nullptr) return;
    report_cudnn_destroy(cudnnBackendDestroyDescriptor(desc_), "cudnnBackendDestroyDescriptor");
  }
  BackendDescriptor(const BackendDescriptor&) = delete;
  BackendDescriptor& operator=(const BackendDescriptor&) = delete;
  cudnnBackendDescriptor_t get() const { return desc_; }
  cudnnBackendDescriptor_t* address() { return &desc_; }

  template <typename T>
  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, const T* values,
           std::int64_t count = 1) {
    KILN_CUDNN_CHECK(cudnnBackendSetAttribute(desc_, name, type, count, values));
  }
  void set(cudnnBackendAttributeName_t name, const BackendDescriptor& d) {
    cudnnBackendDescriptor_t v = d.get();
    KILN_CUDNN_CHECK(cudnnBackendSetAttribute(desc_, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v));
  }
  void finalize() { KILN_CUDNN_CHECK(cudnnBackendFinalize(desc_)); }
  // Finalize where failing is an answer (an engine that cannot run this graph), not an error.
  bool try_finalize() { return cudnnBackendFinalize(desc_) == CUDNN_STATUS_SUCCESS; }

 private:
  cudnnBackendDescriptor_t desc_ = nullptr;
};

}  // namespace kiln::cuda
