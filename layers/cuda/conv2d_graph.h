#pragma once
// Convolutions through cuDNN's graph (backend) API: one execution plan per geometry, direction
// and options, built once (heuristics, or timing the heuristics' best candidates in benchmark
// mode) and cached; a call then only binds pointers and executes. cuDNN 9's legacy
// cudnnConvolution* calls cost 100-300 us of host time each, more than the kernels of a
// ResNet-50 step at small batches. Internal to layers/cuda/conv2d.cc.

#include <cstddef>

#include "layers/conv2d.h"

namespace kiln::cudnn_conv::graph {

enum class Direction { Forward, BackwardData, BackwardFilter };

// The index of a cached plan for g, or -1 when the graph API has no usable one (the caller uses
// the legacy call): f64, grouped convolutions, KILN_CONV_LEGACY=1, or no engine passing the
// options' filters (no TF32 for f32, fp32 accumulation for halves, determinism when asked).
// beta: 0 writes the output, 1 accumulates (weight gradients).
int plan_for(const Conv2dGeometry& g, const ConvAlgorithmOptions& o, Direction direction,
             double beta);

// Runs plan `plan` on (forward) x, w -> y; (backward data) dy, w -> dx; (backward filter)
// x, dy -> dw, its workspace from the caching allocator of `device`. Returns false, having
// launched nothing, when a pointer is not 16-byte aligned.
bool execute(int plan, const void* a, const void* b, void* out, Device device);

}  // namespace kiln::cudnn_conv::graph
