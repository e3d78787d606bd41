// The step's parts, reached directly: the checkpointer's schedule and resume choice, the graphed
// step's decisions (which micro-steps replay, capture or run eagerly) and the one-rank gradient
// sync. The translation of the experiment into their options: test_run_setup.cc.

#include <gtest/gtest.h>

#include "core/check.h"
#include "train/checkpointer.h"
#include "train/gradient_sync.h"
#include "train/graphed_step.h"

namespace kiln::train {
namespace {

TEST(Checkpointer, SavesEveryStepsButNotTheLastStep) {
  CheckpointerOptions o;
  o.every_steps = 50;
  o.total_steps = 150;
  EXPECT_FALSE(checkpoint_due(o, 1));
  EXPECT_FALSE(checkpoint_due(o, 49));
  EXPECT_TRUE(checkpoint_due(o, 50));
  EXPECT_TRUE(checkpoint_due(o, 100));
  EXPECT_FALSE(checkpoint_due(o, 150));  // the end of the run saves it, once
  o.every_steps = 0;
  EXPECT_FALSE(checkpoint_due(o, 50));
}

TEST(Checkpointer, ResumeChoice) {
  CheckpointerOptions o;
  o.dir = "/runs/x/checkpoints";
  std::string note;
  // Fresh, or a named directory: taken as given, whatever the directory holds.
  EXPECT_EQ(choose_resume(o, std::string("/runs/x/checkpoints/step-000010"), {}, &note), "");
  o.resume = "/elsewhere/step-000020";
  EXPECT_EQ(choose_resume(o, std::nullopt, {}, &note), "/elsewhere/step-000020");
  EXPECT_TRUE(note.empty());
  // "latest": the newest complete one.
  o.resume = "latest";
  EXPECT_EQ(choose_resume(o, std::string("/runs/x/checkpoints/step-000010"), {}, &note),
            "/runs/x/checkpoints/step-000010");
  EXPECT_TRUE(note.empty());
  // A config's "latest" with none yet: a job's first run starts fresh and says so.
  EXPECT_EQ(choose_resume(o, std::nullopt, {}, &note), "");
  EXPECT_NE(note.find("no checkpoint in /runs/x/checkpoints yet; starting fresh"),
            std::string::npos)
      << note;
  // --resume latest with none: an error naming the directory.
  o.resume_from_command_line = true;
  try {
    choose_resume(o, std::nullopt, {}, &note);
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--resume latest: no complete checkpoint in "
                                         "/runs/x/checkpoints"),
              std::string::npos)
        << e.what();
  }
}

// step-N directories without a MANIFEST are never loaded: "latest" says which it skipped and
// why, and with nothing else there it refuses rather than start fresh beside them.
TEST(Checkpointer, ResumeLatestNamesDirectoriesWithoutAManifest) {
  CheckpointerOptions o;
  o.dir = "/runs/x/checkpoints";
  o.resume = "latest";
  const std::vector<std::string> skipped = {"/runs/x/checkpoints/step-000030"};
  std::string note;
  EXPECT_EQ(choose_resume(o, std::string("/runs/x/checkpoints/step-000020"), skipped, &note),
            "/runs/x/checkpoints/step-000020");
  EXPECT_NE(note.find("warning: checkpoint.resume latest skips 1 checkpoint directory in "
                      "/runs/x/checkpoints: /runs/x/checkpoints/step-000030 (no MANIFEST"),
            std::string::npos)
      << note;
  EXPECT_NE(note.find("resuming from /runs/x/checkpoints/step-000020"), std::string::npos) << note;
  for (bool command_line : {false, true}) {
    o.resume_from_command_line = command_line;
    note.clear();
    try {
      choose_resume(o, std::nullopt, skipped, &note);
      FAIL() << "started fresh beside a checkpoint directory without a MANIFEST";
    } catch (const InputError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(std::string(command_line ? "--resume" : "checkpoint.resume") +
                       " latest: no complete checkpoint in /runs/x/checkpoints, only "
                       "/runs/x/checkpoints/step-000030 (no MANIFEST"),
                std::string::npos)
          << m;
    }
    EXPECT_TRUE(note.empty()) << note;
  }
}

BatchSignature batch(std::int64_t rows) {
  return {{rows, 8}, {rows}, DType::F32, DType::I64};
}

TEST(CaptureSchedule, FirstRunEagerThenCaptureThenReplay) {
  CaptureSchedule s(true);
  EXPECT_EQ(s.choose(MicroPosition::Only, batch(4), false).route, MicroRoute::Eager);
  EXPECT_EQ(s.choose(MicroPosition::Only, batch(4), false).reason, "");  // silent warm-up
  EXPECT_EQ(s.choose(MicroPosition::Only, batch(4), false).route, MicroRoute::Capture);
  s.captured(MicroPosition::Only);
  EXPECT_EQ(s.choose(MicroPosition::Only, batch(4), false).route, MicroRoute::Replay);
  EXPECT_EQ(s.choose(MicroPosition::Only, batch(4), false).route, MicroRoute::Replay);
}

