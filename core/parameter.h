#pragma once
// The trainable and persistent state a model is made of, as the rest of the run sees it: layers/
// owns and registers them, while optim/ updates and comm/ reduces them knowing only these structs.

#include <string>
#include <vector>

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
  // Not trained (LoRA's base weights): no gradient is allocated, written, reduced or updated,
  // and no optimizer state is kept for it.
  bool frozen = false;
};

// The parameters that train (not frozen), in their order.
inline std::vector<Parameter*> trainable(const std::vector<Parameter*>& parameters) {
  std::vector<Parameter*> out;
  for (Parameter* p : parameters)
    if (!p->frozen) out.push_back(p);
  return out;
}

struct Buffer {
  std::string name;  // "bn1.running_mean"
  Tensor value;      // always fp32
};

}  // namespace kiln
