#pragma once
// Per-GPU memory of an experiment, for `kiln plan` and `kiln autobatch` (docs/memory.md).
//
// What is fixed by the model and the optimizer is counted from the parameters: weights (and
// O1's half casts of them), gradients, fp32 master weights (O2), optimizer moments, divided over
// the ranks where ZeRO shards them (stage 1: masters and moments; stage 2: gradients too, plus one
// bucket for the reduce-scatter). What depends on the batch is measured: two real training steps
// at half the experiment's batch and at the batch itself (halved until they fit) on the device
// the experiment trains on, with and without recomputation; the peak's growth per sample between
// the two is the activations of one sample, and what the smaller needs beyond its activations
// and the counted parts is the workspaces and temporaries. NCCL's
// buffers (allocated outside Kiln's allocator) are estimated from NCCL_BUFFSIZE and channels.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/world.h"
#include "configs/kiln.pb.h"
#include "core/allocator.h"

namespace kiln::train {

// The allocator whose statistics and limit a run of `e` on this machine uses (its device's).
CachingAllocator& allocator_of(const config::Experiment& e);

// The peak memory of two training steps at `batch` on the experiment's device, or fits = false
// on out-of-memory under the experiment's limit.
struct MemoryProbe {
  bool fits = false;
  std::size_t peak_bytes = 0;            // the allocator's peak reserved bytes (what a cap bounds)
  std::size_t peak_allocated_bytes = 0;  // in live blocks: the growth with the batch, exactly
};
MemoryProbe probe_step_memory(const config::Experiment& experiment, int batch, const World& world);

// The memory of one rank, in bytes, for one (zero_stage, recompute).
struct MemoryEstimate {
  int zero_stage = 0;
  bool recompute = false;  // train.recompute BLOCKS
  bool keep_all = false;   // without BLOCKS, the experiment's KEEP_ALL (kept GELU outputs)
  double weights = 0;      // working weights, and O1's half casts of GEMM weights
  double gradients = 0;    // in the weights' dtype
  double master = 0;       // O2's fp32 master weights
  double moments = 0;  // optimizer state: SGD 1, AdamW 2 (3 with amsgrad), LAMB 2 x fp32 or bf16
  double activations_per_sample = 0;  // measured
  double workspaces = 0;  // measured: cuDNN/cuBLAS workspaces, temporaries, the loader's batches
  double nccl = 0;        // estimated, world size > 1
  double host = 0;        // train.offload: masters, moments and the pinned twins (not in total())
  bool offload = false;   // train.offload OPTIMIZER (host > 0 with it)
  // train.offload OPTIMIZER_AND_WEIGHTS (with `offload`, stage 3 only): ZeRO-3's shards of the
  // weights and of the reduced gradients in host memory too.
  bool offload_weights = false;
  // Everything at `batch` samples per GPU.
  double total(std::int64_t batch) const;
  // The largest batch whose total is at most `limit` bytes; 0 if not even 1 fits.
  std::int64_t largest_batch(double limit) const;
};

struct MemoryPlan {
  std::int64_t parameters = 0;
  int world_size = 1;
  int batch = 0;                          // the experiment's train.batch_per_gpu
  double limit = 0;                       // bytes; 0 = none given
  std::string device;                     // where the probes ran
  std::vector<int> probe_batches;         // the two batches measured
  std::vector<MemoryEstimate> estimates;  // zero_stage 0..3 x recompute NONE, BLOCKS
  // False when nothing was measured (no device of train.device here: a login node plans a GPU
  // job from the counted parts alone; activations and workspaces are unknown).
  bool measured = true;
  std::int64_t global_batch = 0;  // train.global_batch, 0 when unset
  double host_limit = 0;          // host memory per node in bytes (--host-memory-mb); 0 = none
  int gpus_per_node = 1;          // ranks sharing one node's host memory

  // Whether a row's pinned host memory, for every rank of a node, fits host_limit (or none given).
  bool host_fits(const MemoryEstimate& m) const;
  // Whether a row fits both limits at `batch`.
  bool fits(const MemoryEstimate& m, std::int64_t batch) const;

  // The largest per-GPU batch under the limit that the run can use: with train.global_batch set,
  // one that divides global_batch / world_size (accumulation is derived from it); 0 when none.
  std::int64_t usable_batch(const MemoryEstimate& m) const;
};

// The counted (not measured) parts for `world_size` ranks: weights, gradients, master, moments
// and nccl of every (stage, recompute), activations and workspaces left zero. `parameters`, if
// given, receives the model's parameter count.
std::vector<MemoryEstimate> counted_memory(const config::Experiment& experiment, int world_size,
                                           std::int64_t* parameters = nullptr);

// Counts, then (with `measure`) measures with four probes (two batches, recompute NONE and
// BLOCKS) on this process's device, without the experiment's memory limit. Throws InputError when a
// probe does not fit even without a limit.
MemoryPlan plan_memory(const config::Experiment& experiment, int world_size, double limit_bytes,
                       const World& world, bool measure = true);

// The plan's rows again with train.offload OPTIMIZER (the device kernels' update), after them,
// then ZeRO-3's with OPTIMIZER_AND_WEIGHTS: what moving the masters and moments (and the weights'
// and gradients' shards) to host memory buys when no row on the device fits. The activations and
// workspaces are the measured rows' (the probes ran without offload). Only the rows that offload
// more than the experiment already does.
void add_offload_rows(const config::Experiment& experiment, MemoryPlan* plan);

// The batch the linear model (peak = reserved at batch 1 + (batch - 1) x the growth of the
// allocated peak from batch 1 to 2) predicts to be the largest under `limit` bytes; 0 when it
// cannot tell (no growth, no limit).
std::int64_t predicted_largest_batch(const MemoryProbe& at1, const MemoryProbe& at2, double limit);

}  // namespace kiln::train
