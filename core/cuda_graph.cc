#include "core/cuda_graph.h"

#include "core/allocator.h"
#include "core/check.h"

#if KILN_WITH_CUDA
#include "core/cuda/cuda_check.h"
#endif

namespace kiln {

CudaGraph::~CudaGraph() {
#if KILN_WITH_CUDA
  if (exec_ != nullptr)
    KILN_IGNORE_ERROR(cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_)));
  if (graph_ != nullptr) KILN_IGNORE_ERROR(cudaGraphDestroy(static_cast<cudaGraph_t>(graph_)));
#endif
}

bool CudaGraph::capture(Device device, void* stream, void* pool,
                        const std::function<void()>& enqueue, std::string* why) {
  KILN_CHECK(exec_ == nullptr, "CudaGraph: already captured");
#if KILN_WITH_CUDA
  KILN_CHECK(device.is_cuda() && stream != nullptr,
             "CudaGraph: capture needs a CUDA stream other than the default one");
  DeviceGuard guard(device);
  auto s = static_cast<cudaStream_t>(stream);
  CachingAllocator& allocator = cuda_allocator(device.index);
  KILN_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  allocator.begin_pool_capture(stream, pool);
  std::string failure;
  try {
    enqueue();
  } catch (const std::exception& e) {
    failure = e.what();
  }
  allocator.end_pool_capture();
  cudaGraph_t graph = nullptr;
  cudaError_t end = cudaStreamEndCapture(s, &graph);
  if (failure.empty() && end != cudaSuccess) failure = cudaGetErrorString(end);
  KILN_IGNORE_ERROR(cudaGetLastError());  // an invalidated capture leaves a sticky-free error
  if (!failure.empty()) {
    if (graph != nullptr) KILN_IGNORE_ERROR(cudaGraphDestroy(graph));
    if (why != nullptr) *why = failure;
    return false;
  }
  cudaGraphExec_t exec = nullptr;
  cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  if (inst != cudaSuccess) {
    KILN_IGNORE_ERROR(cudaGetLastError());
    KILN_IGNORE_ERROR(cudaGraphDestroy(graph));
    if (why != nullptr) *why = std::string("cudaGraphInstantiate: ") + cudaGetErrorString(inst);
    return false;
  }
  KILN_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &nodes_));
  graph_ = graph;
  exec_ = exec;
  return true;
#else
  (void)device, (void)stream, (void)pool, (void)enqueue;
  if (why != nullptr) *why = "this Kiln was built without CUDA";
  return false;
#endif
}

void CudaGraph::replay(void* stream) const {
  KILN_CHECK(exec_ != nullptr, "CudaGraph: replay before a successful capture");
#if KILN_WITH_CUDA
  KILN_CUDA_CHECK(
      cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), static_cast<cudaStream_t>(stream)));
#else
  (void)stream;
#endif
}

}  // namespace kiln
