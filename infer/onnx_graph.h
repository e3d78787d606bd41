#pragma once
// OnnxGraphBuilder: appends nodes, initializers and constants to an ONNX GraphProto under unique
// value names. The per-layer exporters (infer/onnx_layers.cc) speak only to it.
//
// Values carry their shape with the batch dimension first; under a dynamic batch that dimension
// holds a placeholder (1), so exporters read only the rank and the other dimensions from it and
// reshape with 0 ("copy this dimension") for the batch.
// Floating tensors (activations and initializers) are float32, or float16 under `half`.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "layers/layer.h"
#include "third_party/onnx/onnx.pb.h"

namespace kiln::infer {

struct OnnxValue {
  std::string name;
  Shape shape;  // batch first (a placeholder under a dynamic batch)
};

// Node attributes.
onnx::AttributeProto onnx_int(const std::string& name, std::int64_t value);
onnx::AttributeProto onnx_float(const std::string& name, double value);
onnx::AttributeProto onnx_ints(const std::string& name, const std::vector<std::int64_t>& values);
onnx::AttributeProto onnx_string(const std::string& name, const std::string& value);

class OnnxGraphBuilder {
 public:
  OnnxGraphBuilder(onnx::GraphProto* graph, int opset, bool half);

  int opset() const { return opset_; }
  bool half() const { return half_; }
  // onnx::TensorProto::FLOAT, or FLOAT16 under half.
  std::int32_t float_type() const;

  // A parameter or buffer as an initializer under its checkpoint name (PyTorch's), added once
  // however often it is used (BERT's tied decoder reads the word embeddings).
  std::string weight(const std::string& name, const Tensor& value);
  std::string weight(const Parameter& p) { return weight(p.name, p.value); }
  std::string weight(const Buffer& b) { return weight(b.name, b.value); }
  // Constant initializers: int64 (shapes, indices, axes) and floating scalars.
  std::string int64s(const std::string& hint, const std::vector<std::int64_t>& values,
                     const Shape& shape);
  std::string int64s(const std::string& hint, const std::vector<std::int64_t>& values) {
    return int64s(hint, values, {static_cast<std::int64_t>(values.size())});
  }
  std::string scalar(const std::string& hint, double value);

  // Appends a node `op` and returns its `outputs` output names, each unique, derived from hint
  // (the layer's name, so that a graph viewer shows where a node came from).
  std::vector<std::string> node(const std::string& op, const std::vector<std::string>& inputs,
                                int outputs, const std::string& hint,
                                const std::vector<onnx::AttributeProto>& attributes = {});
  std::string node1(const std::string& op, const std::vector<std::string>& inputs,
                    const std::string& hint,
                    const std::vector<onnx::AttributeProto>& attributes = {}) {
    return node(op, inputs, 1, hint, attributes).front();
  }
  // A unique value name from a hint.
  std::string unique(const std::string& hint);

 private:
  onnx::GraphProto* graph_;
  int opset_;
  bool half_;
  std::map<std::string, int> used_;  // name -> times handed out
  std::map<std::string, std::string> weights_;
};

}  // namespace kiln::infer
