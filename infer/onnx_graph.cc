#include "infer/onnx_graph.h"

#include <cctype>

#include "core/check.h"

namespace kiln::infer {
namespace {

// ONNX's element type of a Kiln tensor written as an initializer.
std::int32_t onnx_type(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return onnx::TensorProto::FLOAT;
    case DType::F16:
      return onnx::TensorProto::FLOAT16;
    case DType::I64:
      return onnx::TensorProto::INT64;
    case DType::I32:
      return onnx::TensorProto::INT32;
    default:
      throw InputError(std::string("ONNX export: no initializer type for ") + dtype_name(dtype));
  }
}

// Raw little-endian bytes, as ONNX's raw_data stores them (x86 and Arm hosts are little-endian).
void set_tensor(onnx::TensorProto* proto, const std::string& name, const Tensor& value) {
  Tensor host = value.to(Device::cpu()).contiguous();
  proto->set_name(name);
  proto->set_data_type(onnx_type(host.dtype()));
  for (std::int64_t d : host.shape()) proto->add_dims(d);
  proto->set_raw_data(static_cast<const char*>(host.data()), host.nbytes());
}

}  // namespace

onnx::AttributeProto onnx_int(const std::string& name, std::int64_t value) {
  onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto::INT);
  a.set_i(value);
  return a;
}

onnx::AttributeProto onnx_float(const std::string& name, double value) {
  onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto::FLOAT);
  a.set_f(static_cast<float>(value));
  return a;
}

onnx::AttributeProto onnx_ints(const std::string& name, const std::vector<std::int64_t>& values) {
  onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto::INTS);
  for (std::int64_t v : values) a.add_ints(v);
  return a;
}

onnx::AttributeProto onnx_string(const std::string& name, const std::string& value) {
  onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto::STRING);
  a.set_s(value);
  return a;
}

OnnxGraphBuilder::OnnxGraphBuilder(onnx::GraphProto* graph, int opset, bool half)
    : graph_(graph), opset_(opset), half_(half) {}

std::int32_t OnnxGraphBuilder::float_type() const {
  return half_ ? onnx::TensorProto::FLOAT16 : onnx::TensorProto::FLOAT;
}

std::string OnnxGraphBuilder::unique(const std::string& hint) {
  std::string base = hint.empty() ? "value" : hint;
  int& n = used_[base];
  return n++ == 0 ? base : base + "_" + std::to_string(n - 1);
}

std::string OnnxGraphBuilder::weight(const std::string& name, const Tensor& value) {
  auto it = weights_.find(name);
  if (it != weights_.end()) return it->second;
  std::string unique_name = unique(name);
  Tensor v = value;
  if (is_floating(v.dtype())) v = v.to(half_ ? DType::F16 : DType::F32);
  set_tensor(graph_->add_initializer(), unique_name, v);
  weights_[name] = unique_name;
  return unique_name;
}

std::string OnnxGraphBuilder::int64s(const std::string& hint,
                                     const std::vector<std::int64_t>& values, const Shape& shape) {
  std::string name = unique(hint);
  set_tensor(graph_->add_initializer(), name, Tensor::from_vector(values, shape));
  return name;
}

std::string OnnxGraphBuilder::scalar(const std::string& hint, double value) {
  std::string name = unique(hint);
  Tensor t = Tensor::full({}, value, DType::F32);
  set_tensor(graph_->add_initializer(), name, half_ ? t.to(DType::F16) : t);
  return name;
}

std::vector<std::string> OnnxGraphBuilder::node(
    const std::string& op, const std::vector<std::string>& inputs, int outputs,
    const std::string& hint, const std::vector<onnx::AttributeProto>& attributes) {
  onnx::NodeProto* n = graph_->add_node();
  n->set_op_type(op);
  const std::string base = (hint.empty() ? std::string() : hint + "/") + op;
  n->set_name(unique(base + "#node"));
  for (const std::string& in : inputs) n->add_input(in);
  std::vector<std::string> names;
  for (int i = 0; i < outputs; ++i) {
    names.push_back(unique(base));
    n->add_output(names.back());
  }
  for (const auto& a : attributes) *n->add_attribute() = a;
  return names;
}

}  // namespace kiln::infer
