// Hugging Face's tokenizer.json (data/hf_tokenizer.h) on small files written here, with the ids
// worked out by hand; the pre-tokenization patterns of Llama 3 and Qwen2 and NFC on cases whose
// answers are tokenizers' and Python's unicodedata's. The comparison with tokenizers itself on
// tokenizers it trains is hf_tokenizer_check.py.

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <random>
#include <set>

#include "core/check.h"
#include "core/json_writer.h"
#include "data/hf_tokenizer.h"
#include "data/unicode_text.h"
#include "tests/infer/tokenizer_test_util.h"

namespace kiln::data {
namespace {

using Ids = std::vector<std::int64_t>;
using infer::testing::error_of;
using infer::testing::scratch_file;
using Pieces = std::vector<std::string>;

// A tokenizer.json: byte b is id b (its GPT-2 symbol), then `vocab`, `merges` by rank.
struct Spec {
  std::vector<std::pair<std::string, std::int64_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  bool merges_as_strings = false;  // "a b", as tokenizers before 0.20 wrote them
  std::set<int> missing_bytes;
  std::string model = R"("type": "BPE", "dropout": null, "unk_token": null,
                         "continuing_subword_prefix": null, "end_of_word_suffix": null,
                         "fuse_unk": false, "byte_fallback": false, "ignore_merges": false)";
  std::string normalizer = "null";
  std::string pre_tokenizer = R"({"type": "ByteLevel", "add_prefix_space": false,
                                  "trim_offsets": true, "use_regex": true})";
  std::string post_processor = "null";
  std::string decoder = R"({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true,
                            "use_regex": true})";
  std::string added_tokens = "[]";
  std::string top = R"("version": "1.0", "truncation": null, "padding": null)";
};

std::string json_of(const Spec& s) {
  std::string vocab;
  for (int b = 0; b < 256; ++b) {
    if (s.missing_bytes.count(b) != 0) continue;
    vocab += (vocab.empty() ? "" : ", ") +
             JsonWriter::quote(gpt2_byte_symbols()[static_cast<std::size_t>(b)]) + ": " +
             std::to_string(b);
  }
  for (const auto& [token, id] : s.vocab) {
    vocab += ", " + JsonWriter::quote(token) + ": " + std::to_string(id);
  }
  std::string merges;
  for (const auto& [a, b] : s.merges) {
    merges +=
        (merges.empty() ? "" : ", ") +
        (s.merges_as_strings ? JsonWriter::quote(a + " " + b)
                             : "[" + JsonWriter::quote(a) + ", " + JsonWriter::quote(b) + "]");
  }
  return "{" + s.top + ",\n\"added_tokens\": " + s.added_tokens +
         ",\n\"normalizer\": " + s.normalizer + ",\n\"pre_tokenizer\": " + s.pre_tokenizer +
         ",\n\"post_processor\": " + s.post_processor + ",\n\"decoder\": " + s.decoder +
         ",\n\"model\": {" + s.model + ",\n\"vocab\": {" + vocab + "},\n\"merges\": [" + merges +
         "]}}";
}

HfTokenizer tokenizer(const Spec& s) {
  return HfTokenizer::from_json(json_of(s), "tok.json");
}

std::string added(std::int64_t id, const std::string& content, bool special,
                  const std::string& flags = R"("lstrip": false, "rstrip": false)",
                  bool single_word = false) {
  return R"({"id": )" + std::to_string(id) + R"(, "content": )" + JsonWriter::quote(content) +
         ", " + flags + R"(, "normalized": false, "special": )" + (special ? "true" : "false") +
         R"(, "single_word": )" + (single_word ? "true" : "false") + "}";
}

