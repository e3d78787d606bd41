#pragma once
// DataParallel: synchronous data parallelism by bucketed gradient all-reduce, overlapped with
// backward (PyTorch DDP's scheme).
//
// Construction (collective): parameters and buffers are broadcast from rank 0; every
// Parameter::grad is REPLACED by a view into a flat bucket buffer (one per ~bucket_bytes, one
// dtype per bucket). Parameters fill buckets in reverse registration order, which is roughly the
// order backward produces their gradients; offsets are padded to 256 bytes. The layout depends
// only on the parameters (names, shapes, dtypes) and the options, and ranks check that theirs
// agree.
//
// One optimizer step:
//   dp.zero_grad();                          // one fill per bucket
//   ctx.on_grad_ready = dp.grad_ready_hook();
//   for each micro-batch i of k:
//     dp.set_accumulation_micro_step(i + 1 < k);   // no all-reduce on accumulation micro-steps
//     forward; backward;   // a bucket whose last gradient is written is all-reduced (averaged
//                          // over ranks) on the communication stream while backward goes on
//   dp.finish();   // all-reduces buckets whose hook never fired (unused parameters), then makes
//                  // the compute stream wait for every bucket; gradients are then averaged
//   optimizer step
//
// Compression (options.compression, docs/data_parallel.md): Half casts f32 buckets to half around
// the all-reduce; PowerSgd hands a bucket with matrices worth compressing to a PowerSgdBucket
// (comm/powersgd.h), which runs on the communication stream like the plain all-reduce.
//
// Buckets are launched in bucket order on every rank (a bucket that is ready waits for the ones
// before it), so ranks whose gradients become ready in different orders still issue the same
// sequence of collectives.
//
// A gradient must be complete when its owner layer's backward calls the hook: a parameter shared
// by several layers (tied weights) must be owned by the layer whose backward runs last.
//
// ZeRO (options.zero_stage 1 or 2): each bucket is padded to a multiple of the world size and
// split into size() contiguous shards; rank r owns shard r of every bucket. A full bucket is
// reduce-scattered (averaged) instead of all-reduced, into the bucket's shard gradient, which is
// what the optimizer reads (shard_pieces()); after the update, gather_parameters() all-gathers
// every bucket's updated values so that each rank holds the whole model again. Stage 2 also
// releases the full gradient buffers in finish() (reallocated by zero_grad()), so between steps
// a rank holds only its shard of the reduced gradients; Parameter::grad is then undefined.
//
// ZeRO-3 (zero_stage 3): stage 2's gradients (no full buffer allocated before backward reaches
// it, construction included), and the weights sharded too. The constructor takes weights on the
// device or on the host and builds each bucket on the device in turn, so that a rank never holds
// the whole model there, not even at start. Buckets follow
// options.units (a new bucket starts where the unit changes), and between uses a rank keeps only
// its shard of each bucket's values: Parameter::value then has its shape and dtype but no
// memory (a null data pointer). acquire_values() all-gathers the buckets holding the given
// parameters (the first holder gathers, views become Parameter::value) and release_values() drops
// them when their last holder lets go. The optimizer's pieces are views into the value shards, so
// an update changes them in place; gather_parameters() then refreshes only the buckets held at that
// time.
//
// Shards in host memory (options.shards_in_host_memory, stage 3: train.offload
// OPTIMIZER_AND_WEIGHTS): each bucket's value shard and reduced-gradient shard live in pinned host
// memory that the device addresses in place, so the device holds weights and gradients only
// while a unit uses them. A gather first copies the shard in (on the stream the gather runs on;
// with one rank the copy is the gather), a reduction's shard is copied out as it ends; the
// optimizer's kernels update the shards where they are. On the CPU the shards are host memory as
// everything is: the arithmetic, and so the weights, are stage 3's bit for bit.
//
// Accumulation in the shards (options.accumulate_in_shards, stage 2/3): an accumulation
// micro-step reduces its buckets as a last micro-step does, the first into the shards and the
// later ones into a device copy added to them, and end_micro_step() then releases the full
// buffers, so they hold one micro-batch's gradients at most. The sums are whole buffers' up to
// the order of additions (a micro-batch's gradient is summed before it is added).

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "comm/communicator.h"
#include "comm/gradient_reduction.h"
#include "comm/powersgd.h"
#include "core/parameter.h"
#include "core/safetensors.h"
#include "core/stream.h"
#include "core/tensor.h"