TEST(CaptureSchedule, EachPositionHasItsOwnGraph) {
  CaptureSchedule s(true);
  for (MicroPosition p : {MicroPosition::First, MicroPosition::Middle, MicroPosition::Last}) {
    EXPECT_EQ(s.choose(p, batch(4), false).route, MicroRoute::Eager);
  }
  EXPECT_EQ(s.choose(MicroPosition::First, batch(4), false).route, MicroRoute::Capture);
  s.captured(MicroPosition::First);
  EXPECT_EQ(s.choose(MicroPosition::Middle, batch(4), false).route, MicroRoute::Capture);
  EXPECT_EQ(s.choose(MicroPosition::First, batch(4), false).route, MicroRoute::Replay);
}

TEST(CaptureSchedule, OtherShapesAndFaultsRunEagerlySayingWhy) {
  CaptureSchedule s(true);
  const RouteChoice fault = s.choose(MicroPosition::Only, batch(4), true);
  EXPECT_EQ(fault.route, MicroRoute::Eager);
  EXPECT_EQ(fault.reason, "a step with an injected fault runs eagerly");
  EXPECT_FALSE(s.steady().has_value());  // a faulty batch does not fix the steady shape
  s.choose(MicroPosition::Only, batch(4), false);
  s.choose(MicroPosition::Only, batch(4), false);
  s.captured(MicroPosition::Only);
  const RouteChoice partial = s.choose(MicroPosition::Only, batch(3), false);
  EXPECT_EQ(partial.route, MicroRoute::Eager);
  EXPECT_EQ(partial.reason,
            "a batch of shape (3, 8) runs eagerly (the graphs are captured for "
            "(4, 8))");
  BatchSignature other_dtype = batch(4);
  other_dtype.inputs_dtype = DType::F16;
  EXPECT_EQ(s.choose(MicroPosition::Only, other_dtype, false).route, MicroRoute::Eager);
  EXPECT_EQ(s.choose(MicroPosition::Only, batch(4), false).route, MicroRoute::Replay);
}

TEST(CaptureSchedule, StoppedOrOffRunsEverythingEagerlyInSilence) {
  CaptureSchedule off(false);
  const RouteChoice c = off.choose(MicroPosition::Only, batch(4), true);
  EXPECT_EQ(c.route, MicroRoute::Eager);
  EXPECT_EQ(c.reason, "");
  CaptureSchedule s(true);
  s.choose(MicroPosition::Only, batch(4), false);
  s.stop_capturing();  // a failed capture, or a profile
  EXPECT_FALSE(s.capturing());
  EXPECT_EQ(s.choose(MicroPosition::Only, batch(4), false).route, MicroRoute::Eager);
}

TEST(MicroPosition, OfEachMicroBatch) {
  EXPECT_EQ(micro_position(0, 1), MicroPosition::Only);
  EXPECT_EQ(micro_position(0, 3), MicroPosition::First);
  EXPECT_EQ(micro_position(1, 3), MicroPosition::Middle);
  EXPECT_EQ(micro_position(2, 3), MicroPosition::Last);
  EXPECT_TRUE(begins_step(MicroPosition::Only) && ends_step(MicroPosition::Only));
  EXPECT_FALSE(ends_step(MicroPosition::Middle) || begins_step(MicroPosition::Last));
}

TEST(GraphedStep, EagerModeRunsTheWorkAndCountsMicroStepsInMemory) {
  GraphedStep step(Device::cpu(), {}, 5);
  // Eager steps read the step scalars where graphed ones do.
  ASSERT_NE(step.step_counter(), nullptr);
  EXPECT_EQ(*step.step_counter(), 5u);
  Context ctx;
  int runs = 0;
  Tensor x = Tensor::zeros({2, 3}, DType::F32);
  Tensor y = Tensor::zeros({2}, DType::I64);
  for (int i = 0; i < 3; ++i) {
    step.run(MicroPosition::Only, ctx, x, y, false, i,
             [&](Context&, const Tensor& in, const Tensor&) {
               EXPECT_EQ(in.data(), x.data());  // the batch itself, not a static copy
               ++runs;
             });
  }
  EXPECT_EQ(runs, 3);
  EXPECT_EQ(step.micro_steps(), 3u);
  EXPECT_EQ(step.replays(), 0u);
  step.advance_counter();
  EXPECT_EQ(*step.step_counter(), 6u);
  EXPECT_FALSE(step.has_stream());  // eager work stays on the caller's stream
}

TEST(GraphedStep, ResidentModeCountsMicroStepsInMemory) {
  GraphedStepOptions o;
  o.mode = StepMode::Resident;
  GraphedStep step(Device::cpu(), o, 5);
  ASSERT_NE(step.step_counter(), nullptr);
  EXPECT_EQ(*step.step_counter(), 5u);
  step.advance_counter();
  step.advance_counter();
  EXPECT_EQ(*step.step_counter(), 7u);
  EXPECT_FALSE(step.capturing());  // the CPU captures nothing
}

TEST(GradientSync, OneRankZeroesTheGradientsAndReducesNothing) {
  Parameter p;
  p.name = "w";
  p.value = Tensor::zeros({3}, DType::F32);
  p.grad = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3});
  auto sync = make_local_gradients({&p});
  sync->zero_gradients();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(static_cast<const float*>(p.grad.data())[i], 0.0f);
  EXPECT_FALSE(sync->sharded());
  EXPECT_EQ(sync->data_parallel(), nullptr);
  EXPECT_TRUE(sync->state().empty());
  Context ctx;
  sync->install_hooks(ctx);
  EXPECT_FALSE(ctx.on_grad_ready);
  EXPECT_TRUE(ctx.observers.empty());
}

}  // namespace
}  // namespace kiln::train