// "hello world" -> hell o Ġworld: every merge below, in a heap order a naive one would match too.
Spec llama_like() {
  Spec s;
  s.vocab = {{"he", 256}, {"ll", 257},          {"hell", 258}, {"\xC4\xA0w", 259},
             {"or", 260}, {"\xC4\xA0wor", 261}, {"ld", 262},   {"\xC4\xA0world", 263}};
  s.merges = {{"h", "e"}, {"l", "l"},          {"he", "ll"}, {"\xC4\xA0", "w"},
              {"o", "r"}, {"\xC4\xA0w", "or"}, {"l", "d"},   {"\xC4\xA0wor", "ld"}};
  s.added_tokens = "[" + added(264, "<|begin_of_text|>", true) + ", " +
                   added(265, "<|eot_id|>", true) + ", " + added(266, "<x>", false) + ", " +
                   added(267, "<x><y>", false) + "]";
  s.post_processor = R"({"type": "Sequence", "processors": [
      {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
      {"type": "TemplateProcessing",
       "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                  {"Sequence": {"id": "A", "type_id": 0}}],
       "pair": [],
       "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [264],
                                               "tokens": ["<|begin_of_text|>"]}}}]})";
  return s;
}

std::string split_then_byte_level(SplitPattern p) {
  return R"({"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": )" +
         JsonWriter::quote(split_pattern_regex(p)) + R"(}, "behavior": "Isolated", "invert": false},
      {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]})";
}

TEST(SplitPattern, Llama3AndQwen2AsTokenizersSplit) {
  for (SplitPattern p : {SplitPattern::Llama3, SplitPattern::Qwen2}) {
    const bool llama = p == SplitPattern::Llama3;
    EXPECT_EQ(split_by_pattern("Hello world", p), (Pieces{"Hello", " world"}));
    EXPECT_EQ(split_by_pattern("I'm DON'T they'RE", p),
              (Pieces{"I", "'m", " DON", "'T", " they", "'RE"}));
    // (?i:'s) matches LONG S (U+017F): Oniguruma folds it to s.
    EXPECT_EQ(split_by_pattern("x'\xC5\xBFt", p), (Pieces{"x", "'\xC5\xBF", "t"}));
    EXPECT_EQ(split_by_pattern("  \n  x", p), (Pieces{"  \n", " ", " x"}));
    EXPECT_EQ(split_by_pattern("\t\tword", p), (Pieces{"\t", "\tword"}));
    EXPECT_EQ(split_by_pattern("a  \n\n b", p), (Pieces{"a", "  \n\n", " b"}));
    EXPECT_EQ(split_by_pattern("!?\n\nx", p), (Pieces{"!?\n\n", "x"}));
    EXPECT_EQ(split_by_pattern(" ...\r\n", p), (Pieces{" ...\r\n"}));
    EXPECT_EQ(split_by_pattern("end   ", p), (Pieces{"end", "   "}));
    EXPECT_EQ(split_by_pattern("a\xC2\xA0"
                               "b",
                               p),
              (Pieces{"a",
                      "\xC2\xA0"
                      "b"}));
    EXPECT_EQ(split_by_pattern("1234567 89", p),
              llama ? (Pieces{"123", "456", "7", " ", "89"})
                    : (Pieces{"1", "2", "3", "4", "5", "6", "7", " ", "8", "9"}));
    EXPECT_EQ(split_by_pattern("$12.5%", p),
              llama ? (Pieces{"$", "12", ".", "5", "%"}) : (Pieces{"$", "1", "2", ".", "5", "%"}));
    // Arabic-Indic digits are \p{N}; an ill-formed byte is neither letter, number nor space.
    EXPECT_EQ(split_by_pattern("caf\xC3\xA9 \xD9\xA1\xD9\xA2", p),
              llama ? (Pieces{"caf\xC3\xA9", " ", "\xD9\xA1\xD9\xA2"})
                    : (Pieces{"caf\xC3\xA9", " ", "\xD9\xA1", "\xD9\xA2"}));
    EXPECT_EQ(split_by_pattern("a\xFF"
                               "b",
                               p),
              (Pieces{"a",
                      "\xFF"
                      "b"}));
    EXPECT_TRUE(split_by_pattern("", p).empty());
  }
}

