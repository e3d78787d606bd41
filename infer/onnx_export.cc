#include "infer/onnx_export.h"

#include "core/check.h"
#include "infer/onnx_graph.h"
#include "infer/onnx_layers.h"

namespace kiln::infer {
namespace {

// The IR version each opset was released with (onnx/helper.py's VERSION_TABLE).
std::int64_t ir_version(int opset) {
  if (opset <= 18) return 8;
  if (opset <= 20) return 9;
  return 10;
}

void set_value_info(onnx::ValueInfoProto* info, const std::string& name, std::int32_t elem_type,
                    const Shape& shape, bool dynamic_batch) {
  info->set_name(name);
  onnx::TypeProto_Tensor* t = info->mutable_type()->mutable_tensor_type();
  t->set_elem_type(elem_type);
  for (std::size_t i = 0; i < shape.size(); ++i) {
    onnx::TensorShapeProto_Dimension* d = t->mutable_shape()->add_dim();
    if (i == 0 && dynamic_batch) {
      d->set_dim_param("batch");
    } else {
      d->set_dim_value(shape[i]);
    }
  }
}

}  // namespace

std::string export_onnx(Model& model, const OnnxExportOptions& options) {
  if (options.opset < kOnnxMinOpset || options.opset > kOnnxMaxOpset) {
    throw InputError("ONNX export: opset " + std::to_string(options.opset) + " is not supported (" +
                     std::to_string(kOnnxMinOpset) + " to " + std::to_string(kOnnxMaxOpset) +
                     "; 17 has LayerNormalization, 20 Gelu)");
  }
  if (options.batch < 0) throw InputError("ONNX export: the batch must be positive");
  model.net->set_training(false);

  onnx::ModelProto proto;
  proto.set_ir_version(ir_version(options.opset));
  proto.set_producer_name("kiln");
  proto.set_producer_version(options.producer_version);
  proto.set_doc_string("exported by kiln export: the eval-mode network");
  onnx::OperatorSetIdProto* opset = proto.add_opset_import();
  opset->set_domain("");
  opset->set_version(options.opset);
  for (const auto& [key, value] : options.metadata) {
    onnx::StringStringEntryProto* p = proto.add_metadata_props();
    p->set_key(key);
    p->set_value(value);
  }

  onnx::GraphProto* graph = proto.mutable_graph();
  graph->set_name(options.graph_name);
  OnnxGraphBuilder builder(graph, options.opset, options.half);
  const bool dynamic = options.batch == 0;
  Shape input_shape = {dynamic ? 1 : options.batch};
  input_shape.insert(input_shape.end(), model.sample_shape.begin(), model.sample_shape.end());
  const bool ids = model.input_dtype == DType::I64;
  const std::string input_name = ids ? "input_ids" : "input";
  set_value_info(graph->add_input(), input_name,
                 ids ? onnx::TensorProto::INT64 : builder.float_type(), input_shape, dynamic);

  OnnxValue y = export_layer(builder, *model.net, {builder.unique(input_name), input_shape});
  const Shape expected = model.net->output_shape(input_shape);
  if (y.shape != expected) {
    throw Error("ONNX export: the graph's output shape " + shape_str(y.shape) +
                " differs from the model's " + shape_str(expected));
  }
  graph->add_node()->CopyFrom([&] {
    onnx::NodeProto n;
    n.set_op_type("Identity");
    n.set_name("logits#node");
    n.add_input(y.name);
    n.add_output("logits");
    return n;
  }());
  set_value_info(graph->add_output(), "logits", builder.float_type(), y.shape, dynamic);
  std::string bytes;
  if (!proto.SerializeToString(&bytes)) {
    throw Error("ONNX export: the model does not serialize (over protobuf's 2 GiB limit?)");
  }
  return bytes;
}

}  // namespace kiln::infer
