#include "core/allocator.h"

#include <unistd.h>

#include <array>
#include <cstdlib>
#include <sstream>
#include <vector>

#include "core/check.h"

#if KILN_WITH_CUDA
#include "core/cuda/cuda_check.h"
#endif

namespace kiln {
namespace {

constexpr std::size_t kMiB = 1024 * 1024;
constexpr std::size_t kSmallRequest = 1 * kMiB;  // served from small segments
constexpr std::size_t kSmallSegment = 2 * kMiB;
constexpr std::size_t kMediumRequest = 10 * kMiB;  // served from medium segments
constexpr std::size_t kMediumSegment = 20 * kMiB;
constexpr std::size_t kLargeRounding = 2 * kMiB;
constexpr std::size_t kOversizeSlack = 20 * kMiB;  // an unsplittable block may waste this much

std::size_t round_up(std::size_t n, std::size_t multiple) {
  return (n + multiple - 1) / multiple * multiple;
}

std::size_t segment_size_for(std::size_t size) {
  if (size <= kSmallRequest) return kSmallSegment;
  if (size < kMediumRequest) return kMediumSegment;
  return round_up(size, kLargeRounding);
}

class HostMemorySource : public RawMemorySource {
 public:
  void* allocate(std::size_t bytes) override {
    void* p = nullptr;
    if (posix_memalign(&p, kAllocationAlignment, bytes) != 0) return nullptr;
    return p;
  }
  void release(void* ptr, std::size_t) override { std::free(ptr); }
  std::string name() const override { return "host memory"; }
  std::size_t total_bytes() const override {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? static_cast<std::size_t>(pages) * page : 0;
  }
};

#if KILN_WITH_CUDA
class PinnedHostSource : public RawMemorySource {
 public:
  void* allocate(std::size_t bytes) override {
    void* p = nullptr;
    cudaError_t status = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
    if (status == cudaErrorMemoryAllocation) {
      KILN_IGNORE_ERROR(cudaGetLastError());
      return nullptr;
    }
    KILN_CUDA_CHECK(status);
    return p;
  }
  void release(void* ptr, std::size_t) override { KILN_IGNORE_ERROR(cudaFreeHost(ptr)); }
  std::string name() const override { return "pinned host memory"; }
  std::size_t total_bytes() const override { return HostMemorySource().total_bytes(); }
};

class CudaDeviceSource : public RawMemorySource {
 public:
  explicit CudaDeviceSource(int device) : device_(device) {}
  void* allocate(std::size_t bytes) override {
    DeviceGuard guard(Device::cuda(device_));
    void* p = nullptr;
    cudaError_t status = cudaMalloc(&p, bytes);
    if (status == cudaErrorMemoryAllocation) {
      KILN_IGNORE_ERROR(cudaGetLastError());  // recoverable: the allocator frees cache and retries
      return nullptr;
    }
    KILN_CUDA_CHECK(status);
    return p;
  }
  void release(void* ptr, std::size_t) override {
    DeviceGuard guard(Device::cuda(device_));
    KILN_IGNORE_ERROR(cudaFree(ptr));  // at process exit the runtime may already be unloading
  }
  std::string name() const override { return "CUDA device " + std::to_string(device_); }
  std::size_t total_bytes() const override {
    DeviceGuard guard(Device::cuda(device_));
    std::size_t free_bytes = 0, total = 0;
    if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) {
      KILN_IGNORE_ERROR(cudaGetLastError());
      return 0;
    }
    return total;
  }

 private:
  int device_;
};
#endif

}  // namespace

struct CachingAllocator::Block {
  void* ptr = nullptr;
  std::size_t size = 0;
  void* stream = nullptr;
  bool free = true;
  Block* prev = nullptr;  // neighbours within the same segment
  Block* next = nullptr;
};

bool CachingAllocator::BlockOrder::operator()(const Block* a, const Block* b) const {
  if (a->stream != b->stream) return a->stream < b->stream;
  if (a->size != b->size) return a->size < b->size;
  return a->ptr < b->ptr;
}

std::size_t round_allocation_size(std::size_t bytes) {
  return bytes == 0 ? kAllocationAlignment : round_up(bytes, 512);
}

CachingAllocator::CachingAllocator(std::unique_ptr<RawMemorySource> source)
    : source_(std::move(source)) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_free_segments();
}