namespace kiln {

// parallel.compression of the experiment.
enum class GradientCompression {
  None,      // all-reduce the gradients as they are
  Half,      // f32 buckets travel in half_dtype (half the traffic; sums rounded to half)
  PowerSgd,  // matrices rank-r compressed from powersgd_start_step on (comm/powersgd.h)
};
const char* gradient_compression_name(GradientCompression c);  // "none", "half", "powersgd"

struct DataParallelOptions {
  std::size_t bucket_bytes = 25u << 20;  // 25 MiB; a larger parameter gets a bucket of its own
  // The first bucket (the last layers' gradients, ready first) closes at this size, so the first
  // all-reduce starts early in backward (PyTorch DDP: 1 MiB); 0 = bucket_bytes.
  std::size_t first_bucket_bytes = 0;
  GradientCompression compression = GradientCompression::None;
  DType half_dtype = DType::BF16;  // of Half
  // PowerSgd: the rank, Q's seed; finished optimizer steps before it are all-reduced plainly
  // (PyTorch's start_powerSGD_iter).
  PowerSgdOptions powersgd;
  std::int64_t powersgd_start_step = 1000;
  // Broadcast parameters and buffers from rank 0 in the constructor.
  bool broadcast_at_start = true;
  // 0: all-reduce; 1: reduce-scatter into per-rank gradient shards; 2: also free the full
  // gradient buffers between steps; 3: also shard the weights (see above).
  int zero_stage = 0;
  // Stage 3: the parameters gathered together (one model block each); a bucket never spans two.
  // Parameters in no unit share a bucket run of their own. Ignored below stage 3.
  std::vector<std::vector<const Parameter*>> units;
  // Stage 3: the shards in pinned host memory (see above); refused below stage 3.
  bool shards_in_host_memory = false;
  // Stage 2/3 with accumulation: micro-steps reduce too, each bucket's sum added into its shard
  // (see above); refused below stage 2.
  bool accumulate_in_shards = false;
};

// One contiguous range of one parameter inside this rank's shard of a bucket (ZeRO).
struct ShardPiece {
  Parameter* parameter = nullptr;
  std::int64_t offset = 0;  // into the flattened parameter
  std::int64_t numel = 0;
  Tensor grad;  // (numel,) view into the bucket's reduced shard gradient
  // Stage 3: (numel,) view into the bucket's value shard, the piece's only copy between uses;
  // undefined below stage 3 (the piece is then a range of Parameter::value).
  Tensor value;
  std::size_t bucket = 0;
  std::int64_t shard_offset = 0;  // of the piece's first element in the bucket's shard
};

struct GradientBucketInfo {
  DType dtype = DType::F32;
  std::int64_t numel = 0;                    // of the flat buffer, padding included
  std::vector<std::string> parameter_names;  // in layout order
};

// When each bucket's reduction happened in one step, in ms from a reference point the caller
// records just before the step (an event on the compute stream, or the host clock on the CPU).
struct BucketTiming {
  double ready_ms = 0;  // the compute stream had written the bucket's last gradient
  double start_ms = 0;  // its reduction began (the comm stream got to it)
  double end_ms = 0;    // its reduction finished
};
struct CommStepTiming {
  std::vector<BucketTiming> buckets;  // in bucket order
  double backward_end_ms = 0;         // finish() was called: backward's compute is queued
  double reduced_ms = 0;              // the compute stream has every reduced gradient
  // Communication not hidden behind backward: from backward's end to the last reduction's end.
  // On the CPU the collectives block the compute thread, so the buckets reduced during backward
  // count as well.
  double exposed_ms = 0;
};

class DataParallel {
 public:
  // Collective. Parameters (values and grads) live on comm.device(); buffers too.
  DataParallel(std::vector<Parameter*> parameters, std::vector<Buffer*> buffers, Communicator& comm,
               DataParallelOptions options = {});
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // For Context::on_grad_ready; it refers to this object, which must outlive its use.
  std::function<void(Parameter&)> grad_ready_hook();
  // Call once per optimizer step after the last backward (see above).
  void finish();
  // true: the coming backward only accumulates (no all-reduce, finish() does nothing), or with
  // options.accumulate_in_shards reduces into the shards, ended by end_micro_step().
  void set_accumulation_micro_step(bool micro_step);
  // After an accumulation micro-step's backward: with options.accumulate_in_shards, reduces what
  // is left and waits as finish() does (no optimizer step is counted); else nothing.
  void end_micro_step();
  bool accumulation_micro_step() const { return micro_step_; }
  // Zeroes every bucket (one fill per bucket) on the current stream.
  void zero_grad();
  // Forgets the bucket bookkeeping of a backward that was not carried out (a CUDA graph capture
  // that failed part way): the next backward starts afresh.
  void reset_step();
  // ZeRO-2 without full gradient buffers at the start of backward: zero_grad_lazily() zeroes the
  // buffers that exist and leaves released ones unallocated; the hook, called with the parameters
  // a layer's backward is about to write as that backward begins (layers/ adapts it to
  // Context::on_layer), allocates, zeroed, every bucket holding one of their gradients. Where the
  // collectives block the caller (MPI), a bucket is released again as soon as it is
  // reduce-scattered, so a rank holds few full buckets at a time; on a communication stream, as
  // the next bucket is launched (the compute stream waits for its reduce-scatter first).
  // Stages 0 and 1: zero_grad_lazily() is zero_grad() and the hook is empty.
  void zero_grad_lazily();
  std::function<void(const std::vector<Parameter*>& written)> gradient_allocation_hook();

