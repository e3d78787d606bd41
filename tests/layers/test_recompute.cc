// Activation recomputation (train.recompute: BLOCKS) on the CPU: tiny BERT, GPT-2, ViT and
// ResNet-18 with dropout on give bit for bit the outputs, parameter gradients and input gradients
// of the same model without recomputation, over two steps (different dropout masks); ResNet's
// batch-norm running statistics are updated once per step, not again by the recomputed forward;
// and the peak of the host allocator during a step falls.

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/ops.h"
#include "layers/models/model.h"

namespace kiln {
namespace {

ModelOptions tiny_bert() {
  ModelOptions o;
  o.name = "bert_base";
  o.vocab_size = 13;
  o.hidden_size = 16;
  o.num_layers = 4;
  o.num_heads = 2;
  o.intermediate_size = 32;
  o.max_position_embeddings = 16;
  o.seq_len = 16;
  o.dropout = 0.1;
  return o;
}

ModelOptions tiny_gpt2() {
  ModelOptions o;
  o.name = "gpt2";
  o.vocab_size = 17;
  o.hidden_size = 16;
  o.num_layers = 4;
  o.num_heads = 2;
  o.intermediate_size = 64;
  o.max_positions = 16;
  o.seq_len = 16;
  o.dropout = 0.1;
  return o;
}

ModelOptions tiny_vit() {
  ModelOptions o;
  o.name = "vit_b16";
  o.image_size = 64;
  o.image_channels = 3;
  o.num_classes = 5;
  o.hidden_size = 32;
  o.num_layers = 4;
  o.num_heads = 2;
  o.intermediate_size = 32;
  o.dropout = 0.1;
  return o;
}

ModelOptions tiny_resnet() {
  ModelOptions o;
  o.name = "resnet18";
  o.image_size = 16;
  o.image_channels = 3;
  o.num_classes = 5;
  o.cifar_stem = true;
  return o;
}

// The bytes of a tensor, to compare bit for bit (NaN-safe, -0 != +0).
std::vector<unsigned char> bytes_of(const Tensor& t) {
  Tensor c = t.contiguous();
  std::vector<unsigned char> out(c.nbytes());
  std::memcpy(out.data(), c.data(), out.size());
  return out;
}

Tensor model_input(const Model& m, std::int64_t batch, std::uint64_t seed) {
  Shape shape = m.sample_shape;
  shape.insert(shape.begin(), batch);
  if (m.input_dtype == DType::I64) {
    std::vector<std::int64_t> ids(static_cast<std::size_t>(shape_numel(shape)));
    for (std::size_t i = 0; i < ids.size(); ++i)
      ids[i] = 1 + static_cast<std::int64_t>((i * 7 + seed) % (m.num_outputs - 1));
    return Tensor::from_vector<std::int64_t>(ids, shape);
  }
  Tensor x = Tensor::empty(shape, DType::F32);
  ops::fill_uniform(x, -1.0, 1.0, seed);
  return x;
}

// What one training step shows: the output, every parameter's gradient, every buffer.
struct StepResult {
  std::vector<std::vector<unsigned char>> outputs, grads, buffers;
  std::size_t peak_bytes = 0;  // the host allocator's peak during the step, above its start
};

// The layers a model built with recompute_blocks marks as recomputing.
std::vector<Layer*> recomputing_layers(Layer& net) {
  std::vector<Layer*> out;
  std::function<void(Layer&)> visit = [&](Layer& layer) {
    if (layer.recompute()) out.push_back(&layer);
    for (Layer* child : layer.children()) visit(*child);
  };
  visit(net);
  return out;
}

// Two training steps (steps 5 and 6: different dropout masks; gradients accumulate as the
// trainer's micro-steps do) from the model's initial state, with its blocks recomputing or not.
// One model serves both runs: dropout keys derive from the layers' construction order.
StepResult train_steps(Model& m, const std::vector<Layer*>& blocks, bool recompute,
                       std::int64_t batch) {
  for (Layer* l : blocks) l->set_recompute(recompute);
  for (Parameter* p : m.net->parameters()) p->grad.fill(0.0);
  m.net->reset_parameters(0);  // also the batch-norm running statistics
  m.net->set_training(true);
  StepResult r;
  CachingAllocator& host = host_allocator();
  for (std::uint64_t step : {5, 6}) {
    Context ctx;
    ctx.run.seed = 1234;
    ctx.step.step = &step;
    Tensor x = model_input(m, batch, step);
    const std::size_t before = host.stats().allocated_bytes;
    host.reset_peak_stats();
    Tensor y = m.net->forward(ctx, x);
    Tensor dy = Tensor::empty(y.shape(), y.dtype());
    ops::fill_uniform(dy, -1.0, 1.0, 100 + step);
    m.net->backward(ctx, dy);
    r.peak_bytes = std::max(r.peak_bytes, host.stats().peak_allocated_bytes - before);
    r.outputs.push_back(bytes_of(y));
  }
  for (Parameter* p : m.net->parameters()) r.grads.push_back(bytes_of(p->grad));
  for (Buffer* b : m.net->buffers()) r.buffers.push_back(bytes_of(b->value));
  return r;
}

void expect_recompute_is_exact(ModelOptions options, std::int64_t batch) {
  options.recompute_blocks = true;
  Model m = make_model(options);
  const std::vector<Layer*> recomputing = recomputing_layers(*m.net);
  ASSERT_FALSE(recomputing.empty()) << options.name;
  StepResult none = train_steps(m, recomputing, false, batch);
  StepResult blocks = train_steps(m, recomputing, true, batch);
  ASSERT_EQ(none.outputs.size(), blocks.outputs.size());
  for (std::size_t i = 0; i < none.outputs.size(); ++i)
    EXPECT_TRUE(none.outputs[i] == blocks.outputs[i]) << options.name << ": output " << i;
  ASSERT_EQ(none.grads.size(), blocks.grads.size());
  std::size_t nonzero = 0;
  for (std::size_t i = 0; i < none.grads.size(); ++i) {
    EXPECT_TRUE(none.grads[i] == blocks.grads[i]) << options.name << ": gradient " << i;
    for (unsigned char c : none.grads[i]) nonzero += c != 0;
  }
  EXPECT_GT(nonzero, 0u) << options.name << ": all gradients are zero";
  ASSERT_EQ(none.buffers.size(), blocks.buffers.size());
  for (std::size_t i = 0; i < none.buffers.size(); ++i)
    EXPECT_TRUE(none.buffers[i] == blocks.buffers[i]) << options.name << ": buffer " << i;
  EXPECT_LT(blocks.peak_bytes, none.peak_bytes) << options.name;
  std::printf("%s: peak during a step %.2f MiB without recomputation, %.2f MiB with\n",
              options.name.c_str(), none.peak_bytes / 1048576.0, blocks.peak_bytes / 1048576.0);
}

TEST(Recompute, BertIsBitExactAndSavesMemory) {
  expect_recompute_is_exact(tiny_bert(), 8);
}
TEST(Recompute, Gpt2IsBitExactAndSavesMemory) {
  expect_recompute_is_exact(tiny_gpt2(), 8);
}
TEST(Recompute, VitIsBitExactAndSavesMemory) {
  expect_recompute_is_exact(tiny_vit(), 4);
}
TEST(Recompute, ResNetStagesAreBitExactAndSaveMemory) {
  expect_recompute_is_exact(tiny_resnet(), 4);
}

// The recomputed forward of a ResNet stage must not count its batch twice: num_batches_tracked
// after two steps is 2 in every batch norm.
TEST(Recompute, ResNetRunningStatisticsUpdateOncePerStep) {
  ModelOptions o = tiny_resnet();
  o.recompute_blocks = true;
  Model m = make_model(o);
  for (std::uint64_t step : {1, 2}) {
    Context ctx;
    ctx.step.step = &step;
    Tensor y = m.net->forward(ctx, model_input(m, 2, step));
    m.net->backward(ctx, Tensor::full(y.shape(), 1.0, y.dtype()));
  }
  int tracked = 0;
  for (Buffer* b : m.net->buffers()) {
    if (b->name.find("num_batches_tracked") == std::string::npos) continue;
    EXPECT_EQ(b->value.item(), 2.0) << b->name;
    ++tracked;
  }
  EXPECT_GT(tracked, 10);
}

// In evaluation a recomputing layer keeps nothing and recomputes nothing: its outputs are those
// of the plain model.
TEST(Recompute, EvaluationIsUnchanged) {
  ModelOptions o = tiny_gpt2();
  Model plain = make_model(o);
  o.recompute_blocks = true;
  Model recomputing = make_model(o);
  Context ctx;
  ctx.training = false;
  Tensor x = model_input(plain, 2, 3);
  EXPECT_TRUE(bytes_of(plain.net->forward(ctx, x)) == bytes_of(recomputing.net->forward(ctx, x)));
}

}  // namespace
}  // namespace kiln
