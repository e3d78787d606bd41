// Transformer Engine's FP8 scaling recipes (optim/amp/fp8_scaling.h): the delayed scale follows
// the largest amax of the history window and forgets what left it; the current scale follows
// the tensor's own amax; overflows keep the scale and are counted; the state restores exactly.

#include <gtest/gtest.h>

#include <cmath>

#include "core/check.h"
#include "optim/amp/fp8_scaling.h"

namespace kiln::optim {
namespace {

TEST(Fp8Scaling, DelayedFollowsTheHistorysLargestAmax) {
  Fp8TensorScaling s(Fp8Format::E4M3, {Fp8Recipe::Delayed, 3, 0.0f});
  EXPECT_EQ(s.scale(), 1.0f);
  s.record(2.0f);
  EXPECT_EQ(s.scale(), 224.0f);  // 448 / 2
  s.record(1.0f);
  s.record(0.5f);
  EXPECT_EQ(s.scale(), 224.0f);  // 2 is still in the window of 3
  s.record(0.25f);
  EXPECT_EQ(s.scale(), 448.0f);  // 2 left it: the largest is 1
  s.record(INFINITY);
  s.record(NAN);
  EXPECT_EQ(s.scale(), 448.0f);
  EXPECT_EQ(s.overflows(), 2);
}

TEST(Fp8Scaling, CurrentFollowsTheTensorsOwnAmaxWithAMargin) {
  Fp8TensorScaling s(Fp8Format::E5M2, {Fp8Recipe::Current, 1, 1.0f});
  EXPECT_EQ(s.current_scale(4.0f), 57344.0f / 4.0f / 2.0f);
  EXPECT_EQ(s.current_scale(0.0f), 1.0f);  // nothing measured: the last scale
  s.record(8.0f);
  EXPECT_EQ(s.scale(), 57344.0f / 8.0f / 2.0f);
}

TEST(Fp8Scaling, StateRestoresBitForBit) {
  Fp8TensorScaling a(Fp8Format::E4M3, {Fp8Recipe::Delayed, 4, 0.0f});
  for (float amax : {3.0f, 0.1f, INFINITY, 7.5f, 0.2f}) a.record(amax);
  Fp8TensorScaling b(Fp8Format::E4M3, {Fp8Recipe::Delayed, 4, 0.0f});
  b.load_state(a.state(), "step-000010/fp8.safetensors");
  EXPECT_EQ(b.state(), a.state());
  for (float amax : {0.5f, 0.4f, 0.3f, 0.2f}) {
    a.record(amax);
    b.record(amax);
    EXPECT_EQ(a.scale(), b.scale());
  }
  EXPECT_EQ(b.overflows(), 1);
  Fp8TensorScaling c(Fp8Format::E4M3, {Fp8Recipe::Delayed, 8, 0.0f});
  EXPECT_THROW(c.load_state(a.state(), "x"), InputError);
}

}  // namespace
}  // namespace kiln::optim
