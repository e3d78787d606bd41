#pragma once
// FP8 delayed scaling across data-parallel ranks (precision.fp8, issue 37): each rank records the
// amax of what it cast, so without this every rank would scale by its own batches. Once per
// optimizer step, after the backward, the amax histories of every FP8 projection are merged (one
// all-reduce of their elementwise largest, Transformer Engine's amax reduction) and each next
// scale is taken again from the merged history, so that every rank casts the next step at the
// same scales and holds the same scaling state (the one a checkpoint saves).
//
// The states travel whole: at construction every state buffer moves into one tensor (each buffer
// a view of its rows), so a step reduces that tensor in place, with no copy. The largest of every
// field is what the ranks agree on (a history slot a rank skipped after an overflow is then the
// others'; the overflow counters become the largest count).

#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "core/parameter.h"
#include "layers/fp8_projection.h"

namespace kiln::train {

class Fp8AmaxReduction {
 public:
  // `states`: the FP8 scaling buffers (fp8_scaling_buffers), each Fp8Projection::state_shape, on
  // the communicator's device; from now on each is a view into one tensor (their values kept).
  Fp8AmaxReduction(std::vector<Buffer*> states, const Fp8Settings& settings, Communicator& comm);
  // Collective: merge the histories and set the next scales (on the compute stream: graphable).
  void reduce();

 private:
  std::vector<Buffer*> states_;
  Fp8Settings settings_;
  Communicator& comm_;
  Tensor packed_;  // (3 x projections, row length): every state's storage
};

// One when the run has several ranks and FP8 projections with delayed scaling (Current scaling
// measures each tensor before casting it: its history sets no scale); null otherwise.
std::unique_ptr<Fp8AmaxReduction> make_fp8_amax_reduction(const std::vector<Buffer*>& buffers,
                                                          const Fp8Settings& settings,
                                                          Communicator* comm);

}  // namespace kiln::train