TEST(SplitPattern, RecognisedByTheirExactText) {
  SplitPattern p = SplitPattern::Gpt2;
  for (SplitPattern known : {SplitPattern::Gpt2, SplitPattern::Llama3, SplitPattern::Qwen2}) {
    ASSERT_TRUE(find_split_pattern(split_pattern_regex(known), &p)) << split_pattern_name(known);
    EXPECT_EQ(p, known);
  }
  EXPECT_FALSE(
      find_split_pattern(std::string(split_pattern_regex(SplitPattern::Llama3)) + " ", &p));
  EXPECT_FALSE(find_split_pattern(R"(\w+|[^\w\s]+)", &p));
}

TEST(Nfc, ComposesAsUnicodedata) {
  EXPECT_EQ(nfc("plain ascii, caf\xC3\xA9"), "plain ascii, caf\xC3\xA9");
  EXPECT_EQ(nfc("e\xCC\x81"), "\xC3\xA9");                                 // e + acute -> é
  EXPECT_EQ(nfc("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8"), "\xEA\xB0\x81");  // L V T -> 각
  EXPECT_EQ(nfc("\xEA\xB0\x80\xE1\x86\xA8"), "\xEA\xB0\x81");              // LV T -> 각
  EXPECT_EQ(nfc("q\xCC\x87\xCC\xA3"), "q\xCC\xA3\xCC\x87");                // marks in class order
  EXPECT_EQ(nfc("\xE2\x84\xAB"), "\xC3\x85");                              // ANGSTROM SIGN -> Å
  EXPECT_EQ(nfc("\xCD\x84"), "\xCC\x88\xCC\x81");           // excluded from composition
  EXPECT_EQ(nfc("a\xCC\x81\xCC\x81"), "\xC3\xA1\xCC\x81");  // the second is blocked
  EXPECT_EQ(nfc("\xCC\x81"
                "e\xCC\x81\xFF\xCC\x81"),
            "\xCC\x81\xC3\xA9\xFF\xCC\x81");  // an ill-formed byte passes and blocks
}

TEST(HfTokenizer, EncodesLikeTokenizers) {
  const HfTokenizer t = tokenizer(llama_like());
  EXPECT_EQ(t.encode("hello world", false), (Ids{258, 'o', 263}));
  EXPECT_EQ(t.encode("hello world"), (Ids{264, 258, 'o', 263}));  // the template's BOS
  EXPECT_EQ(t.encode(""), (Ids{264}));
  // Added tokens first, longest at the leftmost position; the text between goes through BPE.
  EXPECT_EQ(t.encode("<|eot_id|>hello", false), (Ids{265, 258, 'o'}));
  EXPECT_EQ(t.encode("<x><y>", false), (Ids{267}));
  EXPECT_EQ(t.encode("<x><z>", false), (Ids{266, '<', 'z', '>'}));
  EXPECT_EQ(t.encode("a<|begin_of_text|>", false), (Ids{'a', 264}));
  EXPECT_EQ(t.vocab_size(), 268);
  EXPECT_EQ(t.token_to_id("<|eot_id|>"), 265);
  EXPECT_EQ(t.token_to_id("\xC4\xA0world"), 263);
  EXPECT_EQ(t.token_to_id("nothing"), -1);
  ASSERT_NE(t.id_to_token(258), nullptr);
  EXPECT_EQ(*t.id_to_token(258), "hell");
  EXPECT_EQ(t.id_to_token(999), nullptr);
  EXPECT_EQ(t.end_of_text_id(), 265);
  EXPECT_EQ(t.stop_token_ids(), (Ids{265}));
  // RobertaProcessing: cls, the text, sep.
  Spec roberta = llama_like();
  roberta.post_processor = R"({"type": "RobertaProcessing", "sep": ["<|eot_id|>", 265],
      "cls": ["<|begin_of_text|>", 264], "trim_offsets": true, "add_prefix_space": false})";
  EXPECT_EQ(tokenizer(roberta).encode("hello"), (Ids{264, 258, 'o', 265}));
  EXPECT_EQ(tokenizer(roberta).encode("hello", false), (Ids{258, 'o'}));
  // The old merges form ("a b") reads the same.
  Spec strings = llama_like();
  strings.merges_as_strings = true;
  EXPECT_EQ(tokenizer(strings).encode("hello world"), (Ids{264, 258, 'o', 263}));
}

