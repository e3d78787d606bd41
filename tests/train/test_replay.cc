// `kiln replay` (launch/command_replay.cc) on the CPU with the Fashion CNN (conv, batch norm,
// max-pool, linear): what it writes for the parity scripts in tools/parity/.

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/ops.h"
#include "core/safetensors.h"
#include "launch/commands.h"
#include "layers/models/model.h"
#include "train/model_options.h"

namespace kiln::launch {
namespace {

class Replay : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "kiln_replay_" + std::to_string(::getpid()) + "_";
    Model model = make_model(train::default_model_options("fashion_cnn"));
    model.net->reset_parameters(3);
    NamedTensors weights;
    for (Parameter* p : model.net->parameters()) weights.emplace_back(p->name, p->value);
    for (Buffer* b : model.net->buffers()) weights.emplace_back(b->name, b->value);
    save_safetensors(dir_ + "w.safetensors", weights);
    Tensor input = Tensor::empty({4, 1, 28, 28}, DType::F32);  // (N, C, H, W)
    ops::fill_normal(input, 0.0, 1.0, 11);
    Tensor target = Tensor::from_vector(std::vector<std::int64_t>{3, 1, 4, 1}, {4});
    save_safetensors(dir_ + "b.safetensors", {{"input", input}, {"target", target}});
  }

  // Runs replay with `extra` options; returns what it wrote.
  std::map<std::string, Tensor> replay(const std::string& out, const Arguments& extra) {
    Arguments args = {"--model",   "fashion_cnn",
                      "--weights", dir_ + "w.safetensors",
                      "--batch",   dir_ + "b.safetensors",
                      "--out",     dir_ + out,
                      "--device",  "cpu",
                      "--lr",      "0.001"};
    args.insert(args.end(), extra.begin(), extra.end());
    EXPECT_EQ(run_replay(args), 0);
    return load_safetensors(dir_ + out).tensors;
  }

  std::string dir_;
};

double max_abs_difference(const Tensor& a, const Tensor& b) {
  std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  EXPECT_EQ(x.size(), y.size());
  double worst = 0;
  for (std::size_t i = 0; i < x.size() && i < y.size(); ++i) {
    worst = std::max(worst, std::abs(x[i] - y[i]));
  }
  return worst;
}

// The gradients written are the first step's, whatever the number of steps: on the CPU they
// once aliased the parameters' gradients and came out as the last step's.
TEST_F(Replay, GradientsAreTheFirstStepsWhateverTheSteps) {
  auto one = replay("one.safetensors", {"--steps", "1"});
  auto three = replay("three.safetensors", {"--steps", "3"});
  std::vector<double> losses = three.at("loss").to_vector<double>();
  ASSERT_EQ(losses.size(), 3u);
  EXPECT_NE(losses[2], losses[0]);  // the weights moved, so later gradients differ
  int grads = 0;
  for (const auto& [name, g] : one) {
    if (name.rfind("grad.", 0) != 0) continue;
    ++grads;
    EXPECT_EQ(max_abs_difference(g, three.at(name)), 0.0) << name;
  }
  EXPECT_GT(grads, 0);
  EXPECT_EQ(max_abs_difference(one.at("logits"), three.at("logits")), 0.0);
}

// A static power-of-two loss scale at O0 changes nothing: scaling and unscaling are exact.
TEST_F(Replay, StaticLossScaleIsReportedAndExact) {
  auto plain = replay("plain.safetensors", {"--steps", "3"});
  auto scaled = replay("scaled.safetensors", {"--steps", "3", "--loss-scale", "1024"});
  EXPECT_EQ(scaled.at("loss_scale").to_vector<double>(), (std::vector<double>{1024, 1024, 1024}));
  EXPECT_EQ(plain.at("loss_scale").to_vector<double>(), (std::vector<double>{1, 1, 1}));
  EXPECT_EQ(scaled.at("skipped").to_vector<double>(), (std::vector<double>{0, 0, 0}));
  EXPECT_EQ(max_abs_difference(plain.at("loss"), scaled.at("loss")), 0.0);
  EXPECT_EQ(max_abs_difference(plain.at("grad.conv1.weight"), scaled.at("grad.conv1.weight")), 0.0);
}