  // Optimizer steps finished (finish() calls outside accumulation micro-steps): PowerSgd starts
  // compressing at options.powersgd_start_step. set_finished_steps restores it on resume.
  std::int64_t finished_steps() const { return finished_steps_; }
  void set_finished_steps(std::int64_t steps) { finished_steps_ = steps; }
  // After a step whose reduced gradients were not finite (the loss scaler skipped it): PowerSGD's
  // error feedback and Q hold the NaN too, so they start afresh.
  void reset_compression_state();
  // PowerSGD's per-rank state ("bucket<i>.error", "bucket<i>.q"; empty without PowerSgd) and its
  // restore (tensors of the same names and sizes; InputError naming `where` otherwise).
  NamedTensors compression_state() const;
  void load_compression_state(const NamedTensors& state, const std::string& where);

  // Collective: rank 0's values to every rank (e.g. BN running stats before eval/checkpoint).
  void broadcast_buffers();
  void broadcast_parameters();

  std::size_t bucket_count() const { return buckets_.size(); }
  std::vector<GradientBucketInfo> bucket_layout() const;
  std::string layout_summary() const;  // one line per bucket
  std::uint64_t layout_hash() const { return layout_hash_; }
  // All-reduces started since construction (one per bucket per step): for tests and metrics.
  std::uint64_t bucket_all_reduces() const { return bucket_all_reduces_; }
  Communicator& communicator() { return comm_; }
  const std::vector<Parameter*>& parameters() const { return params_; }

  // Records when each bucket is ready, starts and ends (CUDA events, or host clocks on the CPU);
  // off by default since on CUDA it adds three event records per bucket.
  void set_timing(bool on);
  // The last finished step's timing relative to `reference` (recorded on the compute stream
  // before the step) or, on the CPU, to `host_reference`. Synchronises with the device.
  CommStepTiming step_timing(const Event* reference,
                             std::chrono::steady_clock::time_point host_reference) const;

  int zero_stage() const { return options_.zero_stage; }
  // ZeRO: this rank's pieces of every parameter, in bucket order (empty when zero_stage is 0).
  const std::vector<ShardPiece>& shard_pieces() const { return pieces_; }
  // ZeRO, collective: every rank's updated pieces of Parameter::value reach every rank (stage 3:
  // the buckets held now; the others are gathered when next acquired).
  void gather_parameters();
  // Stage 3, collective (every rank calls them with the same parameters, in the same order):
  // the buckets holding `parameters` gathered whole, their values bound to Parameter::value,
  // until each holder has released them. `written`: what was written into the whole values
  // becomes this rank's shard (loading a checkpoint). Other stages: nothing to do.
  void acquire_values(const std::vector<Parameter*>& parameters);
  void release_values(const std::vector<Parameter*>& parameters, bool written = false);
  // Stage 3, collective: starts gathering the buckets of `parameters` that are not held on the
  // communication stream, so that a later acquire_values() of them waits only for that gather
  // (the next block's weights while this one computes). finish() drops the ones never acquired.
  void prefetch_values(const std::vector<Parameter*>& parameters);
  // Stage 3: buckets of values all-gathered since construction (acquired, prefetched or refreshed
  // after an update): for tests and metrics.
  std::uint64_t value_gathers() const { return value_gathers_; }
  // Stage 3: bytes of the whole value buffers held now and of this rank's value shards.
  std::size_t value_buffer_bytes() const;
  // ZeRO: bytes of the full gradient buffers and of this rank's reduced shards now allocated.
  std::size_t gradient_buffer_bytes() const;

