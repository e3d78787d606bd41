#pragma once
// Learning-rate schedules as pure functions of the step number (0-based, the number of optimizer
// steps already taken), so a resumed run needs only the step. Warm-up is linear from
// base_lr / warmup_steps at step 0 to base_lr at step warmup_steps - 1; decay runs over
// [warmup_steps, total_steps] from base_lr to min_lr and stays at min_lr afterwards.

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::optim {

enum class ScheduleKind {
  Constant,    // base_lr (after the warm-up)
  Cosine,      // min + (base - min) * (1 + cos(pi * t)) / 2, t = decay progress in [0, 1]
  Linear,      // min + (base - min) * (1 - t)
  Polynomial,  // min + (base - min) * (1 - t)^power
  Step,        // base * gamma^(number of milestones passed), or every step_size steps
};
const char* schedule_kind_name(ScheduleKind kind);              // "constant", "cosine", ...
ScheduleKind schedule_kind_from_name(const std::string& name);  // InputError lists the known

struct ScheduleOptions {
  ScheduleKind kind = ScheduleKind::Constant;
  double base_lr = 1e-3;
  double min_lr = 0.0;
  std::int64_t warmup_steps = 0;
  std::int64_t total_steps = 0;  // needed by cosine, linear and polynomial
  double power = 1.0;            // polynomial
  double gamma = 0.1;            // step: multiplier per milestone
  std::int64_t step_size = 0;    // step: a milestone every step_size steps after the warm-up
  std::vector<std::int64_t> milestones;  // step: explicit milestones (used if not empty)
};

class LrSchedule {
 public:
  explicit LrSchedule(const ScheduleOptions& options);  // InputError on inconsistent options
  double lr_at(std::int64_t step) const;
  const ScheduleOptions& options() const { return options_; }

 private:
  ScheduleOptions options_;
};

}  // namespace kiln::optim