// The float64 reference: the same function as f32 up to f32 rounding, written in f64.
TEST_F(Replay, Float64ReferenceAgreesWithFloat32) {
  auto f32 = replay("f32.safetensors", {});
  auto f64 = replay("f64.safetensors", {"--dtype", "f64"});
  EXPECT_EQ(f64.at("grad.fc2.weight").dtype(), DType::F64);
  EXPECT_NEAR(f64.at("loss").to_vector<double>()[0], f32.at("loss").to_vector<double>()[0], 1e-5);
  for (const auto& [name, g] : f64) {
    if (name.rfind("grad.", 0) != 0) continue;
    double scale = 0;
    for (double v : g.to_vector<double>()) scale = std::max(scale, std::abs(v));
    EXPECT_LT(max_abs_difference(g, f32.at(name)), 1e-4 * scale + 1e-7) << name;
  }
}

// GPT-2 (--set for a small shape): weights read in transformers' layout, the Conv1D weights
// (in, out), give the model's own logits; their gradients are written (in, out) as well.
TEST_F(Replay, Gpt2ReadsAndWritesConv1DWeightsTransposed) {
  const std::vector<std::string> sets = {"model.gpt.num_layers=2",     "model.gpt.hidden_size=32",
                                         "model.gpt.num_heads=2",      "model.gpt.vocab_size=97",
                                         "model.gpt.max_positions=16", "model.gpt.seq_len=8"};
  ModelOptions mo = train::default_model_options("gpt2", sets);
  mo.dropout = 0.0;
  Model model = make_model(mo);
  model.net->reset_parameters(5);
  NamedTensors weights;
  std::map<std::string, Shape> stored_shapes;
  int transposed = 0;
  for (Parameter* p : model.net->parameters()) {
    Tensor v = p->stored_transposed ? p->value.transpose(0, 1).contiguous() : p->value;
    transposed += p->stored_transposed;
    stored_shapes[p->name] = v.shape();
    weights.emplace_back(p->name, v);
  }
  EXPECT_EQ(transposed, 8);  // c_attn, attn.c_proj, c_fc, mlp.c_proj in each of 2 blocks
  save_safetensors(dir_ + "gw.safetensors", weights);
  std::vector<std::int64_t> ids(2 * 9);
  for (std::size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<std::int64_t>((i * 37 + 5) % 97);
  std::vector<std::int64_t> in, next;
  for (int b = 0; b < 2; ++b) {
    for (int t = 0; t < 8; ++t) {
      in.push_back(ids[static_cast<std::size_t>(b * 9 + t)]);
      next.push_back(ids[static_cast<std::size_t>(b * 9 + t + 1)]);
    }
  }
  Tensor input = Tensor::from_vector(in, {2, 8}), target = Tensor::from_vector(next, {2, 8});
  save_safetensors(dir_ + "gb.safetensors", {{"input", input}, {"target", target}});
  Arguments args = {"--model",   "gpt2",
                    "--weights", dir_ + "gw.safetensors",
                    "--batch",   dir_ + "gb.safetensors",
                    "--out",     dir_ + "g.safetensors",
                    "--device",  "cpu"};
  for (const auto& s : sets) {
    args.push_back("--set");
    args.push_back(s);
  }
  ASSERT_EQ(run_replay(args), 0);
  auto out = load_safetensors(dir_ + "g.safetensors").tensors;
  Context ctx;
  ctx.training = false;
  model.net->set_training(false);
  Tensor logits = model.net->forward(ctx, input);
  EXPECT_EQ(out.at("eval_logits").shape(), (Shape{2, 8, 97}));
  EXPECT_LT(max_abs_difference(out.at("eval_logits"), logits), 1e-6);
  for (const auto& [name, shape] : stored_shapes) {
    EXPECT_EQ(out.at("grad." + name).shape(), shape) << name;
  }
}

TEST_F(Replay, RejectsBadOptions) {
  EXPECT_THROW(replay("x.safetensors", {"--dtype", "f64", "--steps", "2"}), InputError);
  EXPECT_THROW(replay("x.safetensors", {"--dtype", "f64", "--amp", "O1"}), InputError);
  EXPECT_THROW(replay("x.safetensors", {"--dtype", "f16"}), InputError);
  EXPECT_THROW(replay("x.safetensors", {"--loss-scale", "0"}), InputError);
  EXPECT_THROW(replay("x.safetensors", {"--loss-scale", "12x"}), InputError);
}

}  // namespace
}  // namespace kiln::launch