CachingAllocator::Block* CachingAllocator::find_free_block(void* stream, std::size_t size) {
  Block key;
  key.stream = stream;
  key.size = size;
  key.ptr = nullptr;
  auto it = free_blocks_.lower_bound(&key);
  if (it == free_blocks_.end() || (*it)->stream != stream) return nullptr;
  Block* block = *it;
  // Keep oversize blocks for oversize requests, and do not waste much of one on a smaller request.
  if (size < max_split_size_ && block->size >= max_split_size_) return nullptr;
  if (size >= max_split_size_ && block->size >= size + kOversizeSlack) return nullptr;
  free_blocks_.erase(it);
  return block;
}

CachingAllocator::Block* CachingAllocator::new_segment(void* stream, std::size_t size) {
  std::size_t bytes = segment_size_for(size);
  if (memory_limit_ != 0 && stats_.reserved_bytes + bytes > memory_limit_) {
    release_free_segments();
    if (stats_.reserved_bytes + bytes > memory_limit_) return nullptr;
  }
  void* ptr = source_->allocate(bytes);
  if (ptr == nullptr) {
    release_free_segments();
    ptr = source_->allocate(bytes);
    if (ptr == nullptr) return nullptr;
  }
  auto* block = new Block;
  block->ptr = ptr;
  block->size = bytes;
  block->stream = stream;
  stats_.reserved_bytes += bytes;
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
  ++stats_.raw_allocations;
  return block;
}

void* CachingAllocator::allocate(std::size_t bytes, void* stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (capture_pool_ != nullptr && stream == capture_stream_) stream = capture_pool_;
  std::size_t size = round_allocation_size(bytes);
  Block* block = find_free_block(stream, size);
  if (block != nullptr) {
    ++stats_.cache_hits;
  } else {
    block = new_segment(stream, size);
    if (block == nullptr) throw_out_of_memory(bytes, "");
  }
  std::size_t remainder = block->size - size;
  std::size_t min_remainder = size <= kSmallRequest ? 512 : kSmallRequest;
  if (remainder >= min_remainder && block->size <= max_split_size_) {
    auto* rest = new Block;
    rest->ptr = static_cast<char*>(block->ptr) + size;
    rest->size = remainder;
    rest->stream = stream;
    rest->free = true;
    rest->prev = block;
    rest->next = block->next;
    if (block->next != nullptr) block->next->prev = rest;
    block->next = rest;
    block->size = size;
    free_blocks_.insert(rest);
  }
  block->free = false;
  live_blocks_[block->ptr] = block;
  stats_.allocated_bytes += block->size;
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  ++stats_.allocations;
  stats_.live_blocks = live_blocks_.size();
  return block->ptr;
}

void CachingAllocator::free(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_blocks_.find(ptr);
  KILN_CHECK(it != live_blocks_.end(), "free of a pointer this allocator did not hand out");
  // Freed while its stream is captured: the graph may use it on every replay, so it stays held
  // until the graph's pool is released.
  if (capture_pool_ != nullptr && it->second->stream == capture_stream_) {
    deferred_frees_[capture_pool_].push_back(ptr);
    return;
  }
  free_block(it);
}

void CachingAllocator::free_block(std::map<void*, Block*>::iterator it) {
  Block* block = it->second;
  live_blocks_.erase(it);
  stats_.allocated_bytes -= block->size;
  stats_.live_blocks = live_blocks_.size();
  block->free = true;
  // Merge with free neighbours of the same segment.
  if (block->prev != nullptr && block->prev->free) {
    Block* prev = block->prev;
    free_blocks_.erase(prev);
    prev->size += block->size;
    prev->next = block->next;
    if (block->next != nullptr) block->next->prev = prev;
    delete block;
    block = prev;
  }
  if (block->next != nullptr && block->next->free) {
    Block* next = block->next;
    free_blocks_.erase(next);
    block->size += next->size;
    block->next = next->next;
    if (next->next != nullptr) next->next->prev = block;
    delete next;
  }
  free_blocks_.insert(block);
}

void CachingAllocator::release_free_segments() {
  for (auto it = free_blocks_.begin(); it != free_blocks_.end();) {
    Block* block = *it;
    if (block->prev == nullptr && block->next == nullptr && pools_.count(block->stream) == 0) {
      source_->release(block->ptr, block->size);
      stats_.reserved_bytes -= block->size;
      ++stats_.raw_frees;
      delete block;
      it = free_blocks_.erase(it);
    } else {
      ++it;
    }
  }
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_free_segments();
}

