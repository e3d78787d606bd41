#pragma once
// The caching allocator. One algorithm serves CUDA device memory (cudaMalloc underneath), pinned
// host memory (cudaHostAlloc) and plain host memory (aligned malloc), so that everything about
// reuse, splitting, statistics, the memory limit and out-of-memory recovery is tested on CPU.
//
// Blocks are carved from segments obtained from the raw source; a freed block returns to the
// pool of its stream and is reused by later requests on that stream (best fit, split when the
// remainder is worth keeping, merged with free neighbours). Blocks above max_split_size are
// never split, as in PyTorch, which bounds fragmentation from large tensors.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "core/device.h"

namespace kiln {

constexpr std::size_t kAllocationAlignment = 256;

struct AllocatorStats {
  std::size_t allocated_bytes = 0;  // in live blocks handed out
  std::size_t reserved_bytes = 0;   // in segments held from the raw source
  std::size_t peak_allocated_bytes = 0;
  std::size_t peak_reserved_bytes = 0;
  std::uint64_t raw_allocations = 0;  // calls to cudaMalloc / malloc
  std::uint64_t raw_frees = 0;
  std::uint64_t allocations = 0;    // requests served
  std::uint64_t cache_hits = 0;     // requests served from cached blocks
  std::uint64_t out_of_memory = 0;  // requests that failed
  std::size_t live_blocks = 0;
  std::size_t largest_free_block_bytes = 0;  // the largest cached block other work can get
  // Free blocks inside the CUDA graphs' private pools: no other work gets them, and every replay
  // writes into them, so they are in use as much as allocated_bytes (kiln bench's peak, the logs).
  std::size_t graph_pool_bytes = 0;
  std::size_t in_use_bytes() const { return allocated_bytes + graph_pool_bytes; }
  // Cached memory other work can get: what the cache can hand out again.
  std::size_t free_cached_bytes() const { return reserved_bytes - in_use_bytes(); }
  // How scattered the free cached memory is: 1 - largest free block / free cached bytes (0 when
  // nothing is free, or all of it is one block). Two equal separate free blocks give 0.5; near 1,
  // the cache holds much free memory but no large piece of it, and a large request needs a new
  // segment although the free total would cover it.
  double fragmentation() const {
    const std::size_t free_bytes = free_cached_bytes();
    return free_bytes == 0 ? 0.0
                           : 1.0 - static_cast<double>(largest_free_block_bytes) /
                                       static_cast<double>(free_bytes);
  }
};

// Where segments come from. allocate() returns nullptr when the source is out of memory.
class RawMemorySource {
 public:
  virtual ~RawMemorySource() = default;
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void release(void* ptr, std::size_t bytes) = 0;
  virtual std::string name() const = 0;         // "CUDA device 0", "pinned host", "host"
  virtual std::size_t total_bytes() const = 0;  // the device's capacity, 0 if unknown
};

class CachingAllocator {
 public:
  explicit CachingAllocator(std::unique_ptr<RawMemorySource> source);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Throws OutOfMemoryError (what was asked, in use, cached, the limit, what to try).
  void* allocate(std::size_t bytes, void* stream = nullptr);
  void free(void* ptr);
  // Gives every cached, unused segment back to the raw source.
  void empty_cache();

  AllocatorStats stats() const;
  void reset_peak_stats();
  // 0 = no limit. Reserved memory never grows past it (emulates a smaller GPU).
  void set_memory_limit(std::size_t bytes);
  std::size_t memory_limit() const;
  // Blocks larger than this are never split (PyTorch's max_split_size_mb); SIZE_MAX = no limit.
  void set_max_split_size(std::size_t bytes);
  std::string source_name() const;

  // CUDA graphs: while `stream` is captured, its requests are served from the private pool
  // `pool` (any unique address), and its other blocks freed meanwhile stay held. A graph replays
  // with the addresses it was captured with, so pool memory never goes to work outside the
  // graphs, and the pool's segments are kept (not released by empty_cache or out-of-memory
  // recovery) until release_pool(), which also frees the held blocks. Graphs captured one after
  // the other may share a pool: they replay in order on one stream.
  void begin_pool_capture(void* stream, void* pool);
  void end_pool_capture();
  // The graphs that used `pool` are gone: its free segments may be released again.
  void release_pool(void* pool);
  std::size_t pool_reserved_bytes(void* pool) const;  // for tests and logs

 private:
  struct Block;
  struct BlockOrder {
    bool operator()(const Block* a, const Block* b) const;
  };
  Block* find_free_block(void* stream, std::size_t size);
  Block* new_segment(void* stream, std::size_t size);
  void release_free_segments();
  void free_block(std::map<void*, Block*>::iterator it);  // with the lock held
  [[noreturn]] void throw_out_of_memory(std::size_t requested, const char* reason);

  std::unique_ptr<RawMemorySource> source_;
  mutable std::mutex mutex_;
  std::set<Block*, BlockOrder> free_blocks_;
  std::map<void*, Block*> live_blocks_;
  AllocatorStats stats_;
  std::size_t memory_limit_ = 0;
  std::size_t max_split_size_ = SIZE_MAX;
  void* capture_stream_ = nullptr;  // with capture_pool_ set: the stream being captured
  void* capture_pool_ = nullptr;
  std::set<void*> pools_;  // live private pools: their segments are kept
  std::map<void*, std::vector<void*>> deferred_frees_;  // per pool: blocks freed while captured
};

// The process-wide allocators. The CUDA ones throw if CUDA is not built or the device is absent.
CachingAllocator& host_allocator();
CachingAllocator& pinned_allocator();
CachingAllocator& cuda_allocator(int device);
CachingAllocator& allocator_for(Device device);

// Rounds a request the way the allocator does (exposed for tests).
std::size_t round_allocation_size(std::size_t bytes);

}  // namespace kiln
