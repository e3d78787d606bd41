// LR schedules at chosen steps, worked out by hand.

#include <gtest/gtest.h>

#include <cmath>

#include "core/check.h"
#include "optim/schedule.h"

namespace kiln::optim {
namespace {

ScheduleOptions decay(ScheduleKind kind) {
  ScheduleOptions o;
  o.kind = kind;
  o.base_lr = 1.0;
  o.min_lr = 0.1;
  o.warmup_steps = 10;
  o.total_steps = 110;
  return o;
}

TEST(Schedule, WarmupThenCosine) {
  LrSchedule s(decay(ScheduleKind::Cosine));
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.1);  // (0 + 1) / 10
  EXPECT_DOUBLE_EQ(s.lr_at(4), 0.5);
  EXPECT_DOUBLE_EQ(s.lr_at(9), 1.0);
  EXPECT_DOUBLE_EQ(s.lr_at(10), 1.0);
  EXPECT_NEAR(s.lr_at(60), 0.55, 1e-12);  // halfway: min + (base - min) / 2
  EXPECT_NEAR(s.lr_at(35), 0.1 + 0.9 * 0.5 * (1 + std::cos(3.14159265358979323846 * 0.25)), 1e-12);
  EXPECT_NEAR(s.lr_at(110), 0.1, 1e-12);
  EXPECT_NEAR(s.lr_at(1000), 0.1, 1e-12);
}

TEST(Schedule, LinearAndPolynomial) {
  LrSchedule lin(decay(ScheduleKind::Linear));
  EXPECT_NEAR(lin.lr_at(60), 0.55, 1e-12);
  EXPECT_NEAR(lin.lr_at(85), 0.1 + 0.9 * 0.25, 1e-12);
  ScheduleOptions p = decay(ScheduleKind::Polynomial);
  p.power = 2.0;
  LrSchedule poly(p);
  EXPECT_NEAR(poly.lr_at(60), 0.1 + 0.9 * 0.25, 1e-12);
  EXPECT_NEAR(poly.lr_at(110), 0.1, 1e-12);
}

TEST(Schedule, ConstantAndStep) {
  ScheduleOptions c;
  c.base_lr = 0.3;
  EXPECT_DOUBLE_EQ(LrSchedule(c).lr_at(12345), 0.3);
  ScheduleOptions st;
  st.kind = ScheduleKind::Step;
  st.base_lr = 1.0;
  st.warmup_steps = 10;
  st.step_size = 30;
  st.gamma = 0.5;
  LrSchedule s(st);
  EXPECT_DOUBLE_EQ(s.lr_at(10), 1.0);
  EXPECT_DOUBLE_EQ(s.lr_at(39), 1.0);
  EXPECT_DOUBLE_EQ(s.lr_at(40), 0.5);
  EXPECT_DOUBLE_EQ(s.lr_at(70), 0.25);
  st.milestones = {100, 200};
  st.warmup_steps = 0;
  LrSchedule m(st);
  EXPECT_DOUBLE_EQ(m.lr_at(99), 1.0);
  EXPECT_DOUBLE_EQ(m.lr_at(100), 0.5);
  EXPECT_DOUBLE_EQ(m.lr_at(250), 0.25);
}

TEST(Schedule, ResumableAndRejectsBadOptions) {
  LrSchedule a(decay(ScheduleKind::Cosine)), b(decay(ScheduleKind::Cosine));
  for (std::int64_t step : {0, 7, 50, 109}) EXPECT_EQ(a.lr_at(step), b.lr_at(step));
  ScheduleOptions bad = decay(ScheduleKind::Cosine);
  bad.total_steps = 5;
  EXPECT_THROW(LrSchedule{bad}, InputError);
  bad = decay(ScheduleKind::Linear);
  bad.min_lr = 2.0;
  EXPECT_THROW(LrSchedule{bad}, InputError);
  ScheduleOptions st;
  st.kind = ScheduleKind::Step;
  EXPECT_THROW(LrSchedule{st}, InputError);
  EXPECT_EQ(schedule_kind_from_name("polynomial"), ScheduleKind::Polynomial);
  EXPECT_THROW(schedule_kind_from_name("exp"), InputError);
}

}  // namespace
}  // namespace kiln::optim
