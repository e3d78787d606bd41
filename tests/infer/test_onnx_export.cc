// The ONNX exporter's units: graph structure, names, types and refusals. The numbers are checked
// against ONNX Runtime by the script tests beside this file.

#include <gtest/gtest.h>

#include <set>

#include "core/check.h"
#include "infer/onnx_export.h"
#include "infer/onnx_layers.h"
#include "layers/linear.h"
#include "layers/models/model.h"
#include "third_party/onnx/onnx.pb.h"

namespace kiln::infer {
namespace {

onnx::ModelProto parse(const std::string& bytes) {
  onnx::ModelProto m;
  EXPECT_TRUE(m.ParseFromString(bytes));
  return m;
}

std::multiset<std::string> ops(const onnx::ModelProto& m) {
  std::multiset<std::string> out;
  for (const auto& n : m.graph().node()) out.insert(n.op_type());
  return out;
}

Model small(const std::string& name) {
  ModelOptions o;
  o.name = name;
  o.mlp_hidden = {16};
  o.dropout = 0.3;
  return make_model(o);
}

TEST(OnnxExport, MlpGraphNamesAndTypes) {
  Model model = small("mlp");
  OnnxExportOptions o;
  o.metadata = {{"input.layout", "NCHW"}};
  onnx::ModelProto m = parse(export_onnx(model, o));
  EXPECT_EQ(m.ir_version(), 8);
  ASSERT_EQ(m.opset_import_size(), 1);
  EXPECT_EQ(m.opset_import(0).version(), 17);
  ASSERT_EQ(m.graph().input_size(), 1);
  const auto& in = m.graph().input(0).type().tensor_type();
  EXPECT_EQ(m.graph().input(0).name(), "input");
  EXPECT_EQ(in.elem_type(), onnx::TensorProto::FLOAT);
  EXPECT_EQ(in.shape().dim(0).dim_param(), "batch");
  EXPECT_EQ(in.shape().dim(2).dim_value(), 28);
  EXPECT_EQ(m.graph().output(0).name(), "logits");
  std::set<std::string> initializers;
  for (const auto& t : m.graph().initializer()) initializers.insert(t.name());
  for (const char* n : {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}) {
    EXPECT_EQ(initializers.count(n), 1u) << n;
  }
  EXPECT_EQ(ops(m).count("Gemm"), 2u);
  EXPECT_EQ(ops(m).count("Relu"), 1u);
  ASSERT_EQ(m.metadata_props_size(), 1);
  EXPECT_EQ(m.metadata_props(0).value(), "NCHW");
}

TEST(OnnxExport, EvalFormNoDropoutBatchNormWithRunningStatistics) {
  Model model = small("fashion_cnn");
  onnx::ModelProto m = parse(export_onnx(model, {}));
  EXPECT_EQ(ops(m).count("Dropout"), 0u);
  EXPECT_EQ(ops(m).count("BatchNormalization"), 2u);
  for (const auto& n : m.graph().node()) {
    if (n.op_type() == "BatchNormalization") {
      ASSERT_EQ(n.input_size(), 5);
      EXPECT_NE(n.input(3).find("running_mean"), std::string::npos);
      EXPECT_NE(n.input(4).find("running_var"), std::string::npos);
    }
  }
}

TEST(OnnxExport, HalfWritesFp16InitializersInputAndOutput) {
  Model model = small("mlp");
  OnnxExportOptions o;
  o.half = true;
  o.batch = 3;
  onnx::ModelProto m = parse(export_onnx(model, o));
  const auto& in = m.graph().input(0).type().tensor_type();
  EXPECT_EQ(in.elem_type(), onnx::TensorProto::FLOAT16);
  EXPECT_EQ(in.shape().dim(0).dim_value(), 3);
  EXPECT_EQ(m.graph().output(0).type().tensor_type().elem_type(), onnx::TensorProto::FLOAT16);
  for (const auto& t : m.graph().initializer()) {
    EXPECT_EQ(t.data_type(), onnx::TensorProto::FLOAT16) << t.name();
  }
}

TEST(OnnxExport, GeluFollowsTheOpset) {
  ModelOptions o;
  o.name = "bert_base";
  o.vocab_size = 20;
  o.seq_len = 4;
  o.hidden_size = 8;
  o.num_layers = 1;
  o.num_heads = 2;
  o.intermediate_size = 16;
  Model model = make_model(o);
  OnnxExportOptions e;
  onnx::ModelProto m17 = parse(export_onnx(model, e));
  EXPECT_EQ(ops(m17).count("Gelu"), 0u);
  EXPECT_EQ(ops(m17).count("Erf"), 2u);  // the block's MLP and the prediction transform
  EXPECT_EQ(m17.graph().input(0).type().tensor_type().elem_type(), onnx::TensorProto::INT64);
  e.opset = 20;
  onnx::ModelProto m20 = parse(export_onnx(model, e));
  EXPECT_EQ(ops(m20).count("Gelu"), 2u);
  EXPECT_EQ(m20.ir_version(), 9);
}

TEST(OnnxExport, RefusesOpsetsOutOfRange) {
  Model model = small("mlp");
  for (int opset : {kOnnxMinOpset - 1, kOnnxMaxOpset + 1}) {
    OnnxExportOptions o;
    o.opset = opset;
    EXPECT_THROW(export_onnx(model, o), InputError) << opset;
  }
}

// A layer type without an exporter: the error names the layer and lists the exportable types.
class Mystery : public Layer {
 public:
  std::string type() const override { return "Mystery"; }
  Shape output_shape(const Shape& input) const override { return input; }

 protected:
  Tensor forward_impl(Context&, const Tensor& x) override { return x; }
  Tensor backward_impl(Context&, const Tensor& dy) override { return dy; }
};

TEST(OnnxExport, UnknownLayerNamedWithTheKnownTypes) {
  auto net = std::make_unique<Sequential>();
  net->add("fc", std::make_unique<Linear>(4, 4));
  net->add("odd", std::make_unique<Mystery>());
  net->set_name("");
  Model model;
  model.net = std::move(net);
  model.sample_shape = {4};
  try {
    export_onnx(model, {});
    FAIL() << "exported a Mystery layer";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'odd' of type Mystery"), std::string::npos) << what;
    EXPECT_NE(what.find("Linear"), std::string::npos) << what;
    EXPECT_NE(what.find("TransformerBlock"), std::string::npos) << what;
  }
  EXPECT_GE(onnx_layer_types().size(), 20u);
}

}  // namespace
}  // namespace kiln::infer
