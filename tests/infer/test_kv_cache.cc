// The KV cache against the full recomputation on a tiny GPT-2 (CPU, f32): the logits of every
// position computed token by token through Context::kv_cache equal those of one forward over the
// whole sequence, and greedy generation with the cache equals it without, token for token.
// Needs causal attention and the attention layer's KV cache (layers/attention.h).

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "infer/generation.h"
#include "layers/attention.h"
#include "layers/models/model.h"

namespace kiln::infer {
namespace {

Model tiny_gpt2(std::int64_t max_positions) {
  ModelOptions o;
  o.name = "gpt2";
  o.vocab_size = 64;
  o.seq_len = 8;
  o.hidden_size = 32;
  o.num_layers = 2;
  o.num_heads = 4;
  o.intermediate_size = 64;
  o.max_positions = max_positions;
  Model m = make_model(o);
  m.net->reset_parameters(11);
  // Larger weights than GPT-2's 0.02 init, so positions and context change the logits visibly.
  for (Parameter* p : m.net->parameters()) {
    if (p->value.dim() == 2) {
      float* v = p->value.data<float>();
      for (std::int64_t i = 0; i < p->value.numel(); ++i) v[i] *= 10.0f;
    }
  }
  m.net->set_training(false);
  return m;
}

TEST(KvCache, IncrementalLogitsEqualTheFullForward) {
  Model model = tiny_gpt2(32);
  const std::vector<std::int64_t> ids = {5, 17, 3, 60, 42, 8, 8, 1, 33, 20};
  const auto t = static_cast<std::int64_t>(ids.size());
  Context full_ctx;
  full_ctx.training = false;
  const std::vector<float> full = model.net->forward(full_ctx, Tensor::from_vector(ids, {1, t}))
                                      .to_vector<float>();  // (1, T, V)

  KvCache cache;
  cache.capacity = 32;
  Context ctx;
  ctx.training = false;
  ctx.call.kv_cache = &cache;
  // A prompt of 4, then one token at a time.
  std::vector<float> incremental;
  const std::vector<std::int64_t> prompt(ids.begin(), ids.begin() + 4);
  auto append = [&](const std::vector<std::int64_t>& chunk) {
    const auto n = static_cast<std::int64_t>(chunk.size());
    std::vector<float> y =
        model.net->forward(ctx, Tensor::from_vector(chunk, {1, n})).to_vector<float>();
    incremental.insert(incremental.end(), y.begin(), y.end());
    cache.past += n;
  };
  append(prompt);
  for (std::int64_t i = 4; i < t; ++i) append({ids[static_cast<std::size_t>(i)]});
  ASSERT_EQ(incremental.size(), full.size());
  float scale = 0;
  for (float v : full) scale = std::max(scale, std::fabs(v));
  ASSERT_GT(scale, 0.0f);
  for (std::size_t i = 0; i < full.size(); ++i) {
    ASSERT_NEAR(incremental[i], full[i], 1e-5f * scale)
        << "logit " << i << " (position " << i / 64 << ")";
  }
}

TEST(KvCache, CausalPrefixLogitsDoNotSeeTheFuture) {
  // Without any cache: the logits of a prefix do not change when tokens follow it.
  Model model = tiny_gpt2(32);
  Context ctx;
  ctx.training = false;
  const std::vector<std::int64_t> ids = {5, 17, 3, 60, 42, 8};
  const std::vector<float> whole =
      model.net->forward(ctx, Tensor::from_vector(ids, {1, 6})).to_vector<float>();
  const std::vector<std::int64_t> prefix(ids.begin(), ids.begin() + 3);
  const std::vector<float> part =
      model.net->forward(ctx, Tensor::from_vector(prefix, {1, 3})).to_vector<float>();
  for (std::size_t i = 0; i < part.size(); ++i) ASSERT_NEAR(part[i], whole[i], 1e-4f) << i;
}

TEST(KvCache, GreedyGenerationWithCacheEqualsWithout) {
  Model model = tiny_gpt2(24);
  TokenGenerator generator(model, Device::cpu());
  GenerationOptions o;
  o.sampling.temperature = 0;
  o.max_new_tokens = 100;  // up to max_positions
  o.kv_cache = false;
  Generation reference = generator.generate({1, 2, 3, 4, 5}, o);
  o.kv_cache = true;
  Generation cached = generator.generate({1, 2, 3, 4, 5}, o);
  EXPECT_EQ(cached.tokens, reference.tokens);
  EXPECT_EQ(cached.tokens.size(), 19u);
  EXPECT_EQ(cached.stop, StopReason::MaxPositions);
  EXPECT_EQ(cached.positions, 5 + 18);  // the prompt once, then one position per token
  // Seeded sampling too: the same logits (up to rounding) give the same draws.
  o.sampling.temperature = 1;
  o.sampling.seed = 5;
  Generation sampled_cached = generator.generate({1, 2, 3}, o);
  o.kv_cache = false;
  EXPECT_EQ(generator.generate({1, 2, 3}, o).tokens, sampled_cached.tokens);
}

}  // namespace
}  // namespace kiln::infer
