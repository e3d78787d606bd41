#pragma once
// What the Adam-family rules share: betas in [0, 1), eps >= 0, checked and read from the options.

#include <string>

#include "core/check.h"
#include "optim/optimizer_options.h"

namespace kiln::optim {

inline void check_betas(const OptimizerOptions& o, const char* who) {
  if (!(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1)) {
    throw InputError(std::string(who) + " betas must be in [0, 1), got (" +
                     std::to_string(o.beta1) + ", " + std::to_string(o.beta2) + ")");
  }
  if (!(o.eps >= 0)) throw InputError(std::string(who) + " eps must be >= 0");
}

template <typename Rule>
Rule with_betas(const OptimizerOptions& o) {
  Rule r;
  r.beta1 = o.beta1;
  r.beta2 = o.beta2;
  r.eps = o.eps;
  return r;
}

}  // namespace kiln::optim
