#pragma once
// Model options from a model name alone (the reference shapes) or from an experiment.

#include <string>
#include <vector>

#include "configs/kiln.pb.h"
#include "layers/models/model.h"

namespace kiln::train {

// `overrides` ("model.gpt.num_layers=2", ...) apply to the experiment before the options are
// taken from it (kiln replay --set).
ModelOptions default_model_options(const std::string& name,
                                   const std::vector<std::string>& overrides = {});
ModelOptions model_options_from(const config::Experiment& experiment);

}  // namespace kiln::train
