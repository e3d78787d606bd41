#pragma once
// How one gradient bucket is reduced over the ranks: one class per strategy, chosen once from
// DataParallelOptions (make_gradient_reduction). DataParallel owns the buckets and decides when
// a bucket is reduced (its hooks, in bucket order); the strategy decides how, and keeps whatever
// state that needs (PowerSGD's error feedback and Q, for checkpoints).
//   AllReduce        the gradients as they are, averaged (parallel.compression NONE)
//   HalfAllReduce    f32 buckets travel in half (HALF)
//   PowerSgdReduce   matrices rank-r compressed from powersgd_start_step on (POWERSGD)
//   ReduceScatter    each rank gets its shard of the average (ZeRO, parallel.zero_stage > 0)

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/powersgd.h"
#include "core/safetensors.h"
#include "core/tensor.h"

namespace kiln {

class GradientReduction {
 public:
  virtual ~GradientReduction() = default;
  // Bucket `index` (numbered from 0, in order) of `numel` elements of `dtype` exists; `grads`
  // are its parameters' gradients, views into it, in layout order.
  virtual void add_bucket(std::size_t index, DType dtype, std::int64_t numel,
                          const std::vector<Tensor>& grads);
  // Reduces bucket `index` on the communication stream, which already waits for its gradients:
  // `flat` becomes the average over ranks, or (scatters()) `shard` this rank's part of it.
  // `finished_steps`: optimizer steps completed before this one.
  virtual void reduce(std::size_t index, Tensor& flat, Tensor& shard,
                      std::int64_t finished_steps) = 0;
  // Whether each rank receives only its shard of the reduced gradients (ZeRO).
  virtual bool scatters() const { return false; }
  // After a step whose gradients were not finite: compression's state starts over.
  virtual void reset() {}
  // The strategy's own state, named "bucket<i>.<name>" (empty when it keeps none).
  virtual NamedTensors state() const { return {}; }
  // InputError naming `where` when `state` lacks what this strategy keeps.
  virtual void load_state(const NamedTensors& state, const std::string& where);
};

struct GradientReductionOptions {
  enum class Kind { AllReduce, HalfAllReduce, PowerSgd, ReduceScatter };
  Kind kind = Kind::AllReduce;
  DType half_dtype = DType::BF16;  // HalfAllReduce
  PowerSgdOptions powersgd;        // PowerSgd: the rank and Q's seed (bucket i draws seed + i)
  std::int64_t powersgd_start_step = 0;
};

std::unique_ptr<GradientReduction> make_gradient_reduction(const GradientReductionOptions& options,
                                                           Communicator& comm);

}  // namespace kiln
