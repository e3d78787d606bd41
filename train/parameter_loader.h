#pragma once
// Loads a model's parameters and buffers from tensors named as Kiln saves them (PyTorch's
// names): one path for `model.init_from` and for resuming from a checkpoint.

#include <map>
#include <string>
#include <vector>

#include "configs/experiment.h"
#include "core/tensor.h"
#include "layers/layer.h"
#include "train/checkpoint.h"

namespace kiln::train {

struct NamedTensorSource {
  std::string file;  // for messages: the safetensors file
  const std::map<std::string, Tensor>* tensors = nullptr;
  std::string what;  // why it may not fit: "(a checkpoint of ...)"
};

// Copies every parameter from `source` (each must be present with the model's shape; InputError
// naming the file and tensor otherwise). A stored_transposed weight is read in the file's (in,
// out) layout. A parameter named "transformer.X" is also found as "X": transformers' base-model
// files (GPT2Model, as the Hub's gpt2 model.safetensors) drop the LM head's prefix. Buffers (batch
// norm's running statistics) are copied where present with the same shape; with `buffers_required`
// a missing one is an error too.
void load_named_tensors(const NamedTensorSource& source, const std::vector<Parameter*>& parameters,
                        const std::vector<Buffer*>& buffers, bool buffers_required);

// Reads the checkpoint at `path` and loads its model.safetensors into `net` (parameters and
// buffers); refuses (InputError naming the checkpoint) one written for another model than
// `model_name`. Returns the checkpoint, for its optimizer state and step.
Checkpoint load_model_checkpoint(const std::string& path, const std::string& model_name,
                                 Layer& net);

// kiln eval and kiln sample: the checkpoint `choice` names ("latest": the newest complete one in
// checkpoint.dir, "" when there is none; else the directory as given).
std::string checkpoint_to_read(const config::Experiment& e, const std::string& choice);

// The model section of the experiment recorded in `checkpoint`'s state.pbtxt, so the shapes it
// was trained with need not be typed again: it replaces `e`'s model section when both name the
// same model.name (model.init_from stays `e`'s), and the command line's model.* overrides are
// applied on top. Returns a line saying so when it changed anything, else "". A checkpoint
// without a readable state is left to the checkpoint loader to report.
std::string take_checkpoint_model(config::Experiment& e, const std::string& checkpoint,
                                  const std::vector<std::string>& overrides);

// A parameter's value in the layout files hold it: transposed, (in, out), for a stored_transposed
// weight; the value itself otherwise.
Tensor stored_layout(const Parameter& p);
// The shape a file holds `p` in.
Shape stored_shape(const Parameter& p);

}  // namespace kiln::train
