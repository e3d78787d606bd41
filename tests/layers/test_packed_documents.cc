// Packed documents (CallInputs::document_starts) on the CPU in f64: rotary positions restart at
// each document's first token; grouped-query attention attends only within a document (finite
// differences too); a tiny llama given rows that pack several documents gives each document's
// logits and, summed over documents, the parameter gradients of the documents run one by one;
// GPT-2's attention and the KV cache refuse document starts.

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/ops.h"
#include "layers/attention.h"
#include "layers/gradient_check.h"
#include "layers/grouped_query_attention.h"
#include "layers/models/model.h"
#include "layers/rotary.h"
#include "tests/layers/tiny_llama.h"

namespace kiln {
namespace {

Tensor random_tensor(const Shape& shape, std::uint64_t seed) {
  Tensor t = Tensor::empty(shape, DType::F64);
  ops::fill_uniform(t, -1.0, 1.0, seed);
  return t;
}

void randomize_parameters(Layer& layer, std::uint64_t seed) {
  for (Parameter* p : layer.parameters()) ops::fill_uniform(p->value, -0.5, 0.5, ++seed);
}

using llama_test::f64_context;

// Document starts (rows, T) for rows of documents of the given lengths.
Tensor starts_of(const std::vector<std::vector<std::int64_t>>& rows) {
  std::vector<std::int32_t> starts;
  std::int64_t t = 0;
  for (const auto& lengths : rows) {
    std::int32_t at = 0;
    for (std::int64_t length : lengths) {
      for (std::int64_t i = 0; i < length; ++i) starts.push_back(at);
      at += static_cast<std::int32_t>(length);
    }
    t = at;
  }
  return Tensor::from_vector(starts, {static_cast<std::int64_t>(rows.size()), t});
}

TEST(PackedDocuments, RotaryPositionsRestartAtEachDocument) {
  RotaryEmbedding rope(4, 16, RotaryOptions());
  // One row of documents of 3 and 4 tokens, two heads of 4 in rows of 9 columns.
  Tensor x = random_tensor({7, 9}, 1);
  Tensor packed = x.clone();
  rope.apply(packed, 2, 7, starts_of({{3, 4}}), /*inverse=*/false);
  Tensor first = x.slice(0, 0, 3).clone(), second = x.slice(0, 3, 7).clone();
  rope.apply(first, 2, 3, 0, false);
  rope.apply(second, 2, 4, 0, false);
  auto got = packed.to_vector<double>();
  auto a = first.to_vector<double>(), b = second.to_vector<double>();
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_DOUBLE_EQ(got[i], a[i]);
  for (std::size_t i = 0; i < b.size(); ++i) EXPECT_DOUBLE_EQ(got[a.size() + i], b[i]);
  rope.apply(packed, 2, 7, starts_of({{3, 4}}), /*inverse=*/true);
  auto back = packed.to_vector<double>(), original = x.to_vector<double>();
  for (std::size_t i = 0; i < back.size(); ++i) EXPECT_NEAR(back[i], original[i], 1e-14);
  // A start after its token is refused.
  Tensor bad = Tensor::from_vector<std::int32_t>({0, 2, 0}, {1, 3});
  Tensor y = random_tensor({3, 8}, 2);
  EXPECT_THROW(rope.apply(y, 2, 3, bad, false), InputError);
}

GroupedQueryAttentionConfig small_gqa() {
  GroupedQueryAttentionConfig c;
  c.hidden = 12;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 4;
  c.qkv_bias = true;
  c.max_positions = 16;
  c.rotary.theta = 50.0;
  return c;
}

// The layer with ctx.call.document_starts set, for the gradient checker.
TEST(PackedDocuments, GroupedQueryAttentionGradientCheckF64) {
  GroupedQueryAttention attn(small_gqa());
  attn.to(Device::cpu(), DType::F64);
  randomize_parameters(attn, 3);
  Context ctx = f64_context();
  ctx.call.document_starts = starts_of({{2, 3, 2}, {4, 3}});
  GradientCheckOptions options;
  GradientCheckResult r = check_layer_gradients(attn, ctx, random_tensor({2, 7, 12}, 4), options);
  EXPECT_TRUE(r.ok) << r.report;
  EXPECT_GT(r.checked, 0) << r.report;
}

TEST(PackedDocuments, AttentionSeesOnlyItsOwnDocument) {
  GroupedQueryAttention attn(small_gqa());
  attn.to(Device::cpu(), DType::F64);
  randomize_parameters(attn, 5);
  Context ctx = f64_context();
  ctx.call.document_starts = starts_of({{3, 4}});
  Tensor x = random_tensor({1, 7, 12}, 6);
  auto before = attn.forward(ctx, x).to_vector<double>();
  Tensor changed = x.clone();
  changed.slice(1, 0, 3).copy_from(random_tensor({1, 3, 12}, 7));  // the first document
  auto after = attn.forward(ctx, changed).to_vector<double>();
  for (std::size_t i = 3 * 12; i < 7 * 12; ++i) EXPECT_DOUBLE_EQ(before[i], after[i]);
  EXPECT_NE(before[0], after[0]);
}

ModelOptions tiny_llama() {
  ModelOptions o = llama_test::tiny_llama_options("llama");
  o.max_positions = 16;
  o.seq_len = 16;
  o.llama.qkv_bias = true;
  return o;
}

std::vector<double> gradients(Model& m) {
  std::vector<double> all;
  for (Parameter* p : m.net->parameters()) {
    auto g = p->grad.to(Device::cpu(), DType::F64).to_vector<double>();
    all.insert(all.end(), g.begin(), g.end());
  }
  return all;
}

void zero_gradients(Model& m) {
  for (Parameter* p : m.net->parameters()) p->grad.fill(0.0);
}

// Rows packing documents of 5, 7, 4 tokens and of 9, 7: each document's logits equal those of
// the document alone, and the parameter gradients of the packed batch (dlogits fixed at random)
// equal the sum over the documents run one by one, within 1e-10.
TEST(PackedDocuments, TinyLlamaPackedEqualsDocumentsOneByOne) {
  Model m = make_model(tiny_llama());
  m.net->to(Device::cpu(), DType::F64);
  randomize_parameters(*m.net, 8);
  const std::vector<std::vector<std::int64_t>> rows = {{5, 7, 4}, {9, 7}};
  const std::int64_t t = 16, v = 19;
  std::vector<std::int64_t> ids(2 * t);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int64_t>(i * 7 % v);
  Tensor packed_ids = Tensor::from_vector(ids, {2, t});
  Tensor dlogits = random_tensor({2, t, v}, 9);

  Context ctx = f64_context();
  ctx.call.document_starts = starts_of(rows);
  zero_gradients(m);
  auto packed_logits = m.net->forward(ctx, packed_ids).to_vector<double>();
  m.net->backward(ctx, dlogits);
  const std::vector<double> packed_grads = gradients(m);

  Context alone = f64_context();
  zero_gradients(m);  // accumulated over the documents below
  auto want_dlogits = dlogits.to_vector<double>();
  for (std::size_t r = 0; r < rows.size(); ++r) {
    std::int64_t first = 0;
    for (std::int64_t length : rows[r]) {
      const std::int64_t base = static_cast<std::int64_t>(r) * t + first;
      Tensor doc =
          packed_ids.view({2 * t}).slice(0, base, base + length).contiguous().view({1, length});
      auto logits = m.net->forward(alone, doc).to_vector<double>();
      for (std::int64_t i = 0; i < length * v; ++i)
        ASSERT_NEAR(logits[static_cast<std::size_t>(i)],
                    packed_logits[static_cast<std::size_t>(base * v + i)], 1e-10)
            << "row " << r << " document at " << first << " element " << i;
      Tensor ddoc =
          Tensor::from_vector(std::vector<double>(want_dlogits.begin() + base * v,
                                                  want_dlogits.begin() + (base + length) * v),
                              {1, length, v});
      m.net->backward(alone, ddoc);
      first += length;
    }
  }
  const std::vector<double> summed = gradients(m);
  ASSERT_EQ(summed.size(), packed_grads.size());
  double largest = 0;
  for (std::size_t i = 0; i < summed.size(); ++i) {
    EXPECT_NEAR(packed_grads[i], summed[i], 1e-10) << "gradient element " << i;
    largest = std::max(largest, std::abs(summed[i]));
  }
  EXPECT_GT(largest, 1e-3);  // the comparison is not between zeros

  // Without the starts the packed rows give other logits: the masks act.
  Context plain = f64_context();
  auto unmasked = m.net->forward(plain, packed_ids).to_vector<double>();
  EXPECT_GT(std::abs(unmasked[5 * v] - packed_logits[5 * v]), 1e-6);
}

TEST(PackedDocuments, KvCacheAndGpt2AttentionRefuseDocumentStarts) {
  GroupedQueryAttention attn(small_gqa());
  attn.to(Device::cpu(), DType::F64);
  Context ctx = f64_context();
  ctx.training = false;
  KvCache cache;
  cache.capacity = 8;
  ctx.call.kv_cache = &cache;
  ctx.call.document_starts = starts_of({{2, 2}});
  EXPECT_THROW(attn.forward(ctx, random_tensor({1, 4, 12}, 10)), InputError);

  MultiHeadSelfAttention gpt(8, 2, 0.0, QkvLayout::FusedConv1D, /*causal=*/true);
  gpt.to(Device::cpu(), DType::F64);
  Context train = f64_context();
  train.call.document_starts = starts_of({{2, 2}});
  EXPECT_THROW(gpt.forward(train, random_tensor({1, 4, 8}, 11)), InputError);
}

}  // namespace
}  // namespace kiln
