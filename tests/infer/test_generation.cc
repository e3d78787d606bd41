// GPT-2's BPE tokenizer on a tiny vocabulary written here (encodings computed by hand), token
// choice (greedy, top-k, temperature, seeds), and generation without the KV cache on a tiny GPT-2.
// The KV cache's agreement with the full recomputation is test_kv_cache.cc.

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>

#include "core/check.h"
#include "data/gpt2_tokenizer.h"
#include "infer/generation.h"
#include "layers/models/model.h"
#include "tests/infer/tokenizer_test_util.h"

namespace kiln::infer {
namespace {

using Ids = std::vector<std::int64_t>;
using data::gpt2_byte_symbols;
using data::gpt2_pretokenize;
using data::Gpt2Tokenizer;
using testing::error_of;
using testing::scratch_file;

// Byte b has id b; then the merges' results and GPT-2's end-of-text token.
std::vector<std::pair<std::string, std::int64_t>> tiny_vocab() {
  std::vector<std::pair<std::string, std::int64_t>> v;
  for (int b = 0; b < 256; ++b) v.emplace_back(gpt2_byte_symbols()[static_cast<std::size_t>(b)], b);
  const char* merged[] = {"he", "\xC4\xA0t", "\xC4\xA0the", "ll", "ell", "<|endoftext|>"};
  for (int i = 0; i < 6; ++i) v.emplace_back(merged[i], 256 + i);
  return v;
}

// Rank 0 "h e" beats rank 4 "e ll": "hello" becomes he, ll, o.
std::vector<std::pair<std::string, std::string>> tiny_merges() {
  return {{"h", "e"}, {"\xC4\xA0", "t"}, {"\xC4\xA0t", "he"}, {"l", "l"}, {"e", "ll"}};
}

Gpt2Tokenizer tiny_tokenizer() {
  return Gpt2Tokenizer(tiny_vocab(), tiny_merges(), "tiny");
}

TEST(Gpt2Tokenizer, ByteSymbolsAreGpt2s) {
  const auto& s = gpt2_byte_symbols();
  ASSERT_EQ(s.size(), 256u);
  EXPECT_EQ(s['!'], "!");
  EXPECT_EQ(s['a'], "a");
  EXPECT_EQ(s[0xE9], "\xC3\xA9");  // é stands for itself
  EXPECT_EQ(s[' '], "\xC4\xA0");   // Ġ (U+0120)
  EXPECT_EQ(s['\n'], "\xC4\x8A");  // Ċ (U+010A)
  EXPECT_EQ(s[0], "\xC4\x80");     // Ā (U+0100)
  EXPECT_EQ(s[0xAD], "\xC5\x83");  // the soft hyphen, the last non-printable byte: U+0143
  EXPECT_EQ(std::set<std::string>(s.begin(), s.end()).size(), 256u);
}

TEST(Gpt2Tokenizer, PretokenizesAsGpt2sPattern) {
  using P = std::vector<std::string>;
  EXPECT_EQ(gpt2_pretokenize("Hello world"), (P{"Hello", " world"}));
  EXPECT_EQ(gpt2_pretokenize("I'm don't they're"), (P{"I", "'m", " don", "'t", " they", "'re"}));
  EXPECT_EQ(gpt2_pretokenize("a  b"), (P{"a", " ", " b"}));
  EXPECT_EQ(gpt2_pretokenize("x\n\ny"), (P{"x", "\n", "\n", "y"}));
  EXPECT_EQ(gpt2_pretokenize("end   "), (P{"end", "   "}));
  EXPECT_EQ(gpt2_pretokenize("abc123 45!?  ..."), (P{"abc", "123", " 45", "!?", " ", " ..."}));
  EXPECT_EQ(gpt2_pretokenize("'S"), (P{"'", "S"}));  // case-sensitive contractions
  // Letters and numbers beyond ASCII: é, 日本, Arabic-Indic digits; € is a symbol.
  EXPECT_EQ(gpt2_pretokenize("caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC \xD9\xA1\xD9\xA2\xE2\x82\xAC"),
            (P{"caf\xC3\xA9", " \xE6\x97\xA5\xE6\x9C\xAC", " \xD9\xA1\xD9\xA2", "\xE2\x82\xAC"}));
  // A no-break space is \s but not the optional ' ' prefix.
  EXPECT_EQ(gpt2_pretokenize("a\xC2\xA0"
                             "b"),
            (P{"a", "\xC2\xA0", "b"}));
  // Ill-formed UTF-8 stays: one "other" character per byte.
  EXPECT_EQ(gpt2_pretokenize("a\xFF\xFE"), (P{"a", "\xFF\xFE"}));
  EXPECT_TRUE(gpt2_pretokenize("").empty());
}

TEST(Gpt2Tokenizer, EncodesByMergeRank) {
  Gpt2Tokenizer t = tiny_tokenizer();
  EXPECT_EQ(t.vocab_size(), 262);
  EXPECT_EQ(t.encode("hello the"), (Ids{256, 259, 'o', 258}));
  EXPECT_EQ(t.encode(" t"), (Ids{257}));
  EXPECT_EQ(t.encode("ell"), (Ids{260}));
  EXPECT_EQ(t.encode("\xC3\xA9"), (Ids{0xC3, 0xA9}));  // é: its two bytes
  EXPECT_EQ(t.encode("<|endoftext|>hi<|endoftext|>"), (Ids{261, 'h', 'i', 261}));
  EXPECT_EQ(t.token(258), "\xC4\xA0the");
}

TEST(Gpt2Tokenizer, RoundTripsText) {
  Gpt2Tokenizer t = tiny_tokenizer();
  for (const std::string& text :
       std::vector<std::string>{"hello the world, they'll say: 42!\n\n  indented\ttab ", "",
                                "na\xC3\xAFve caf\xC3\xA9 \xE2\x80\x93 "
                                "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\x99\x82",
                                std::string("nul\0byte", 8)}) {
    EXPECT_EQ(t.decode(t.encode(text)), text);
  }
  // A character cut between tokens decodes as U+FFFD, as transformers' errors="replace".
  EXPECT_EQ(t.decode({0xC3}), "\xEF\xBF\xBD");
  EXPECT_EQ(t.decode({'a', 0xE6, 0x97}), "a\xEF\xBF\xBD");
}

TEST(Gpt2Tokenizer, ReadsTransformersFiles) {
  // vocab.json as transformers writes it (raw UTF-8) or as OpenAI's encoder.json (\u escapes).
  std::string json = "{\n";
  for (const auto& [token, id] : tiny_vocab()) {
    std::string escaped;
    for (char c : token)
      escaped += c == '"' || c == '\\' ? std::string("\\") + c : std::string(1, c);
    if (id == 0) escaped = "\\u0100";
    json += "  \"" + escaped + "\": " + std::to_string(id) + ",\n";
  }
  json += "  \"\\ud83d\\ude42\": 262\n}\n";
  const std::string vocab = scratch_file("vocab.json", json);
  const std::string merges =
      scratch_file("merges.txt", "#version: 0.2\nh e\n\xC4\xA0 t\n\xC4\xA0t he\nl l\ne ll\n");
  Gpt2Tokenizer t = Gpt2Tokenizer::load(vocab, merges);
  EXPECT_EQ(t.vocab_size(), 263);
  EXPECT_EQ(t.encode("hello the"), (Ids{256, 259, 'o', 258}));
  EXPECT_EQ(t.token(262), "\xF0\x9F\x99\x82");
  EXPECT_EQ(t.decode({0}), std::string(1, '\0'));
}

TEST(Gpt2Tokenizer, ErrorsNameTheFileAndTheProblem) {
  const std::string merges = scratch_file("ok_merges.txt", "#version: 0.2\nh e\n");
  const std::string vocab = scratch_file("ok_vocab.json", "{\"h\": 0, \"e\": 1, \"he\": 2}");
  std::string e = error_of([&] { Gpt2Tokenizer::load("/nonexistent/vocab.json", merges); });
  EXPECT_NE(e.find("/nonexistent/vocab.json: cannot open the vocabulary: nothing (no such file"),
            std::string::npos)
      << e;
  e = error_of([&] { Gpt2Tokenizer::load(vocab, "/nonexistent/merges.txt"); });
  EXPECT_NE(e.find("/nonexistent/merges.txt: cannot open the BPE merges"), std::string::npos) << e;
  // A FIFO is refused, not waited on; /dev/zero is refused, not read until memory runs out.
  const std::string fifo = scratch_file("fifo_vocab.json", "");
  ASSERT_EQ(std::remove(fifo.c_str()), 0);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  e = error_of([&] { Gpt2Tokenizer::load(fifo, merges); });
  EXPECT_NE(e.find(fifo + ": the vocabulary must be a regular file, but it is a FIFO"),
            std::string::npos)
      << e;
  std::remove(fifo.c_str());
  e = error_of([&] { Gpt2Tokenizer::load(vocab, "/dev/zero"); });
  EXPECT_NE(e.find("/dev/zero: the BPE merges must be a regular file, but it is a character"),
            std::string::npos)
      << e;

  const std::string trailing = scratch_file("trailing.json", "{\"a\": 1,\n }");
  e = error_of([&] { Gpt2Tokenizer::load(trailing, merges); });
  EXPECT_NE(e.find(trailing + ": bad JSON at line 2, column 2: expected a string"),
            std::string::npos)
      << e;
  const std::string fraction = scratch_file("fraction.json", "{\"a\": 1.5}");
  e = error_of([&] { Gpt2Tokenizer::load(fraction, merges); });
  EXPECT_NE(e.find("bad JSON at line 1, column 7: expected an integer id"), std::string::npos) << e;
  const std::string twice = scratch_file("twice.json", "{\"a\": 1, \"b\": 1}");
  e = error_of([&] { Gpt2Tokenizer::load(twice, merges); });
  EXPECT_NE(e.find(twice + ": id 1 belongs to both 'a' and 'b'"), std::string::npos) << e;
  const std::string bad_merges = scratch_file("bad_merges.txt", "#version: 0.2\nh e\nh e x\n");
  e = error_of([&] { Gpt2Tokenizer::load(vocab, bad_merges); });
  EXPECT_NE(e.find(bad_merges + ": line 3: 'h e x' is not a merge of two symbols"),
            std::string::npos)
      << e;

  Gpt2Tokenizer t = Gpt2Tokenizer::load(vocab, merges);
  EXPECT_EQ(t.encode("he"), (Ids{2}));
  e = error_of([&] { t.encode("hex"); });
  EXPECT_NE(e.find(vocab + ": the symbol 'x' (of the text's piece 'hex') is not in the vocabulary"),
            std::string::npos)
      << e;
  e = error_of([&] { t.decode({0, 7}); });
  EXPECT_NE(e.find(vocab + ": no token has id 7 (the vocabulary has 3 tokens, ids 0..2)"),
            std::string::npos)
      << e;
  e = error_of([&] { t.decode({-1}); });
  EXPECT_NE(e.find("no token has id -1"), std::string::npos) << e;
}

TEST(ChooseToken, GreedyIsTheFirstMaximum) {
  SamplingOptions greedy;
  greedy.temperature = 0;
  EXPECT_EQ(choose_token({0.1f, 2.0f, -1.0f, 2.0f}, greedy, 0), 1);
  greedy.seed = 99;
  EXPECT_EQ(choose_token({0.1f, 2.0f, -1.0f, 2.0f}, greedy, 5), 1);
}

TEST(ChooseToken, TopKAndTemperature) {
  const std::vector<float> logits = {0.0f, 3.0f, 1.0f, 2.9f, -5.0f};
  SamplingOptions o;
  o.top_k = 1;  // top-1 is greedy whatever the seed
  for (std::uint64_t draw = 0; draw < 50; ++draw) EXPECT_EQ(choose_token(logits, o, draw), 1);
  o.top_k = 2;
  o.temperature = 100;  // nearly uniform over the two kept
  std::map<std::int64_t, int> seen;
  for (std::uint64_t draw = 0; draw < 400; ++draw) ++seen[choose_token(logits, o, draw)];
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_GT(seen[1], 150);
  EXPECT_GT(seen[3], 150);
}

TEST(ChooseToken, SamplesTheSoftmaxDeterministically) {
  // p = (1/4, 3/4): 4000 draws land within 3 standard deviations (0.021) of 3/4.
  const std::vector<float> logits = {0.0f, static_cast<float>(std::log(3.0))};
  SamplingOptions o;
  o.seed = 1234;
  int ones = 0;
  std::vector<std::int64_t> first, again, other;
  for (std::uint64_t draw = 0; draw < 4000; ++draw) {
    const std::int64_t t = choose_token(logits, o, draw);
    ones += t == 1;
    first.push_back(t);
  }
  EXPECT_NEAR(ones / 4000.0, 0.75, 0.021);
  for (std::uint64_t draw = 0; draw < 4000; ++draw) again.push_back(choose_token(logits, o, draw));
  EXPECT_EQ(first, again);
  o.seed = 1235;
  for (std::uint64_t draw = 0; draw < 4000; ++draw) other.push_back(choose_token(logits, o, draw));
  EXPECT_NE(first, other);
}

TEST(ChooseToken, RefusesBadOptionsAndLogits) {
  SamplingOptions o;
  o.temperature = -1;
  EXPECT_NE(error_of([&] { choose_token({1.0f}, o, 0); }).find("temperature"), std::string::npos);
  o.temperature = NAN;
  EXPECT_NE(error_of([&] { choose_token({1.0f}, o, 0); }).find("temperature"), std::string::npos);
  o.temperature = 1;
  o.top_k = -2;
  EXPECT_NE(error_of([&] { choose_token({1.0f}, o, 0); }).find("top_k"), std::string::npos);
  o.top_k = 0;
  EXPECT_THROW(choose_token({1.0f, NAN}, o, 0), Error);
}

Model tiny_gpt2() {
  ModelOptions o;
  o.name = "gpt2";
  o.vocab_size = 50;
  o.seq_len = 8;
  o.hidden_size = 16;
  o.num_layers = 2;
  o.num_heads = 2;
  o.intermediate_size = 32;
  o.max_positions = 16;
  o.dropout = 0.5;  // eval mode must switch it off
  Model m = make_model(o);
  m.net->reset_parameters(3);
  return m;
}

TEST(TokenGenerator, WithoutCacheIsDeterministicAndStopsAtMaxPositions) {
  Model model = tiny_gpt2();
  TokenGenerator generator(model, Device::cpu());
  GenerationOptions o;
  o.kv_cache = false;
  o.max_new_tokens = 5;
  o.sampling.seed = 7;
  Generation a = generator.generate({1, 2, 3}, o);
  ASSERT_EQ(a.tokens.size(), 5u);
  EXPECT_EQ(a.stop, StopReason::MaxNewTokens);
  EXPECT_EQ(a.forwards, 5);
  EXPECT_EQ(a.positions, 3 + 4 + 5 + 6 + 7);
  for (std::int64_t t : a.tokens) EXPECT_TRUE(t >= 0 && t < 50) << t;
  EXPECT_EQ(generator.generate({1, 2, 3}, o).tokens, a.tokens);  // seed and no dropout
  o.sampling.seed = 8;
  EXPECT_NE(generator.generate({1, 2, 3}, o).tokens, a.tokens);

  o.max_new_tokens = 100;
  Generation full = generator.generate(Ids(10, 4), o);
  EXPECT_EQ(full.tokens.size(), 6u);  // 10 + 6 = max_positions 16
  EXPECT_EQ(full.stop, StopReason::MaxPositions);
  EXPECT_STREQ(stop_reason_name(full.stop), "max_positions");
  EXPECT_TRUE(generator.generate(Ids(16, 4), o).tokens.empty());
}

TEST(TokenGenerator, RefusesBadPrompts) {
  Model model = tiny_gpt2();
  TokenGenerator generator(model, Device::cpu());
  GenerationOptions o;
  EXPECT_NE(error_of([&] { generator.generate({}, o); }).find("empty"), std::string::npos);
  EXPECT_NE(error_of([&] {
              generator.generate({1, 50}, o);
            }).find("prompt token 50 is outside"),
            std::string::npos);
  EXPECT_NE(error_of([&] { generator.generate(Ids(17, 1), o); }).find("max_positions 16"),
            std::string::npos);
  ModelOptions mlp;
  mlp.name = "mlp";
  Model not_lm = make_model(mlp);
  EXPECT_NE(error_of([&] { TokenGenerator g(not_lm, Device::cpu()); }).find("causal language"),
            std::string::npos);
}

}  // namespace
}  // namespace kiln::infer