TEST(HfTokenizer, DecodesLikeTokenizers) {
  const HfTokenizer t = tokenizer(llama_like());
  const Ids ids{264, 258, 'o', 263, 265};
  EXPECT_EQ(t.decode(ids), "<|begin_of_text|>hello world<|eot_id|>");
  EXPECT_EQ(t.decode(ids, true), "hello world");
  EXPECT_EQ(t.decode({266, 999, -1, 'a'}, true), "<x>a");  // not special; unknown ids skipped
  // A character cut between tokens is U+FFFD, as String::from_utf8_lossy makes it.
  EXPECT_EQ(t.decode({0xE6, 0x97}), "\xEF\xBF\xBD");
  EXPECT_EQ(t.decode({'a', 0xE6}), "a\xEF\xBF\xBD");
  // An added token whose characters are not byte symbols decodes as its own UTF-8.
  Spec s = llama_like();
  s.added_tokens = "[" + added(264, "two words \xE2\x9C\x93", true) + "]";
  s.post_processor = "null";
  EXPECT_EQ(tokenizer(s).decode({'a', 264}), "atwo words \xE2\x9C\x93");
}

TEST(HfTokenizer, PreTokenizersAndNormalizer) {
  Spec s;
  s.vocab = {{"12", 256}, {"34", 257}};
  s.merges = {{"1", "2"}, {"3", "4"}};
  // GPT-2's pattern keeps 1234567 whole, Llama 3's cuts it after 3, Qwen2's after each digit.
  EXPECT_EQ(tokenizer(s).encode("1234567"), (Ids{256, 257, '5', '6', '7'}));
  s.pre_tokenizer = split_then_byte_level(SplitPattern::Llama3);
  EXPECT_EQ(tokenizer(s).encode("1234567"), (Ids{256, '3', '4', '5', '6', '7'}));
  s.pre_tokenizer = split_then_byte_level(SplitPattern::Qwen2);
  EXPECT_EQ(tokenizer(s).encode("1234567"), (Ids{'1', '2', '3', '4', '5', '6', '7'}));
  // add_prefix_space: each text between added tokens starts with a space (Ġ = byte 0x20).
  s.pre_tokenizer =
      R"({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true})";
  s.added_tokens = "[" + added(258, "<s>", true) + "]";
  EXPECT_EQ(tokenizer(s).encode("a<s>b"), (Ids{' ', 'a', 258, ' ', 'b'}));
  EXPECT_EQ(tokenizer(s).encode(" a"), (Ids{' ', 'a'}));
  // NFC before pre-tokenization: e + combining acute is é's two bytes.
  Spec n;
  EXPECT_EQ(tokenizer(n).encode("e\xCC\x81"), (Ids{'e', 0xCC, 0x81}));
  n.normalizer = R"({"type": "NFC"})";
  EXPECT_EQ(tokenizer(n).encode("e\xCC\x81"), (Ids{0xC3, 0xA9}));
  n.normalizer = R"({"type": "Sequence", "normalizers": [{"type": "NFC"}]})";
  EXPECT_EQ(tokenizer(n).encode("e\xCC\x81"), (Ids{0xC3, 0xA9}));
}

