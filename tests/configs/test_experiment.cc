// Tests of configs/experiment.h: the ready experiments, each kind of override, the batch
// arithmetic, the fingerprint, and the bad experiments in tests/configs/bad/.
#include "configs/experiment.h"
#include "configs/schema.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "tests/configs/config_test_util.h"

namespace kiln::config {
namespace {

namespace fs = std::filesystem;

std::string source_dir() {
  const char* from_ctest = std::getenv("KILN_SOURCE_DIR");
  return from_ctest ? from_ctest : KILN_DEFAULT_SOURCE_DIR;
}

std::string configs_dir() {
  return source_dir() + "/configs";
}
std::string bad_dir() {
  return source_dir() + "/tests/configs/bad";
}

// A directory that exists, standing in for datasets absent from the test machine.
std::string existing_dir() {
  return fs::temp_directory_path().string();
}

// Writes `text` to a fresh file in the temporary directory and returns its path.
std::string write_temp(const std::string& name, const std::string& text) {
  const fs::path path = fs::temp_directory_path() / ("kiln_test_configs_" + name);
  std::ofstream(path) << text;
  return path.string();
}

// ---------------------------------------------------------------------------------------
// The ready experiments.

TEST(ReadyConfigs, EveryFileLoadsAndValidatesForEightGpus) {
  std::vector<std::string> paths;
  for (const auto& entry : fs::directory_iterator(configs_dir())) {
    if (entry.path().extension() == ".pbtxt") paths.push_back(entry.path().string());
  }
  ASSERT_GE(paths.size(), 5u);
  for (const std::string& path : paths) {
    SCOPED_TRACE(path);
    // Datasets other than Fashion-MNIST are not on the test machine.
    const Experiment as_written = load_experiment(path, {});
    std::vector<std::string> overrides;
    if (as_written.data().kind() != DataConfig::SYNTHETIC &&
        !fs::exists(as_written.data().path())) {
      overrides.push_back("data.path=" + existing_dir());
    }
    const Experiment experiment = load_experiment(path, overrides);
    EXPECT_EQ(experiment.name(), fs::path(path).stem().string());
    // The quick start is a one- or two-process CPU experiment with a fixed global batch of 128.
    const int ranks = experiment.name() == "fashion_mnist" ? 2 : 8;
    EXPECT_NO_THROW(validate(experiment, {ranks, true, path, overrides}));
    const BatchPlan plan = plan_batches(experiment, ranks);
    EXPECT_EQ(plan.global, static_cast<std::int64_t>(plan.per_gpu) * plan.accumulation * ranks);
  }
}

TEST(ReadyConfigs, FashionMnistRunsOnOneCpu) {
  const std::string path = configs_dir() + "/fashion_mnist.pbtxt";
  const Experiment experiment = load_experiment(path, {});
  EXPECT_EQ(experiment.model().name(), "fashion_cnn");
  EXPECT_EQ(experiment.optimizer().kind(), OptimizerConfig::ADAMW);
  EXPECT_EQ(experiment.data().path(), "/usr/share/datasets/fashion-mnist");
  EXPECT_DOUBLE_EQ(experiment.train().epochs(), 4.0);
  EXPECT_EQ(plan_batches(experiment, 1).accumulation, 2);
  EXPECT_EQ(plan_batches(experiment, 2).accumulation, 1);
  if (fs::exists(experiment.data().path())) {
    EXPECT_NO_THROW(validate(experiment, {1, false, path, {}}));
  }
}

TEST(ReadyConfigs, BertDerivesAccumulationFromGlobalBatch) {
  const Experiment experiment = load_experiment(configs_dir() + "/bert_base.pbtxt", {});
  EXPECT_EQ(experiment.optimizer().kind(), OptimizerConfig::LAMB);
  EXPECT_EQ(experiment.precision().opt_level(), PrecisionConfig::O2);
  EXPECT_FALSE(experiment.train().has_accumulation_steps());
  const BatchPlan plan = plan_batches(experiment, 8);
  EXPECT_EQ(plan.per_gpu, 64);
  EXPECT_EQ(plan.accumulation, 8);
  EXPECT_EQ(plan.global, 4096);
  EXPECT_EQ(plan_batches(experiment, 4).accumulation, 16);
}

// ---------------------------------------------------------------------------------------
// Defaults.

TEST(Defaults, EmptyFileIsTheFashionMnistQuickStart) {
  const Experiment experiment = load_experiment(write_temp("empty.pbtxt", ""), {});
  EXPECT_EQ(experiment.name(), "kiln_test_configs_empty");
  EXPECT_EQ(experiment.model().name(), "fashion_cnn");
  EXPECT_EQ(experiment.model().image_size(), 28);
  EXPECT_EQ(experiment.model().image_channels(), 1);
  EXPECT_EQ(experiment.data().path(), "/usr/share/datasets/fashion-mnist");
  EXPECT_DOUBLE_EQ(experiment.optimizer().lr(), 1e-3);
  ASSERT_EQ(experiment.optimizer().betas_size(), 2);
  EXPECT_DOUBLE_EQ(experiment.optimizer().betas(1), 0.999);
  EXPECT_TRUE(experiment.optimizer().no_weight_decay_for_bias_and_norm());
  EXPECT_TRUE(experiment.precision().loss_scale().dynamic());
  EXPECT_DOUBLE_EQ(experiment.precision().loss_scale().init_scale(), 65536.0);
  EXPECT_EQ(experiment.precision().loss_scale().growth_interval(), 2000);
  EXPECT_DOUBLE_EQ(experiment.parallel().bucket_mb(), 25.0);
  EXPECT_EQ(experiment.parallel().collective_timeout_s(), 600);
  EXPECT_EQ(experiment.train().preemption_grace_s(), 120);
  EXPECT_FALSE(experiment.train().has_cuda_graphs());  // unset: chosen by the device
  // The device's defaults: CUDA where the run's device is (AUTO follows the machine).
  Experiment on_gpu = experiment;
  fill_device_defaults(on_gpu, true);
  EXPECT_TRUE(on_gpu.train().cuda_graphs());
  Experiment on_cpu = experiment;
  fill_device_defaults(on_cpu, false);
  EXPECT_TRUE(on_cpu.train().has_cuda_graphs());
  EXPECT_FALSE(on_cpu.train().cuda_graphs());
  on_cpu.mutable_train()->set_device(TrainConfig::CUDA);
  fill_device_defaults(on_cpu, false);  // a value set stays
  EXPECT_FALSE(on_cpu.train().cuda_graphs());
  Experiment named = experiment;
  named.mutable_train()->set_device(TrainConfig::CUDA);
  fill_device_defaults(named, false);  // the device named, on a login node without one
  EXPECT_TRUE(named.train().cuda_graphs());
  EXPECT_EQ(experiment.train().batch_per_gpu(), 32);
  EXPECT_EQ(experiment.train().accumulation_steps(), 1);
  EXPECT_DOUBLE_EQ(experiment.train().epochs(), 1.0);
  EXPECT_EQ(experiment.checkpoint().keep_last(), 3);
  EXPECT_EQ(experiment.logging().dir(), "runs/kiln_test_configs_empty");
  EXPECT_EQ(experiment.checkpoint().dir(), "runs/kiln_test_configs_empty/checkpoints");
}

TEST(Defaults, DependOnKindsAndKeepExplicitValues) {
  const std::string path =
      write_temp("kinds.pbtxt",
                 "optimizer { kind: SGD weight_decay: 0 }\nprecision { half: BF16 }\n"
                 "data { kind: SYNTHETIC }\nmodel { name: \"resnet50\" }\n");
  const Experiment experiment = load_experiment(path, {});
  EXPECT_DOUBLE_EQ(experiment.optimizer().lr(), 0.1);
  EXPECT_TRUE(experiment.optimizer().has_weight_decay());
  EXPECT_DOUBLE_EQ(experiment.optimizer().weight_decay(), 0.0);
  EXPECT_FALSE(experiment.precision().loss_scale().dynamic());
  EXPECT_EQ(experiment.model().image_size(), 224);
  EXPECT_EQ(experiment.model().num_classes(), 1000);
  EXPECT_EQ(experiment.train().steps(), 100);
  Experiment again = experiment;
  fill_defaults(again, path);
  EXPECT_EQ(experiment_hash(again), experiment_hash(experiment));
}

// ---------------------------------------------------------------------------------------
// Overrides, one test per kind of value.

class Overrides : public ::testing::Test {
 protected:
  std::string path_ = configs_dir() + "/fashion_mnist.pbtxt";
  Experiment load(const std::vector<std::string>& overrides) {
    return load_experiment(path_, overrides);
  }
};

TEST_F(Overrides, Scalars) {
  const Experiment experiment =
      load({"optimizer.lr=3e-4", "train.batch_per_gpu=48", "train.seed=18446744073709551615",
            "model.name=\"resnet18\"", "description=two words"});
  EXPECT_DOUBLE_EQ(experiment.optimizer().lr(), 3e-4);
  EXPECT_EQ(experiment.train().batch_per_gpu(), 48);
  EXPECT_EQ(experiment.train().seed(), 18446744073709551615ull);
  EXPECT_EQ(experiment.model().name(), "resnet18");
  EXPECT_EQ(experiment.description(), "two words");
}

TEST_F(Overrides, Bools) {
  const Experiment experiment =
      load({"data.shuffle=false", "train.deterministic=yes", "logging.tensorboard=ON"});
  EXPECT_FALSE(experiment.data().shuffle());
  EXPECT_TRUE(experiment.data().has_shuffle());
  EXPECT_TRUE(experiment.train().deterministic());
  EXPECT_TRUE(experiment.logging().tensorboard());
  const std::string message = error_of([&] { load({"data.shuffle=maybe"}); });
  EXPECT_NE(message.find("--set data.shuffle=maybe"), std::string::npos) << message;
  EXPECT_NE(message.find("true or false"), std::string::npos) << message;
}

TEST_F(Overrides, EnumsByNameIgnoringCase) {
  const Experiment experiment = load({"optimizer.kind=lamb", "precision.half=Bf16"});
  EXPECT_EQ(experiment.optimizer().kind(), OptimizerConfig::LAMB);
  EXPECT_EQ(experiment.precision().half(), PrecisionConfig::BF16);
  const std::string message = error_of([&] { load({"optimizer.kind=adam"}); });
  EXPECT_NE(message.find("optimizer.kind"), std::string::npos) << message;
  EXPECT_NE(message.find("one of ADAMW, SGD, LAMB"), std::string::npos) << message;
}

TEST_F(Overrides, NumbersOfTheWrongTypeOrRange) {
  std::string message = error_of([&] { load({"train.batch_per_gpu=99999999999"}); });
  EXPECT_NE(message.find("train.batch_per_gpu"), std::string::npos) << message;
  EXPECT_NE(message.find("32-bit"), std::string::npos) << message;
  message = error_of([&] { load({"train.steps=1.5"}); });
  EXPECT_NE(message.find("'1.5' is not an integer"), std::string::npos) << message;
  message = error_of([&] { load({"train.seed=-1"}); });
  EXPECT_NE(message.find("non-negative"), std::string::npos) << message;
  message = error_of([&] { load({"optimizer.lr=fast"}); });
  EXPECT_NE(message.find("a finite number"), std::string::npos) << message;
}

TEST_F(Overrides, NestedMessageFromTextFormat) {
  const Experiment experiment =
      load({"model.name=bert_base", "data.kind=synthetic",
            "model.bert={hidden_size: 1024 num_layers: 24 num_heads: 16}"});
  EXPECT_EQ(experiment.model().bert().hidden_size(), 1024);
  EXPECT_EQ(experiment.model().bert().num_layers(), 24);
  EXPECT_EQ(experiment.model().bert().intermediate_size(), 4096);  // default follows hidden
  EXPECT_EQ(experiment.model().bert().vocab_size(), 30522);
  const std::string message = error_of([&] { load({"model.bert={hidden: 1}"}); });
  EXPECT_NE(message.find("no field hidden"), std::string::npos) << message;
  EXPECT_NE(message.find("hidden_size"), std::string::npos) << message;
}

TEST_F(Overrides, RepeatedScalarsAsCommaLists) {
  Experiment experiment = load({"optimizer.betas=0.9,0.98"});
  ASSERT_EQ(experiment.optimizer().betas_size(), 2);
  EXPECT_DOUBLE_EQ(experiment.optimizer().betas(1), 0.98);
  experiment = load({"data.augmentation.normalize_mean=[0.5, 0.25, 0.125]"});
  ASSERT_EQ(experiment.data().augmentation().normalize_mean_size(), 3);
  EXPECT_FLOAT_EQ(experiment.data().augmentation().normalize_mean(2), 0.125f);
  experiment = load({"optimizer.betas=0.9,0.98", "optimizer.betas[1]=0.95"});
  EXPECT_DOUBLE_EQ(experiment.optimizer().betas(1), 0.95);
  experiment = load({"data.augmentation.normalize_mean="});  // empties the list
  EXPECT_EQ(experiment.data().augmentation().normalize_mean_size(), 0);
  // A bad element leaves the list as it was.
  const std::string message = error_of([&] { load({"optimizer.betas=0.9,x"}); });
  EXPECT_NE(message.find("'x' is not a finite number"), std::string::npos) << message;
}

TEST_F(Overrides, RepeatedMessages) {
  Experiment experiment =
      load({"optimizer.param_groups={name_pattern: \"*.bias\" lr_multiplier: 2}",
            "optimizer.param_groups[0].weight_decay=0.5",
            "optimizer.param_groups[1].name_pattern=*.gamma"});
  ASSERT_EQ(experiment.optimizer().param_groups_size(), 2);
  EXPECT_EQ(experiment.optimizer().param_groups(0).name_pattern(), "*.bias");
  EXPECT_DOUBLE_EQ(experiment.optimizer().param_groups(0).lr_multiplier(), 2.0);
  EXPECT_DOUBLE_EQ(experiment.optimizer().param_groups(0).weight_decay(), 0.5);
  EXPECT_EQ(experiment.optimizer().param_groups(1).name_pattern(), "*.gamma");
  EXPECT_DOUBLE_EQ(experiment.optimizer().param_groups(1).lr_multiplier(), 1.0);
  const std::string message =
      error_of([&] { load({"optimizer.param_groups[3].lr_multiplier=2"}); });
  EXPECT_NE(message.find("past the end; the list has 0 elements"), std::string::npos) << message;
}

TEST_F(Overrides, OneofMemberReplacesTheOther) {
  const Experiment experiment = load({"train.steps=10"});
  EXPECT_TRUE(experiment.train().has_steps());
  EXPECT_EQ(experiment.train().steps(), 10);
  EXPECT_FALSE(experiment.train().has_epochs());
}

TEST_F(Overrides, ApplyBeforeDefaults) {
  const Experiment experiment =
      load({"data.kind=CIFAR10",
            "data.augmentation.normalize_mean=", "data.augmentation.normalize_std="});
  EXPECT_EQ(experiment.model().image_size(), 28);  // the file sets 28 explicitly
  const Experiment from_empty =
      load_experiment(write_temp("cifar.pbtxt", ""), {"data.kind=cifar10"});
  EXPECT_EQ(from_empty.model().image_size(), 32);
  EXPECT_EQ(from_empty.model().image_channels(), 3);
  EXPECT_FALSE(from_empty.data().has_path());
}

TEST_F(Overrides, UnknownPathsListTheFieldsThatExist) {
  std::string message = error_of([&] { load({"optimizer.learning_rate=0.1"}); });
  EXPECT_NE(message.find("--set optimizer.learning_rate=0.1"), std::string::npos) << message;
  EXPECT_NE(message.find("optimizer.learning_rate: no such field"), std::string::npos) << message;
  EXPECT_NE(message.find("fields of optimizer: kind, lr, momentum"), std::string::npos) << message;
  message = error_of([&] { load({"optimiser.lr=0.1"}); });
  EXPECT_NE(message.find("did you mean optimizer?"), std::string::npos) << message;
  EXPECT_NE(message.find("fields of the experiment: name, description, model"), std::string::npos)
      << message;
}

TEST_F(Overrides, MalformedAssignments) {
  EXPECT_NE(error_of([&] { load({"optimizer.lr"}); }).find("expected path=value"),
            std::string::npos);
  EXPECT_NE(error_of([&] { load({"optimizer.lr.x=1"}); }).find("not a message"), std::string::npos);
  EXPECT_NE(error_of([&] { load({"optimizer..lr=1"}); }).find("empty field name"),
            std::string::npos);
  EXPECT_NE(error_of([&] { load({"optimizer.lr[0]=1"}); }).find("is not a list"),
            std::string::npos);
  EXPECT_NE(error_of([&] { load({"optimizer.param_groups.lr_multiplier=1"}); }).find("[N]"),
            std::string::npos);
}

TEST_F(Overrides, ValidationBlamesTheOverride) {
  const std::vector<std::string> overrides = {"optimizer.lr=0"};
  const Experiment experiment = load(overrides);
  const std::string message = error_of([&] { validate(experiment, {1, false, path_, overrides}); });
  EXPECT_EQ(message.rfind("--set optimizer.lr=0: optimizer.lr = 0: must be > 0", 0), 0u) << message;
}

// ---------------------------------------------------------------------------------------
// Reading files.

TEST(Loading, MissingFileIsNamed) {
  const std::string message = error_of([] { load_experiment("/nonexistent/kiln/exp.pbtxt", {}); });
  EXPECT_NE(message.find("/nonexistent/kiln/exp.pbtxt"), std::string::npos) << message;
  EXPECT_NE(message.find("no such file"), std::string::npos) << message;
}

TEST(Loading, DirectoryIsNotAnExperiment) {
  const std::string message = error_of([] { load_experiment(existing_dir(), {}); });
  EXPECT_NE(message.find("is a directory"), std::string::npos) << message;
}

// ---------------------------------------------------------------------------------------
// Batch arithmetic.

TEST(Batches, GlobalIsPerGpuTimesAccumulationTimesRanks) {
  Experiment experiment;
  experiment.mutable_train()->set_batch_per_gpu(16);
  experiment.mutable_train()->set_accumulation_steps(3);
  const BatchPlan plan = plan_batches(experiment, 4);
  EXPECT_EQ(plan.per_gpu, 16);
  EXPECT_EQ(plan.accumulation, 3);
  EXPECT_EQ(plan.global, 192);
  EXPECT_EQ(plan.world_size, 4);
}

TEST(Batches, IndivisibleGlobalSaysWhatWouldDivide) {
  Experiment experiment;
  experiment.mutable_train()->set_batch_per_gpu(32);
  experiment.mutable_train()->set_global_batch(1000);
  std::string message = error_of([&] { plan_batches(experiment, 8); });
  EXPECT_NE(message.find("768 or 1024"), std::string::npos) << message;
  EXPECT_NE(message.find("1000 / 8 = 125: 1, 5, 25, 125"), std::string::npos) << message;
  message = error_of([&] { plan_batches(experiment, 3); });
  EXPECT_NE(message.find("not even a multiple of the 3 ranks"), std::string::npos) << message;
  experiment.mutable_train()->set_global_batch(1024);
  EXPECT_EQ(plan_batches(experiment, 8).accumulation, 4);
}

// A global batch near the int64 limit: no multiple above it exists, and none is suggested (it
// was, as a negative number); the suggestion is made at once, not after 2^31 divisions.
TEST(Batches, HugeGlobalSuggestsNoOverflowedBatch) {
  Experiment experiment;
  experiment.mutable_train()->set_batch_per_gpu(2);
  experiment.mutable_train()->set_global_batch(std::numeric_limits<std::int64_t>::max());
  const auto start = std::chrono::steady_clock::now();
  const std::string message = error_of([&] { plan_batches(experiment, 1); });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  EXPECT_EQ(message.find('-'), std::string::npos) << message;
  EXPECT_NE(message.find("divide: 9223372036854775806 (multiples of 2)"), std::string::npos)
      << message;
  // 2^63 - 1 = 7^2 x 73 x 127 x 337 x 92737 x 649657: the largest of its divisors found.
  EXPECT_NE(message.find("a batch_per_gpu dividing 9223372036854775807 / 1"), std::string::npos)
      << message;
  EXPECT_NE(message.find("92737, 172207, 299593, 454279, 649159, 649657"), std::string::npos)
      << message;
}

// The other items on validation: a name no directory can have, a subnormal learning rate.
TEST(Validation, NameLongerThanADirectoryNameIsRefusedCutShort) {
  const std::string path = write_temp(
      "long_name.pbtxt", "name: \"" + std::string(100000, 'x') + "\"\ntrain { steps: 3 }");
  const std::string message = error_of([&] {
    validate(load_experiment(path, {}), {1, false, path, {}});
  });
  EXPECT_NE(message.find("name = \"xxxx"), std::string::npos) << message.substr(0, 300);
  EXPECT_NE(message.find("(100000 characters): must be at most 255 characters"), std::string::npos)
      << message.substr(0, 300);
  EXPECT_LT(message.size(), 600u);
  const std::vector<std::string> fine = {"name=" + std::string(255, 'x')};
  EXPECT_NO_THROW(validate(load_experiment(path, fine), {1, false, path, fine}));
}

TEST(Validation, SubnormalLearningRateIsANumberAndUnderflowSaysSo) {
  const std::string path = write_temp("tiny_lr.pbtxt", "train { steps: 3 }");
  const Experiment experiment = load_experiment(path, {"optimizer.lr=1e-320"});
  EXPECT_EQ(experiment.optimizer().lr(), 1e-320);
  EXPECT_NO_THROW(validate(experiment, {1, false, path, {"optimizer.lr=1e-320"}}));
  std::string message = error_of([&] { load_experiment(path, {"optimizer.lr=1e-400"}); });
  EXPECT_NE(message.find("optimizer.lr: '1e-400' is not a finite number (it is too small for a "
                         "double and would round to 0"),
            std::string::npos)
      << message;
  message = error_of([&] { load_experiment(path, {"optimizer.lr=1e400"}); });
  EXPECT_NE(message.find("too large for a double"), std::string::npos) << message;
}

// ---------------------------------------------------------------------------------------
// Printing and fingerprints.

TEST(Fingerprint, EqualForEqualExperimentsWhateverTheTextOrder) {
  const Experiment a = load_experiment(
      write_temp("order_a.pbtxt", "name: \"x\" optimizer { lr: 0.5 kind: SGD } train { steps: 5 }"),
      {});
  const Experiment b = load_experiment(
      write_temp("order_b.pbtxt", "train { steps: 5 }\nname: \"x\" optimizer { kind: SGD }"),
      {"optimizer.lr=0.5"});
  EXPECT_EQ(experiment_hash(a), experiment_hash(b));
  const Experiment c = load_experiment(
      write_temp("order_c.pbtxt", "name: \"x\" optimizer { lr: 0.5 kind: SGD } train { steps: 6 }"),
      {});
  EXPECT_NE(experiment_hash(a), experiment_hash(c));
  EXPECT_NE(experiment_hash(a),
            experiment_hash(load_experiment(write_temp("order_a.pbtxt", ""), {"train.seed=1"})));
}

TEST(Fingerprint, TextRoundTripKeepsTheHash) {
  const Experiment experiment = load_experiment(configs_dir() + "/vit_b16.pbtxt", {});
  const std::string text = to_text(experiment);
  EXPECT_NE(text.find("kind: SYNTHETIC"), std::string::npos) << text;
  const Experiment reparsed = parse_experiment_text(text, "effective");
  EXPECT_EQ(experiment_hash(reparsed), experiment_hash(experiment));
}

// kiln config's text shows an enum at its first value (protobuf's printer hides it) and reads back.
TEST(Printing, EffectiveTextShowsEnumsAtTheirFirstValue) {
  const Experiment experiment = load_experiment(write_temp("enums.pbtxt", ""), {"train.steps=3"});
  const std::string text = to_effective_text(experiment);
  for (const char* line : {"  kind: ADAMW\n", "  device: AUTO\n", "  opt_level: O0\n",
                           "  kind: FASHION_MNIST\n", "  kind: CONSTANT\n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << " in\n" << text;
  }
  EXPECT_EQ(to_text(experiment).find("device: AUTO"), std::string::npos);  // what it fixes
  const Experiment reparsed = parse_experiment_text(text, "effective");
  EXPECT_EQ(experiment_hash(reparsed), experiment_hash(experiment));
}

TEST(Printing, JsonPrintsEveryField) {
  const Experiment experiment = load_experiment(configs_dir() + "/fashion_mnist.pbtxt", {});
  const std::string json = to_json(experiment);
  EXPECT_NE(json.find("\"batch_per_gpu\": 64"), std::string::npos) << json;
  EXPECT_NE(json.find("\"cifar_stem\": false"), std::string::npos) << json;  // a zero field
  EXPECT_NE(json.find("\"kind\": \"ADAMW\""), std::string::npos) << json;
}

// ---------------------------------------------------------------------------------------
// The schema's declarations (configs/kiln_options.proto) and the walkers over them.

TEST(Schema, DeclarationsAreSound) {
  const std::vector<std::string> problems = check_declarations(Experiment::descriptor());
  EXPECT_TRUE(problems.empty()) << ::testing::PrintToString(problems);
}

// Every optional scalar declares where its default comes from: a value, a rule, or both;
// train.global_batch alone stays unset (derived from the other two batch fields).
void expect_every_default_declared(const google::protobuf::Descriptor* type,
                                   const std::string& prefix) {
  for (int i = 0; i < type->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* field = type->field(i);
    const std::string path = prefix + field->name();
    if (field->message_type()) {
      expect_every_default_declared(field->message_type(), path + ".");
      continue;
    }
    if (!field->has_presence() || field->containing_oneof() || path == "train.global_batch") {
      continue;
    }
    EXPECT_NE(describe_default(field), "unset")
        << path << " is optional but declares neither (kiln.default) nor (kiln.default_rule)";
  }
}

TEST(Schema, EveryOptionalFieldDeclaresItsDefault) {
  expect_every_default_declared(Experiment::descriptor(), "");
}

TEST(Schema, ModelNamesAreTheAllowedValues) {
  EXPECT_EQ(known_model_names(), (std::vector<std::string>{
                                     "mlp", "fashion_cnn", "resnet18", "resnet50", "bert_base",
                                     "vit_b16", "gpt2", "gpt2_medium", "gpt2_large", "gpt2_xl",
                                     "llama", "qwen2", "qwen2_5_0_5b", "qwen2_5_1_5b", "qwen2_5_3b",
                                     "qwen2_5_7b", "llama3_2_1b", "llama3_2_3b", "llama3_1_8b"}));
}

TEST(Schema, WalkerFillsDeclaredDefaultsAndLeavesEmptySectionsUnset) {
  Experiment experiment;
  fill_declared_defaults(experiment);
  EXPECT_EQ(experiment.data().workers(), 4);
  EXPECT_EQ(experiment.model().name(), "fashion_cnn");
  ASSERT_EQ(experiment.optimizer().betas_size(), 2);
  EXPECT_DOUBLE_EQ(experiment.optimizer().betas(1), 0.999);
  EXPECT_FALSE(experiment.data().has_augmentation());   // declares no default
  EXPECT_FALSE(experiment.model().has_bert());          // only for bert_base (a rule)
  EXPECT_EQ(experiment.model().mlp_hidden_size(), 0);   // only for mlp (a rule)
  EXPECT_FALSE(experiment.data().has_path());           // only for FASHION_MNIST (a rule)
  EXPECT_DOUBLE_EQ(experiment.optimizer().lr(), 1e-3);  // 0.1 for SGD is a rule
}

TEST(Schema, RangeWalkerNamesTheElementAndTheDeclaredRange) {
  Experiment experiment;
  fill_defaults(experiment);
  EXPECT_FALSE(find_range_problem(experiment).has_value());
  experiment.mutable_optimizer()->add_param_groups()->set_lr_multiplier(-1);
  auto problem = find_range_problem(experiment);
  ASSERT_TRUE(problem.has_value());
  EXPECT_EQ(problem->path, "optimizer.param_groups[0].lr_multiplier");
  EXPECT_EQ(problem->value, "-1");
  EXPECT_EQ(problem->problem, "must be >= 0");
  experiment.mutable_model()->set_image_size(5000);
  problem = find_range_problem(experiment);
  ASSERT_TRUE(problem.has_value());
  EXPECT_EQ(problem->path, "model.image_size");
  EXPECT_EQ(problem->problem, "must be in [8, 4096]");
  experiment.mutable_model()->set_image_size(32);
  experiment.mutable_optimizer()->mutable_param_groups(0)->set_lr_multiplier(1);
  experiment.mutable_optimizer()->set_lr(std::numeric_limits<double>::infinity());
  problem = find_range_problem(experiment);
  ASSERT_TRUE(problem.has_value());
  EXPECT_EQ(problem->path, "optimizer.lr");
  EXPECT_EQ(problem->problem, "must be > 0");
}

// The effective experiments recorded (tests/configs/effective/) with the loader as it was
// before the defaults moved into the schema: the shipped configs and the kind-dependent rules.
TEST(Schema, EffectiveExperimentsAreThoseRecordedBeforeTheDeclarations) {
  const fs::path dir = fs::temp_directory_path() / "kiln_test_configs_effective";
  fs::create_directories(dir);
  const std::string empty = (dir / "empty.pbtxt").string();
  std::ofstream(empty) << "";
  struct Variant {
    std::string name, file;
    std::vector<std::string> overrides;
  };
  std::vector<Variant> variants = {
      {"empty_sgd", empty, {"optimizer.kind=SGD"}},
      {"empty_lamb_bf16", empty, {"optimizer.kind=LAMB", "precision.half=BF16"}},
      {"empty_cifar", empty, {"data.kind=CIFAR10"}},
      {"empty_tokens_bert",
       empty,
       {"data.kind=TOKENS", "model.name=bert_base", "model.bert={hidden_size: 1024}"}},
      {"empty_synthetic_vit", empty, {"data.kind=SYNTHETIC", "model.name=vit_b16"}},
      {"empty_jpeg_mlp",
       empty,
       {"data.kind=JPEG_FOLDER", "model.name=mlp", "train.global_batch=64"}},
      {"empty_groups",
       empty,
       {"optimizer.param_groups={name_pattern: \"*.bias\"}", "optimizer.weight_decay=0.3"}},
  };
  for (const char* name :
       {"bert_base", "cifar10_resnet18", "fashion_mnist", "gpt2_124m", "resnet50", "vit_b16"}) {
    variants.push_back({name, configs_dir() + "/" + name + ".pbtxt", {}});
  }
  for (const Variant& variant : variants) {
    SCOPED_TRACE(variant.name);
    std::ifstream in(source_dir() + "/tests/configs/effective/" + variant.name + ".txt");
    ASSERT_TRUE(in) << variant.name;
    std::ostringstream recorded;
    recorded << in.rdbuf();
    EXPECT_EQ(to_text(load_experiment(variant.file, variant.overrides)), recorded.str());
  }
}

// ---------------------------------------------------------------------------------------
// Paths are checked for their kind.

TEST(Paths, ConfigFileMustBeARegularFile) {
  std::string message = error_of([] { load_experiment("/dev/zero", {}); });
  EXPECT_NE(message.find("/dev/zero: cannot read the experiment: it is a character device, not a "
                         ".pbtxt file"),
            std::string::npos)
      << message;
  const std::string fifo = (fs::temp_directory_path() / "kiln_test_configs_fifo.pbtxt").string();
  fs::remove(fifo);
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  message = error_of([&] { load_experiment(fifo, {}); });  // must not block
  EXPECT_NE(message.find("it is a FIFO (named pipe), not a .pbtxt file"), std::string::npos)
      << message;
  fs::remove(fifo);
}

TEST(Paths, EachFieldNamingAPathGetsItsKind) {
  const std::string path = configs_dir() + "/fashion_mnist.pbtxt";
  const std::string file = write_temp("a_file.safetensors", "not a directory");
  const auto message_for = [&](const std::vector<std::string>& overrides) {
    std::vector<std::string> all = {"data.path=" + existing_dir()};
    all.insert(all.end(), overrides.begin(), overrides.end());
    return error_of([&] { validate(load_experiment(path, all), {1, false, path, all}); });
  };
  std::string message = message_for({"model.init_from=" + existing_dir()});
  EXPECT_NE(message.find("model.init_from = \"" + existing_dir() +
                         "\": is a directory without config.json (a safetensors file, or a "
                         "transformers model folder"),
            std::string::npos)
      << message;
  message = message_for({"data.path=" + file});
  EXPECT_NE(message.find("data.path = \"" + file +
                         "\": is a regular file, not a directory (the "
                         "FASHION_MNIST dataset)"),
            std::string::npos)
      << message;
  message = message_for({"checkpoint.resume=" + file});
  EXPECT_NE(message.find("is a regular file, not a checkpoint directory"), std::string::npos)
      << message;
  EXPECT_NO_THROW(
      validate(load_experiment(path, {"data.path=" + existing_dir(), "model.init_from=" + file}),
               {1, false, path, {}}));
}

// LLMC_SHARDS: data.path is a glob that must match a regular file, and so is data.eval_path,
// whose default is data.path with its last "train" replaced by "val".
TEST(Paths, LlmcShardsTakeGlobsAndDeriveTheValidationGlob) {
  const fs::path dir = fs::temp_directory_path() / "kiln_test_configs_shards";
  fs::remove_all(dir);
  fs::create_directories(dir / "train");
  std::ofstream(dir / "train" / "web_train_000001.bin") << "shard";
  std::ofstream(dir / "train" / "web_val_000000.bin") << "shard";
  std::ofstream(dir / "web_000001.bin") << "shard";
  const std::string train_glob = (dir / "train" / "web_train_*.bin").string();
  const std::string val_glob = (dir / "train" / "web_val_*.bin").string();
  const std::string path =
      write_temp("shards.pbtxt", "model { name: \"gpt2\" }\ndata { kind: LLMC_SHARDS }\n");
  const auto load = [&](const std::vector<std::string>& overrides) {
    return load_experiment(path, overrides);
  };
  const auto message_for = [&](const std::vector<std::string>& overrides) {
    return error_of([&] { validate(load(overrides), {1, false, path, overrides}); });
  };

  // The directory named train keeps its name; the file name's "train" becomes "val".
  const Experiment derived = load({"data.path=" + train_glob});
  EXPECT_EQ(derived.data().eval_path(), val_glob);
  EXPECT_NO_THROW(validate(derived, {1, false, path, {"data.path=" + train_glob}}));
  EXPECT_EQ(load({"data.path=" + train_glob, "data.eval_path=" + train_glob}).data().eval_path(),
            train_glob);
  // Other kinds get no eval_path.
  EXPECT_FALSE(load({"data.kind=TOKENS", "data.path=" + train_glob}).data().has_eval_path());

  std::string message = message_for({"data.path=" + (dir / "web_train_*.bin").string()});
  EXPECT_NE(
      message.find("data.path = \"" + (dir / "web_train_*.bin").string() + "\": matches no file"),
      std::string::npos)
      << message;
  message = message_for({"data.path=" + (dir / "tr*").string()});
  EXPECT_NE(message.find("matches 1 path, none a regular file (" + (dir / "train").string() +
                         " is a directory)"),
            std::string::npos)
      << message;
  const std::string no_train = (dir / "web_*.bin").string();
  message = message_for({"data.path=" + no_train});
  EXPECT_NE(message.find("data.eval_path = \"\" (the default): no default"), std::string::npos)
      << message;
  EXPECT_NO_THROW(
      validate(load({"data.path=" + no_train, "data.eval_split=none"}), {1, false, path, {}}));
  fs::remove(dir / "train" / "web_val_000000.bin");
  message = message_for({"data.path=" + train_glob});
  EXPECT_NE(message.find("data.eval_path = \"" + val_glob + "\" (the default): matches no file"),
            std::string::npos)
      << message;
  EXPECT_NO_THROW(
      validate(load({"data.path=" + train_glob, "data.eval_split=train"}), {1, false, path, {}}));
  fs::remove_all(dir);
}

// ---------------------------------------------------------------------------------------
// `kiln config` on a machine without the job's device.

TEST(Devices, KilnConfigValidatesForTheDeviceTheExperimentNames) {
  const std::string path = configs_dir() + "/bert_base.pbtxt";
  const std::vector<std::string> overrides = {"data.path=" + existing_dir()};
  const Experiment experiment = load_experiment(path, overrides);
  ASSERT_EQ(experiment.train().device(), TrainConfig::CUDA);
  ValidationContext login_node{8, false, path, overrides};
  EXPECT_NE(error_of([&] { validate(experiment, login_node); }).find("no CUDA device"),
            std::string::npos);
  login_node.assume_named_device = true;
  EXPECT_NO_THROW(validate(experiment, login_node));
  // AUTO still means this machine's device: without a GPU, O2 is refused.
  const Experiment automatic =
      load_experiment(path, {"data.path=" + existing_dir(), "train.device=AUTO"});
  EXPECT_NE(error_of([&] { validate(automatic, login_node); }).find("precision.opt_level = O2"),
            std::string::npos);
}

// ---------------------------------------------------------------------------------------
// The bad experiments: each must fail with one message naming the file, the line and
// column (where the file has them), the field and what is allowed.

struct BadCase {
  const char* file;
  std::vector<std::string> fragments;  // each must appear in the message
  int world_size = 8;
  bool cuda_available = true;
  // Point data.path at an existing directory, so a missing dataset does not mask the error.
  bool substitute_data_path = true;
};

const std::vector<BadCase>& bad_cases() {
  static const std::vector<BadCase> cases = {
      // Parse errors.
      {"unknown_field",
       {":3:3: optimizer.learning_rate: no such field", "fields of optimizer: kind, lr"}},
      {"typo_field", {":4:3: train.batch_per_gpus: no such field", "did you mean batch_per_gpu?"}},
      {"unknown_section", {":2:1: optimiser: no such field", "did you mean optimizer?"}},
      {"bad_enum",
       {":3:9: data.kind: unknown value MNIST",
        "allowed: FASHION_MNIST, CIFAR10, TOKENS, JPEG_FOLDER, SYNTHETIC"}},
      {"bad_opt_level",
       {":3:14: precision.opt_level: unknown value O4", "allowed: O0, O1, O2, O3"}},
      {"unclosed_brace", {"unclosed_brace.pbtxt:4:1:", "(in model)"}},
      {"string_for_int", {":3:18: Expected integer", "(field train.batch_per_gpu)"}},
      {"int_out_of_range", {":3:18: Integer out of range", "(field train.batch_per_gpu)"}},
      {"duplicate_field", {":4:3:", "specified multiple times", "(field optimizer.lr)"}},
      {"steps_and_epochs", {":4:3:", "oneof", "(field train.epochs)"}},
      {"fractional_steps", {":3:10: Expected integer", "(field train.steps)"}},
      {"bad_bool", {":3:12:", "boolean", "(field data.shuffle)"}},
      {"unknown_field_in_list",
       {":5:31: optimizer.param_groups.lr_mult: no such field",
        "fields of optimizer.param_groups: name_pattern, lr_multiplier"}},
      // Validation errors.
      {"lr_zero", {":4:3: optimizer.lr = 0: must be > 0"}},
      {"lr_negative", {":2:13: optimizer.lr = -0.001: must be > 0"}},
      {"unknown_model",
       {":3:3: model.name = \"resnet34\": unknown value",
        "allowed: mlp, fashion_cnn, resnet18, resnet50, bert_base, vit_b16"}},
      {"accumulation_zero", {":4:3: train.accumulation_steps = 0: must be >= 1"}},
      {"global_not_divisible",
       {":4:3: train.global_batch = 1000", "32 × 8 = 256", "768 or 1024",
        "1000 / 8 = 125: 1, 5, 25, 125"}},
      {"global_mismatch", {":5:3: train.global_batch = 1024", "32 × 2 × 8 = 512"}},
      {"o2_on_cpu", {":3:3: precision.opt_level = O2", "allows O0, or O1 with half BF16"}},
      {"fp16_on_cpu", {":4:3: precision.half = FP16", "use BF16 or opt_level O0"}},
      {"cuda_unavailable", {":3:3: train.device = CUDA", "no CUDA device"}, 1, false},
      {"missing_data_path",
       {":4:3: data.path = \"/nonexistent/kiln/fashion-mnist\": no such directory"},
       8,
       true,
       false},
      {"cifar_without_path",
       {"cifar_without_path.pbtxt:3:1: data.path = \"\" (the default)", "required for CIFAR10"},
       8,
       true,
       false},
      {"eval_every_negative", {":3:3: train.eval_every = -5: must be >= 0"}},
      {"keep_last_zero", {":3:3: checkpoint.keep_last = 0: must be >= 1"}},
      {"beta_one", {":4:", "optimizer.betas[1] = 1: must be in [0, 1)"}},
      {"one_beta", {":3:3: optimizer.betas = [0.9]", "exactly two values"}},
      {"bert_on_images",
       {":4:3: data.kind = FASHION_MNIST", "bert_base needs TOKENS or SYNTHETIC"}},
      {"vit_image_size", {":4:3: model.image_size = 100", "multiple of the 16-pixel patch"}},
      {"nccl_on_cpu", {":3:3: parallel.backend = NCCL", "use MPI or AUTO"}},
      {"warmup_too_long", {":4:3: schedule.warmup_steps = 500", "less than train.steps = 100"}},
      {"step_without_size",
       {"step_without_size.pbtxt:2:1: schedule.step_size = 0 (the default)",
        "must be >= 1 with kind STEP"}},
      {"min_lr_above_lr", {":5:3: schedule.min_lr = 0.01", "[0, optimizer.lr = 0.001]"}},
      {"normalize_channels",
       {":4:5: data.augmentation.normalize_mean = [0.5, 0.5, 0.5]", "model.image_channels = 1"}},
      {"normalize_std_zero", {":5:5: data.augmentation.normalize_std[0] = 0: must be > 0"}},
      {"dropout_one", {":3:3: model.dropout = 1: must be in [0, 1)"}},
      {"backoff_above_one", {":4:5: precision.loss_scale.backoff_factor = 1.5", "(0, 1)"}},
      {"synthetic_epochs", {":5:3: train.epochs = 2", "set train.steps instead"}},
      {"resume_missing",
       {":3:3: checkpoint.resume = \"/nonexistent/kiln/step-000100\"", "\"latest\""}},
      {"nesterov_adamw", {":4:3: optimizer.nesterov = true", "SGD only"}},
      {"bucket_zero", {":3:3: parallel.bucket_mb = 0", "(0, 1024]"}},
      {"half_and_powersgd",
       {":3:3: parallel.allreduce_in_half = true", "parallel.compression is POWERSGD"}},
      {"enum_number", {":3:3: optimizer.kind = 7: unknown value; allowed: ADAMW, SGD, LAMB"}},
      {"zero_and_compression",
       {":4:3: parallel.compression = HALF", "parallel.zero_stage 2",
        "parallel.compression: NONE"}},
      {"powersgd_rank_zero", {":4:3: parallel.powersgd_rank = 0: must be >= 1"}},
      {"bert_heads", {":5:5: model.bert.hidden_size = 770", "model.bert.num_heads = 12"}},
      {"bad_eval_split", {":3:3: data.eval_split = \"validation\"", "allowed: test, train, none"}},
      {"empty_group_pattern",
       {":3:3: optimizer.param_groups[0].name_pattern = \"\" (the default)", "required"}},
      {"resized_crop_reversed",
       {":4:5: data.augmentation.random_resized_crop_scale = [0.5, 0.1]", "0 < min <= max <= 1"}},
      {"mlm_zero", {":5:3: data.mlm_probability = 0", "(0, 1)"}},
      {"workers_negative", {":3:3: data.workers = -1", "[0, 256]"}},
      {"init_from_device",
       {":3:3: model.init_from = \"/dev/zero\": is a character device, not a safetensors file"}},
      {"resume_file",
       {":3:3: checkpoint.resume = \"/dev/null\": is a character device, not a "
        "checkpoint directory"}},
      {"shards_for_resnet",
       {":4:3: data.kind = LLMC_SHARDS", "next-token data for the GPT-2 models",
        "model.name is \"resnet18\""}},
      {"shards_glob_matches_nothing",
       {":5:3: data.path = \"/nonexistent/kiln/fineweb_train_*.bin\": matches no file",
        "a glob of llm.c token shards"},
       8,
       true,
       false},
      {"eval_path_without_shards",
       {":5:3: data.eval_path = \"/data/cifar_val_*.bin\"",
        "applies to LLMC_SHARDS only (data.kind is CIFAR10"}},
  };
  return cases;
}

TEST(BadExperiments, EveryFileHasACaseAndThereAreAtLeastThirty) {
  std::size_t files = 0;
  for (const auto& entry : fs::directory_iterator(bad_dir())) {
    if (entry.path().extension() != ".pbtxt") continue;
    ++files;
    const std::string stem = entry.path().stem().string();
    bool covered = false;
    for (const BadCase& bad : bad_cases()) covered = covered || stem == bad.file;
    EXPECT_TRUE(covered) << entry.path() << " has no entry in bad_cases()";
  }
  EXPECT_EQ(files, bad_cases().size());
  EXPECT_GE(files, 30u);
}

class BadExperiment : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadExperiment, IsRejectedNamingFileLineFieldAndAllowedValues) {
  const BadCase& bad = GetParam();
  const std::string path = bad_dir() + "/" + bad.file + ".pbtxt";
  ASSERT_TRUE(fs::exists(path)) << path;
  std::vector<std::string> overrides;
  if (bad.substitute_data_path) overrides.push_back("data.path=" + existing_dir());
  const std::string message = error_of([&] {
    const Experiment experiment = load_experiment(path, overrides);
    validate(experiment, {bad.world_size, bad.cuda_available, path, overrides});
  });
  // The message starts with the file's path: the location comes first.
  EXPECT_EQ(message.rfind(path, 0), 0u) << message;
  for (const std::string& fragment : bad.fragments) {
    EXPECT_NE(message.find(fragment), std::string::npos)
        << "missing \"" << fragment << "\" in: " << message;
  }
}

INSTANTIATE_TEST_SUITE_P(Files, BadExperiment, ::testing::ValuesIn(bad_cases()),
                         [](const ::testing::TestParamInfo<BadCase>& info) {
                           return std::string(info.param.file);
                         });

}  // namespace
}  // namespace kiln::config
