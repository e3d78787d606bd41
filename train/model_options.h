#pragma once
// Model options from a model name alone (the reference shapes) or from an experiment.

#include "configs/kiln.pb.h"
#include "layers/models/model.h"

namespace kiln::train {

ModelOptions default_model_options(const std::string& name);
ModelOptions model_options_from(const config::Experiment& experiment);

}  // namespace kiln::train