TEST(HfTokenizer, IgnoreMergesUnknownBytesAndStrips) {
  Spec s;
  s.vocab = {{"\xC4\xA0xyz", 256}};
  EXPECT_EQ(tokenizer(s).encode(" xyz"), (Ids{' ', 'x', 'y', 'z'}));  // no merge makes it
  s.model.replace(s.model.find("\"ignore_merges\": false"), 22, "\"ignore_merges\": true");
  EXPECT_EQ(tokenizer(s).encode(" xyz"), (Ids{256}));
  // A byte the vocabulary lacks is unk_token (fused or not), or an error without one.
  Spec u;
  u.missing_bytes = {'z'};
  u.vocab = {{"<unk>", 300}};
  u.model.replace(u.model.find("\"unk_token\": null"), 17, "\"unk_token\": \"<unk>\"");
  EXPECT_EQ(tokenizer(u).encode("azz b"), (Ids{'a', 300, 300, ' ', 'b'}));
  u.model.replace(u.model.find("\"fuse_unk\": false"), 17, "\"fuse_unk\": true");
  EXPECT_EQ(tokenizer(u).encode("azz b"), (Ids{'a', 300, ' ', 'b'}));
  Spec missing;
  missing.missing_bytes = {'z'};
  EXPECT_NE(error_of([&] { tokenizer(missing).encode("a zz"); })
                .find("tok.json: the symbol 'z' (of the text's piece ' zz') is not in the "
                      "vocabulary"),
            std::string::npos);
  // lstrip and rstrip take the white space beside an added token into it.
  Spec strip;
  strip.added_tokens = "[" + added(256, "<m>", true, R"("lstrip": true, "rstrip": false)") + ", " +
                       added(257, "[r]", false, R"("lstrip": false, "rstrip": true)") + "]";
  const HfTokenizer t = tokenizer(strip);
  EXPECT_EQ(t.encode("a  <m> b"), (Ids{'a', 256, ' ', 'b'}));
  EXPECT_EQ(t.encode("[r]  b"), (Ids{257, 'b'}));
  EXPECT_EQ(t.decode({'a', 256, 257}), "a<m>[r]");
}

// Bad input is an InputError, never a crash: every truncation and many byte changes of a good
// file; any bytes to encode (ill-formed UTF-8 too) come back from decode as they went in, with
// ill-formed sequences as U+FFFD.
TEST(HfTokenizer, NoInputCrashesIt) {
  const std::string good = json_of(llama_like());
  std::mt19937 rng(5);
  int loaded = 0, refused = 0;
  const auto load = [&](const std::string& text) {
    try {
      HfTokenizer::from_json(text, "tok.json").encode("hello <x> world");
      ++loaded;
    } catch (const InputError&) {
      ++refused;
    }
  };
  for (std::size_t n = 0; n < good.size(); n += 3) load(good.substr(0, n));
  const std::string bytes = "{}[]\":,0123456789-.eE \\nulltruefalse\xC4\xFF";
  for (int i = 0; i < 3000; ++i) {
    std::string bad = good;
    for (int k = 0; k < 1 + i % 3; ++k) bad[rng() % bad.size()] = bytes[rng() % bytes.size()];
    load(bad);
  }
  EXPECT_GT(loaded, 0);
  EXPECT_GT(refused, 1000);
  const HfTokenizer t = tokenizer(llama_like());
  for (int i = 0; i < 2000; ++i) {
    std::string text(rng() % 24, ' ');
    for (char& c : text)
      c = static_cast<char>(rng() % 4 == 0 ? bytes[rng() % bytes.size()] : rng());
    EXPECT_EQ(t.decode(t.encode(text, false)), replace_invalid_utf8(text));
  }
}

TEST(HfTokenizer, LoadsFromAFile) {
  const std::string path = scratch_file("ok.json", json_of(llama_like()));
  EXPECT_EQ(HfTokenizer::load(path).encode("hello"), (Ids{264, 258, 'o'}));
  EXPECT_EQ(HfTokenizer::load(path).source(), path);
  std::remove(path.c_str());
}

