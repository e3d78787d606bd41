// The trainer's set-up reads every setting it is given: what the experiment says reaches the
// loader, the datasets, the communicator, the convolution layout and the process (the settings
// whose effect does not show in a short CPU run's losses; tests/train/settings_act.py covers the
// rest end to end).

#include <gtest/gtest.h>

#include <cstdlib>

#include "configs/experiment.h"
#include "core/allocator.h"
#include "layers/models/model.h"
#include "train/model_options.h"
#include "train/run_setup.h"

namespace kiln::train {
namespace {

config::Experiment experiment(const std::vector<std::string>& overrides) {
  config::Experiment e;
  for (const std::string& o : overrides) config::apply_override(e, o);
  config::fill_defaults(e, "test.pbtxt");
  return e;
}

TEST(RunSetup, LoaderOptionsFollowTheExperiment) {
  const config::Experiment e =
      experiment({"data.workers=3", "data.prefetch=5", "data.shuffle=false", "data.drop_last=false",
                  "train.seed=11", "train.batch_per_gpu=6"});
  const config::BatchPlan plan = config::plan_batches(e, 2);
  World world;
  world.rank = 1;
  world.size = 2;
  const data::LoaderOptions lo = loader_options(e, plan, world, Device::cpu());
  EXPECT_EQ(lo.workers, 3);
  EXPECT_EQ(lo.prefetch, 5);
  EXPECT_FALSE(lo.shuffle);
  EXPECT_FALSE(lo.drop_last);
  EXPECT_EQ(lo.seed, 11u);
  EXPECT_EQ(lo.batch_size, 6);
  EXPECT_EQ(lo.rank, 1);
  EXPECT_EQ(lo.world_size, 2);
  const data::LoaderOptions defaults = loader_options(experiment({}), plan, world, Device::cpu());
  EXPECT_EQ(defaults.workers, 4);
  EXPECT_TRUE(defaults.shuffle);
}

TEST(RunSetup, DatasetOptionsFollowTheExperiment) {
  const config::Experiment e = experiment(
      {"data.kind=CIFAR10", "data.path=/tmp", "data.on_corrupt_image=SKIP",
       "data.augmentation.random_crop_padding=4", "data.augmentation.horizontal_flip=true",
       "data.augmentation.normalize_mean=0.5,0.4,0.3",
       "data.augmentation.normalize_std=0.2,0.2,0.2",
       "data.augmentation.random_resized_crop_scale=0.25,1"});
  const Model model = make_model(model_options_from(e));
  const data::DatasetOptions o = dataset_options(e, model);
  EXPECT_EQ(dataset_kind(e, model), "cifar10");
  ASSERT_TRUE(o.image_augment.has_value());
  EXPECT_EQ(o.image_augment->crop_padding, 4);
  EXPECT_TRUE(o.image_augment->horizontal_flip);
  EXPECT_EQ(o.image_augment->normalization.mean, (std::vector<float>{0.5f, 0.4f, 0.3f}));
  EXPECT_EQ(o.image_augment->resized_crop_scale_min, 0.25);
  EXPECT_EQ(o.image_augment->resized_crop_scale_max, 1.0);
  EXPECT_EQ(o.jpeg.on_corrupt, data::CorruptImagePolicy::kSkip);
  EXPECT_FALSE(dataset_options(experiment({}), model).image_augment.has_value());

  const config::Experiment bert =
      experiment({"model.name=bert_base", "data.kind=SYNTHETIC", "data.mlm_probability=0.3",
                  "model.bert.vocab_size=50", "model.bert.seq_len=8", "model.bert.hidden_size=8",
                  "model.bert.num_layers=1", "model.bert.num_heads=2"});
  const Model bert_model = make_model(model_options_from(bert));
  const data::DatasetOptions t = dataset_options(bert, bert_model);
  EXPECT_DOUBLE_EQ(t.masking.mask_prob, 0.3);
  EXPECT_EQ(t.seq_len, 8);
  EXPECT_EQ(t.vocab_size, 50);
}

TEST(RunSetup, LlmcShardsTrainOnDataPathAndEvaluateEvalPath) {
  const std::vector<std::string> tiny_gpt = {
      "model.name=gpt2",          "model.gpt.vocab_size=64",     "model.gpt.seq_len=8",
      "model.gpt.hidden_size=16", "model.gpt.num_layers=1",      "model.gpt.num_heads=2",
      "data.kind=LLMC_SHARDS",    "data.path=/d/web_train_*.bin"};
  const config::Experiment e = experiment(tiny_gpt);
  const Model model = make_model(model_options_from(e));
  EXPECT_EQ(dataset_kind(e, model), "llmc_shards");
  EXPECT_EQ(dataset_path(e, "train"), "/d/web_train_*.bin");
  EXPECT_EQ(dataset_path(e, "test"), "/d/web_val_*.bin");  // the default eval_path
  const data::DatasetOptions o = dataset_options(e, model);
  EXPECT_EQ(o.vocab_size, 64);  // every token of every shard must be below it
  EXPECT_EQ(o.seq_len, 8);
  std::vector<std::string> explicit_eval = tiny_gpt;
  explicit_eval.push_back("data.eval_path=/v/*.bin");
  EXPECT_EQ(dataset_path(experiment(explicit_eval), "test"), "/v/*.bin");
  EXPECT_EQ(dataset_path(experiment(explicit_eval), "train"), "/d/web_train_*.bin");
  // Other kinds evaluate a split of data.path.
  const config::Experiment cifar = experiment({"data.kind=CIFAR10", "data.path=/c"});
  EXPECT_EQ(dataset_path(cifar, "test"), "/c");
}

TEST(RunSetup, CommBackendFollowsTheExperiment) {
  EXPECT_EQ(comm_backend(experiment({}).parallel()), CommBackend::Auto);
  EXPECT_EQ(comm_backend(experiment({"parallel.backend=MPI"}).parallel()), CommBackend::Mpi);
  EXPECT_EQ(comm_backend(experiment({"parallel.backend=NCCL"}).parallel()), CommBackend::Nccl);
}

TEST(RunSetup, ChannelsLast) {
  PrecisionPolicy fp32, half;
  half.matmul = DType::F16;
  const auto model = [](const std::string& format) {
    return experiment({"model.memory_format=" + format}).model();
  };
  EXPECT_FALSE(channels_last(model("MEMORY_FORMAT_AUTO"), Device::cpu(), half));
  EXPECT_FALSE(channels_last(model("MEMORY_FORMAT_AUTO"), Device::cuda(0), fp32));
  EXPECT_TRUE(channels_last(model("MEMORY_FORMAT_AUTO"), Device::cuda(0), half));
  EXPECT_TRUE(channels_last(model("NHWC"), Device::cuda(0), fp32));
  EXPECT_FALSE(channels_last(model("NCHW"), Device::cuda(0), half));
}

TEST(RunSetup, ProgressBarFollowsLoggingProgress) {
  World alone, launched;
  launched.under_launcher = true;
  EXPECT_TRUE(progress_bar_wanted(experiment({"logging.progress=ON"}).logging(), launched));
  EXPECT_FALSE(progress_bar_wanted(experiment({"logging.progress=OFF"}).logging(), alone));
  // AUTO: never under a launcher (its ranks get a pseudo-terminal); CTest's output is no terminal.
  EXPECT_FALSE(progress_bar_wanted(experiment({}).logging(), launched));
  EXPECT_FALSE(progress_bar_wanted(experiment({}).logging(), alone));
}

TEST(RunSetup, DeterministicSetsReductionOrderAndMemoryLimit) {
  const std::size_t previous_limit = host_allocator().memory_limit();
  unsetenv("NCCL_ALGO");
  configure_process(experiment({}), Device::cpu());
  EXPECT_EQ(std::getenv("NCCL_ALGO"), nullptr);
  configure_process(experiment({"train.deterministic=true", "train.max_memory_mb=64"}),
                    Device::cpu());
  ASSERT_NE(std::getenv("NCCL_ALGO"), nullptr);
  EXPECT_STREQ(std::getenv("NCCL_ALGO"), "Ring");
  EXPECT_STREQ(std::getenv("CUBLAS_WORKSPACE_CONFIG"), ":4096:8");
  EXPECT_EQ(host_allocator().memory_limit(), std::size_t{64} << 20);
  host_allocator().set_memory_limit(previous_limit);
}

TEST(Checkpointer, OptionsFollowTheExperimentAndTheCommandLine) {
  const config::Experiment e =
      experiment({"checkpoint.every_steps=7", "checkpoint.keep_last=3", "checkpoint.dir=/c",
                  "checkpoint.resume=latest", "parallel.powersgd_start_step=9"});
  CheckpointerOptions o = checkpointer_options(e, "", false, 70);
  EXPECT_EQ(o.every_steps, 7);
  EXPECT_EQ(o.keep_last, 3);
  EXPECT_EQ(o.dir, "/c");
  EXPECT_EQ(o.resume, "latest");
  EXPECT_FALSE(o.resume_from_command_line);
  EXPECT_EQ(o.total_steps, 70);
  EXPECT_EQ(o.powersgd_start_step, 9);
  o = checkpointer_options(e, "/d/step-000001", true, 70);
  EXPECT_EQ(o.resume, "/d/step-000001");
  EXPECT_TRUE(o.resume_from_command_line);
  EXPECT_TRUE(o.evaluate_only);
}

TEST(StepMode, FollowsCudaGraphsAndWhatNeedsTheHost) {
  std::string note;
  // Unset: filled by the device the run gets: graphed on CUDA, eager on the CPU, nothing said.
  config::Experiment unset = experiment({});
  config::fill_device_defaults(unset, true);
  EXPECT_EQ(choose_step_mode(unset, true, 1, &note), StepMode::Graphed);
  unset = experiment({});
  config::fill_device_defaults(unset, false);
  EXPECT_EQ(choose_step_mode(unset, false, 1, &note), StepMode::Eager);
  EXPECT_TRUE(note.empty());
  // Asked for on the CPU: the step state is resident, nothing is captured.
  EXPECT_EQ(choose_step_mode(experiment({"train.cuda_graphs=true"}), false, 1, &note),
            StepMode::Resident);
  EXPECT_NE(note.find("the CPU has nothing to capture"), std::string::npos) << note;
  EXPECT_EQ(choose_step_mode(experiment({"train.cuda_graphs=false"}), true, 1, &note),
            StepMode::Eager);
  EXPECT_TRUE(note.empty());
  // ZeRO combines norms on the host: eager with several ranks; one rank has no ZeRO.
  const config::Experiment zero = experiment({"parallel.zero_stage=2", "train.cuda_graphs=true"});
  EXPECT_EQ(choose_step_mode(zero, true, 2, &note), StepMode::Eager);
  EXPECT_NE(note.find("parallel.zero_stage > 0"), std::string::npos) << note;
  EXPECT_EQ(choose_step_mode(zero, true, 1, &note), StepMode::Graphed);
  const config::Experiment powersgd =
      experiment({"parallel.compression=POWERSGD", "train.cuda_graphs=true"});
  EXPECT_EQ(choose_step_mode(powersgd, true, 2, &note), StepMode::Eager);
  EXPECT_NE(note.find("POWERSGD"), std::string::npos) << note;
}

TEST(Translation, TotalStepsFromStepsOrEpochs) {
  config::TrainConfig t;
  t.set_steps(40);
  EXPECT_EQ(total_steps(t, 1000, 2), 40);
  t.set_epochs(1.5);
  EXPECT_EQ(total_steps(t, 10, 2), 8);  // 15 micro-batches, ceil(15 / 2)
  EXPECT_EQ(total_steps(t, 0, 1), 2);   // an empty epoch counts as one batch
  t.set_epochs(0.01);
  EXPECT_EQ(total_steps(t, 10, 4), 1);
}

TEST(Translation, EvaluatorOptions) {
  const EvaluatorOptions o =
      evaluator_options(experiment({"train.eval_every=25", "train.eval_batches=3"}), 100);
  EXPECT_EQ(o.every_steps, 25);
  EXPECT_EQ(o.max_batches, 3);
  EXPECT_EQ(o.total_steps, 100);
}

}  // namespace
}  // namespace kiln::train
