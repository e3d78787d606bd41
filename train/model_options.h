#pragma once
// Model options from a model name alone (the reference shapes) or from an experiment.

#include <string>
#include <vector>

#include "configs/kiln.pb.h"
#include "layers/models/model.h"

namespace kiln::train {

// The experiment (filled) of the model `name` on the data it is made for, `overrides`
// ("model.gpt.num_layers=2", "model.from_hf_config=DIR", ...) applied first (kiln replay --set).
config::Experiment default_model_experiment(const std::string& name,
                                            const std::vector<std::string>& overrides = {});
// Its model options.
ModelOptions default_model_options(const std::string& name,
                                   const std::vector<std::string>& overrides = {});
ModelOptions model_options_from(const config::Experiment& experiment);

}  // namespace kiln::train