 private:
  // One point in time: an event on CUDA, the host clock on the CPU.
  struct TimePoint {
    std::unique_ptr<Event> event;
    std::chrono::steady_clock::time_point host;
  };
  void mark(TimePoint& point, void* stream);

  struct Bucket {
    DType dtype;
    std::int64_t numel = 0;
    Tensor flat;   // (numel,) the gradients' storage
    Tensor shard;  // ZeRO: (numel / size,) this rank's reduced shard
    std::vector<Parameter*> params;
    std::vector<std::int64_t> offsets;
    Tensor values;            // stage 3: (numel,) the whole values while held, else undefined
    Tensor value_shard;       // stage 3: (numel / size,) this rank's values between uses
    int holders = 0;          // stage 3: acquire_values() calls not yet released
    bool prefetched = false;  // stage 3: `values` being gathered, not yet acquired
    std::unique_ptr<Event> gathered;  // stage 3, on a communication stream: the prefetch's end
    // Shards in host memory: the device copies of the value shard a gather reads and of the
    // reduced shard a reduction writes, kept until the stream that allocated them has waited.
    Tensor staged_values;
    Tensor staged_shard;
    std::unique_ptr<Event> reduced;  // stage 2/3, on a communication stream: its reduction's end
    int pending = 0;                 // parameters whose hook has not fired this step
    bool launched = false;
    TimePoint ready, start, end;  // with set_timing(true)
  };
  struct Slot {
    std::size_t bucket;
    std::size_t index;  // into ready_
  };
  void on_grad_ready(Parameter& p);
  void launch_ready_buckets();
  void launch(Bucket& bucket);
  void reduce_remaining();  // buckets whose hook never fired, then the compute stream waits
  void bind_gradients(Bucket& bucket);           // Parameter::grad = views into bucket.flat
  void allocate_gradients(Bucket& bucket);       // stage 2: a released bucket, zeroed and bound
  void release_gradients(Bucket& bucket);        // stage 2: the full buffer goes, grads undefined
  void release_after_reduction(Bucket& bucket);  // stage 2/3 (see launch())
  void gather_values(Bucket& bucket);            // stage 3: value_shard of every rank -> values
  // Stage 3: queues the gather of bucket.values (allocated) from every rank's value shard on the
  // current stream, or on the communication stream when `on_comm_stream`.
  void all_gather_values(Bucket& bucket, bool on_comm_stream);
  void bind_values(Bucket& bucket);    // stage 3: Parameter::value = views into values
  void shard_values(Bucket& bucket);   // stage 3: this rank's part of the values -> shard
  void unbind_values(Bucket& bucket);  // stage 3: values go, Parameter::value unallocated
  std::vector<std::size_t> buckets_of(const std::vector<Parameter*>& parameters) const;

  Communicator& comm_;
  DataParallelOptions options_;
  std::unique_ptr<GradientReduction> reduction_;  // how a bucket is reduced (the strategy)
  std::vector<Parameter*> params_;
  std::vector<Buffer*> buffers_;
  std::vector<Bucket> buckets_;
  std::vector<ShardPiece> pieces_;
  std::unordered_map<const Parameter*, Slot> slots_;
  std::vector<char> ready_;
  std::size_t next_launch_ = 0;
  Bucket* releasing_ = nullptr;  // stage 2/3 on a communication stream: released at the next launch
  bool micro_step_ = false;
  bool shards_hold_partial_sums_ = false;  // accumulate_in_shards: a micro-step reduced into them
  std::uint64_t layout_hash_ = 0;
  std::uint64_t bucket_all_reduces_ = 0;
  std::uint64_t value_gathers_ = 0;
  bool timing_ = false;
  TimePoint backward_end_, reduced_;
  std::int64_t finished_steps_ = 0;
};

}  // namespace kiln
