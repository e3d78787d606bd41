#pragma once
// A CUDA graph captured from the work a function enqueues on one stream, then replayed with one
// launch. Allocations the captured stream makes meanwhile come from a private pool of the caching
// allocator (CachingAllocator::begin_pool_capture), so replays find their memory untouched. Work
// on other streams joins the capture through events (data parallelism's comm stream); it must
// join back before the function returns. In a CPU-only build nothing can be captured.

#include <functional>
#include <string>

#include "core/device.h"

namespace kiln {

class CudaGraph {
 public:
  CudaGraph() = default;
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // Runs `enqueue` with `stream` capturing (relaxed mode: other threads and the allocator may
  // still call cudaMalloc) and instantiates the graph. `pool` is the private allocator pool (any
  // unique address; graphs replayed in order on one stream may share one). Returns false, with
  // the reason in *why, when the work could not be captured (a host synchronisation inside, an
  // exception from `enqueue`): the stream is usable again and nothing stays captured. The work
  // captured did not run: replay() runs it.
  bool capture(Device device, void* stream, void* pool, const std::function<void()>& enqueue,
               std::string* why);
  void replay(void* stream) const;
  bool captured() const { return exec_ != nullptr; }
  std::size_t nodes() const { return nodes_; }

 private:
  void* graph_ = nullptr;  // cudaGraph_t
  void* exec_ = nullptr;   // cudaGraphExec_t
  std::size_t nodes_ = 0;
};

}  // namespace kiln
