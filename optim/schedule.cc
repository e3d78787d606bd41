// Learning-rate schedules: closed forms of the step number.

#include "optim/schedule.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/enum_names.h"

namespace kiln::optim {

constexpr double kPi = 3.14159265358979323846;

namespace {
constexpr EnumName<ScheduleKind> kScheduleKindNames[] = {{ScheduleKind::Constant, "constant"},
                                                         {ScheduleKind::Cosine, "cosine"},
                                                         {ScheduleKind::Linear, "linear"},
                                                         {ScheduleKind::Polynomial, "polynomial"},
                                                         {ScheduleKind::Step, "step"}};
}  // namespace

const char* schedule_kind_name(ScheduleKind kind) {
  return enum_name(kScheduleKindNames, kind);
}

ScheduleKind schedule_kind_from_name(const std::string& name) {
  return parse_enum(kScheduleKindNames, name, "lr schedule");
}

LrSchedule::LrSchedule(const ScheduleOptions& options) : options_(options) {
  const ScheduleOptions& o = options_;
  const std::string kind = schedule_kind_name(o.kind);
  if (o.base_lr < 0 || o.min_lr < 0)
    throw InputError("lr schedule: base_lr and min_lr must be >= 0");
  if (o.min_lr > o.base_lr) {
    throw InputError("lr schedule: min_lr (" + std::to_string(o.min_lr) + ") exceeds base_lr (" +
                     std::to_string(o.base_lr) + ")");
  }
  if (o.warmup_steps < 0) throw InputError("lr schedule: warmup_steps must be >= 0");
  bool decays = o.kind == ScheduleKind::Cosine || o.kind == ScheduleKind::Linear ||
                o.kind == ScheduleKind::Polynomial;
  if (decays && o.total_steps <= o.warmup_steps) {
    throw InputError("lr schedule '" + kind + "' needs total_steps (" +
                     std::to_string(o.total_steps) + ") > warmup_steps (" +
                     std::to_string(o.warmup_steps) + ")");
  }
  if (o.kind == ScheduleKind::Polynomial && !(o.power > 0)) {
    throw InputError("lr schedule 'polynomial' needs power > 0");
  }
  if (o.kind == ScheduleKind::Step && o.milestones.empty() && o.step_size <= 0) {
    throw InputError("lr schedule 'step' needs step_size > 0 or milestones");
  }
  if (!std::is_sorted(o.milestones.begin(), o.milestones.end())) {
    throw InputError("lr schedule 'step': milestones must be increasing");
  }
}

double LrSchedule::lr_at(std::int64_t step) const {
  const ScheduleOptions& o = options_;
  if (step < 0) step = 0;
  if (step < o.warmup_steps) {
    return o.base_lr * static_cast<double>(step + 1) / static_cast<double>(o.warmup_steps);
  }
  double t = 0.0;
  if (o.total_steps > o.warmup_steps) {
    t = static_cast<double>(step - o.warmup_steps) /
        static_cast<double>(o.total_steps - o.warmup_steps);
    t = std::min(1.0, t);
  }
  const double range = o.base_lr - o.min_lr;
  switch (o.kind) {
    case ScheduleKind::Constant:
      return o.base_lr;
    case ScheduleKind::Cosine:
      return o.min_lr + range * 0.5 * (1.0 + std::cos(kPi * t));
    case ScheduleKind::Linear:
      return o.min_lr + range * (1.0 - t);
    case ScheduleKind::Polynomial:
      return o.min_lr + range * std::pow(1.0 - t, o.power);
    case ScheduleKind::Step: {
      std::int64_t passed = 0;
      if (!o.milestones.empty()) {
        passed =
            std::upper_bound(o.milestones.begin(), o.milestones.end(), step) - o.milestones.begin();
      } else {
        passed = (step - o.warmup_steps) / o.step_size;
      }
      return std::max(o.min_lr, o.base_lr * std::pow(o.gamma, static_cast<double>(passed)));
    }
  }
  return o.base_lr;
}

}  // namespace kiln::optim
