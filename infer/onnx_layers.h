#pragma once
// Per-layer ONNX exporters, in a registry keyed by Layer::type() and filled explicitly
// (infer/onnx_layers.cc). Each writes the layer's eval-mode forward: batch norm with its running
// statistics, dropout as the identity, attention as MatMul/Softmax, GELU from Erf (or Gelu from
// opset 20).

#include <string>
#include <vector>

#include "infer/onnx_graph.h"

namespace kiln::infer {

// Appends `layer` applied to `x` to the graph and returns its output. InputError naming the layer
// and listing the exportable types when there is no exporter for its type.
OnnxValue export_layer(OnnxGraphBuilder& graph, Layer& layer, const OnnxValue& x);

// The layer types with an exporter, sorted.
std::vector<std::string> onnx_layer_types();

}  // namespace kiln::infer