// Every refusal names the file, the field and where it is.
TEST(HfTokenizer, ErrorsNameTheFileAndTheProblem) {
  EXPECT_NE(error_of([] {
              HfTokenizer::load("/nonexistent/tokenizer.json");
            }).find("/nonexistent/tokenizer.json: cannot open the tokenizer: nothing (no such"),
            std::string::npos);
  const std::string fifo = scratch_file("fifo.json", "");
  ASSERT_EQ(std::remove(fifo.c_str()), 0);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_NE(error_of([&] {
              HfTokenizer::load(fifo);
            }).find(fifo + ": the tokenizer must be a regular file, but it is a FIFO"),
            std::string::npos);
  std::remove(fifo.c_str());

  const auto refused = [](const Spec& s, const std::string& part) {
    const std::string e = error_of([&] { tokenizer(s); });
    EXPECT_EQ(e.rfind("tok.json: ", 0), 0u) << e;
    EXPECT_NE(e.find(part), std::string::npos) << e;
  };
  const auto with = [](std::string Spec::*field, const std::string& value) {
    Spec s = llama_like();
    s.*field = value;
    return s;
  };
  EXPECT_NE(error_of([] {
              HfTokenizer::from_json("{\"model\": {,}}", "tok.json");
            }).find("tok.json: bad JSON at line 1, column 12: expected a string"),
            std::string::npos);
  refused(with(&Spec::model, R"("type": "WordPiece")"),
          "model (line 16, column 10): type 'WordPiece' is not supported (Kiln reads BPE)");
  refused(with(&Spec::model, R"("type": "BPE", "byte_fallback": true)"),
          "model.byte_fallback (line 16, column 43): byte fallback");
  refused(with(&Spec::model, R"("type": "BPE", "dropout": 0.1)"), "model.dropout");
  refused(with(&Spec::model, R"("type": "BPE", "continuing_subword_prefix": "##")"),
          "model.continuing_subword_prefix");
  refused(with(&Spec::normalizer, R"({"type": "NFKC"})"),
          "normalizer (line 3, column 15): type 'NFKC' is not supported (Kiln reads NFC");
  refused(with(&Spec::pre_tokenizer, "null"), "pre_tokenizer (line 1, column 1): is null");
  refused(with(&Spec::pre_tokenizer, R"({"type": "Metaspace"})"), "type 'Metaspace'");
  Spec other = llama_like();
  other.pre_tokenizer = split_then_byte_level(SplitPattern::Llama3);
  other.pre_tokenizer.replace(other.pre_tokenizer.find("{1,3}"), 5, "+");
  refused(other, "pre_tokenizer.pretokenizers[0].pattern.Regex (line 5, column 46): the pattern");
  Spec removed = llama_like();
  removed.pre_tokenizer = split_then_byte_level(SplitPattern::Gpt2);
  removed.pre_tokenizer.replace(removed.pre_tokenizer.find("Isolated"), 8, "Removed");
  refused(removed, "pre_tokenizer.pretokenizers[0].behavior");
  refused(with(&Spec::pre_tokenizer,
               R"({"type": "Sequence", "pretokenizers": [{"type": "ByteLevel"},
                   {"type": "Split", "pattern": {"String": " "}, "behavior": "Isolated"}]})"),
          "ByteLevel must be the last pre-tokenizer step");
  refused(with(&Spec::decoder, "null"), "has no 'decoder'");
  refused(with(&Spec::decoder, R"({"type": "WordPiece"})"), "decoder (line 14, column 12)");
  refused(with(&Spec::post_processor, R"({"type": "BertProcessing"})"),
          "post_processor (line 6, column 19): type 'BertProcessing' is not supported");
  refused(with(&Spec::post_processor,
               R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}}],
                   "special_tokens": {}})"),
          "post_processor.single[0].SpecialToken (line 6, column 78): '<s>' is not in");
  refused(with(&Spec::top, R"("version": "2.0")"), "version (line 1, column 13)");
  refused(with(&Spec::top, R"("truncation": {"max_length": 8})"), "truncation (line 1, column 16)");
  refused(with(&Spec::added_tokens, "[" + added(300, "<a>", true) + "]"),
          "added_tokens[0] (line 2, column 18): '<a>' has id 300 here, but tokenizers gives it id "
          "264");
  refused(with(&Spec::added_tokens,
               "[" + added(264, "<a>", true, R"("lstrip": false, "rstrip": false)", true) + "]"),
          "single_word is not supported");
  refused(with(&Spec::added_tokens,
               "[" + added(264, "<a>", true) + ", " + added(265, "<a>", true) + "]"),
          "'<a>' is added twice");
  Spec bad_merge = llama_like();
  bad_merge.merges.push_back({"x", "yz"});
  refused(bad_merge, "the merge of rank 8 ('x yz'): 'yz' is not in the vocabulary");
  Spec bad_id = llama_like();
  bad_id.vocab.push_back({"neg", -2});
  refused(bad_id, "model.vocab.neg (line 19, column");
}

}  // namespace
}  // namespace kiln::data
