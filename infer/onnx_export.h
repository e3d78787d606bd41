#pragma once
// ONNX export of a Kiln model's eval-mode network (`kiln export`, docs/deploy.md).
//   graph input  "input"     (B, C, H, W) float images (normalised as the model was trained:
//                            metadata_props say how), or "input_ids" (B, T) int64 tokens
//   graph output "logits"    (B, classes), or (B, T, vocab) for masked LM
// B is the dimension "batch" (dynamic) unless OnnxExportOptions::batch fixes it. Initializers keep
// the checkpoint's (PyTorch's) names. Under `half`, initializers, the float input and the output
// are float16; softmax and layer-norm statistics still run in fp32.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "layers/models/model.h"

namespace kiln::infer {

constexpr int kOnnxMinOpset = 17;  // LayerNormalization
constexpr int kOnnxMaxOpset = 21;  // the newest ONNX Runtime 1.20 runs

struct OnnxExportOptions {
  int opset = 17;
  bool half = false;
  std::int64_t batch = 0;  // 0: dynamic
  std::string graph_name = "kiln";
  std::string producer_version;
  std::vector<std::pair<std::string, std::string>> metadata;  // metadata_props, in order
};

// The serialized ModelProto of model.net in eval mode (the model is switched to eval).
// InputError for an opset out of range or a layer that cannot be exported (naming it).
std::string export_onnx(Model& model, const OnnxExportOptions& options);

}  // namespace kiln::infer