void CachingAllocator::throw_out_of_memory(std::size_t requested, const char* reason) {
  ++stats_.out_of_memory;
  std::ostringstream os;
  os << source_->name() << " out of memory allocating " << format_bytes(requested) << " (in use "
     << format_bytes(stats_.allocated_bytes) << ", cached "
     << format_bytes(stats_.reserved_bytes - stats_.allocated_bytes);
  if (memory_limit_ != 0) os << ", limit " << format_bytes(memory_limit_);
  std::size_t total = source_->total_bytes();
  if (total != 0) os << ", total " << format_bytes(total);
  os << ")" << reason
     << ": lower train.batch_per_gpu, recompute activations (train.recompute: BLOCKS), shard "
        "the optimizer state (parallel.zero_stage: 1 or 2) or use mixed precision "
        "(precision.opt_level: O2); kiln plan shows what each of these saves, kiln autobatch "
        "finds the largest batch that fits";
  throw OutOfMemoryError(os.str(), requested);
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  AllocatorStats stats = stats_;
  for (const Block* block : free_blocks_) {
    if (pools_.count(block->stream) != 0) {
      stats.graph_pool_bytes += block->size;
    } else {
      stats.largest_free_block_bytes = std::max(stats.largest_free_block_bytes, block->size);
    }
  }
  return stats;
}

void CachingAllocator::reset_peak_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

void CachingAllocator::set_memory_limit(std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  memory_limit_ = bytes;
}

std::size_t CachingAllocator::memory_limit() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return memory_limit_;
}

void CachingAllocator::set_max_split_size(std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  max_split_size_ = bytes;
}

std::string CachingAllocator::source_name() const {
  return source_->name();
}

void CachingAllocator::begin_pool_capture(void* stream, void* pool) {
  std::lock_guard<std::mutex> lock(mutex_);
  KILN_CHECK(pool != nullptr && pool != stream, "allocator: a private pool needs its own address");
  KILN_CHECK(capture_pool_ == nullptr, "allocator: a capture is already in progress");
  capture_stream_ = stream;
  capture_pool_ = pool;
  pools_.insert(pool);
}

void CachingAllocator::end_pool_capture() {
  std::lock_guard<std::mutex> lock(mutex_);
  capture_stream_ = capture_pool_ = nullptr;
}

void CachingAllocator::release_pool(void* pool) {
  std::lock_guard<std::mutex> lock(mutex_);
  pools_.erase(pool);
  auto deferred = deferred_frees_.find(pool);
  if (deferred == deferred_frees_.end()) return;
  for (void* ptr : deferred->second) {
    auto it = live_blocks_.find(ptr);
    if (it != live_blocks_.end()) free_block(it);
  }
  deferred_frees_.erase(deferred);
}

std::size_t CachingAllocator::pool_reserved_bytes(void* pool) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::size_t bytes = 0;
  for (const auto& [ptr, block] : live_blocks_) {
    if (block->stream == pool) bytes += block->size;
  }
  for (const Block* block : free_blocks_) {
    if (block->stream == pool) bytes += block->size;
  }
  return bytes;
}

// The process-wide allocators live until exit and are never destroyed: their segments may be
// released after the CUDA runtime has unloaded, which would report spurious errors.
CachingAllocator& host_allocator() {
  static auto* allocator = new CachingAllocator(std::make_unique<HostMemorySource>());
  return *allocator;
}

CachingAllocator& pinned_allocator() {
#if KILN_WITH_CUDA
  static auto* allocator = new CachingAllocator(std::make_unique<PinnedHostSource>());
  return *allocator;
#else
  // Without CUDA there is nothing to pin for; plain host memory serves.
  return host_allocator();
#endif
}

CachingAllocator& cuda_allocator(int device) {
#if KILN_WITH_CUDA
  static std::mutex mutex;
  static std::array<CachingAllocator*, 64> allocators{};
  int count = cuda_device_count();
  if (device < 0 || device >= count) {
    throw Error("CUDA device " + std::to_string(device) + " does not exist (" +
                std::to_string(count) + " visible): " + cuda_error_hint(cudaErrorInvalidDevice));
  }
  std::lock_guard<std::mutex> lock(mutex);
  if (allocators[device] == nullptr) {
    allocators[device] = new CachingAllocator(std::make_unique<CudaDeviceSource>(device));
  }
  return *allocators[device];
#else
  throw Error("CUDA device " + std::to_string(device) +
              " asked for, but this Kiln was built without CUDA (-DKILN_CUDA=OFF)");
#endif
}

CachingAllocator& allocator_for(Device device) {
  return device.is_cuda() ? cuda_allocator(device.index) : host_allocator();
}

}  // namespace kiln
