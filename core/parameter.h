#pragma once
// The trainable and persistent state a model is made of, as the rest of the run sees it: layers/
// owns and registers them, while optim/ updates and comm/ reduces them knowing only these structs.

#include <string>

#include "core/tensor.h"

namespace kiln {

struct Parameter {
  std::string name;              // full dotted name, PyTorch's ("layer1.0.conv1.weight")
  Tensor value;                  // working weights (f32; half in O2/O3 unless fp32_in_half)
  Tensor grad;                   // same shape and dtype as value; accumulated into
  bool no_weight_decay = false;  // biases and norm parameters
  bool fp32_in_half = false;     // norm parameters stay fp32 in O2
  // A 2-D weight that files hold transposed, (in, out): transformers' Conv1D (GPT-2). Kiln keeps
  // it as (out, in) like every Linear; checkpoints and model.init_from transpose at the boundary.
  bool stored_transposed = false;
};

struct Buffer {
  std::string name;  // "bn1.running_mean"
  Tensor value;      // always fp32
};

}  // namespace kiln
