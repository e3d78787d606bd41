// kiln tokenize's parts (data/llmc_shard_writer.h, data/text_documents.h,
// data/corpus_tokenizer.h) on files written here: shards read back by the reader Kiln trains
// from (uint16 and uint32, cut at the shard size, nothing visible before commit), documents of
// .txt, .jsonl and gzip, errors naming file:line under stop and skip, the val split, the
// separator, and shards byte for byte the same for every thread count. The ids against
// tokenizers itself: tokenize_check.py.

#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/json_writer.h"
#include "data/byte_level_bpe.h"
#include "data/corpus_tokenizer.h"
#include "data/file_io.h"
#include "data/llmc_shard_writer.h"
#include "data/llmc_shards.h"
#include "data/text_documents.h"
#include "tests/data/test_util.h"

namespace kiln::data {
namespace {

using testing::expect_input_error;
using testing::ScratchDir;

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// gzip of `text` in one member, or in two (gzip -c a b > ab.gz).
void write_gzip(const std::string& path, const std::string& text, bool two_members = false) {
  if (!two_members) {
    write_file(path, text.data(), text.size(), true);
    return;
  }
  const std::size_t half = text.size() / 2;
  write_file(path + ".a", text.data(), half, true);
  write_file(path + ".b", text.data() + half, text.size() - half, true);
  write_text(path, file_bytes(path + ".a") + file_bytes(path + ".b"));
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> names;
  if (!std::filesystem::exists(dir)) return names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::int64_t> shard_tokens(const std::string& path, std::int64_t vocab) {
  const LlmcShard shard(path, vocab);
  std::vector<std::int64_t> ids(static_cast<std::size_t>(shard.token_count()));
  shard.read_tokens(0, shard.token_count(), ids.data());
  return ids;
}

std::vector<std::int32_t> header_of(const std::string& path) {
  const std::string bytes = file_bytes(path);
  std::vector<std::int32_t> header(3);
  std::memcpy(header.data(), bytes.data(), 12);  // the test host is little-endian
  return header;
}

// ---------------------------------------------------------------------------------------------
// The shard writer.

TEST(LlmcShardWriter, Uint16ShardsCutAtTheShardSizeReadBackByTheReader) {
  ScratchDir dir;
  std::vector<std::uint32_t> tokens;
  for (std::uint32_t i = 0; i < 25; ++i) tokens.push_back(i * 2000 + 7);  // up to 48007
  {
    LlmcShardWriter w(dir.path(), "corpus", "train", 1, 10, 50257);
    EXPECT_EQ(w.token_bytes(), 2);
    w.write(tokens.data(), 3);  // writes that straddle the shard boundaries
    w.write(tokens.data() + 3, 15);
    w.write(tokens.data() + 18, 7);
    // Nothing under a shard's name before commit: a glob of shards sees none.
    EXPECT_TRUE(glob_paths(dir.file("corpus_train_*.bin")).empty());
    const std::vector<std::string> paths = w.commit();
    ASSERT_EQ(paths, (std::vector<std::string>{dir.file("corpus_train_000001.bin"),
                                               dir.file("corpus_train_000002.bin"),
                                               dir.file("corpus_train_000003.bin")}));
  }
  EXPECT_EQ(files_in(dir.path()),
            (std::vector<std::string>{"corpus_train_000001.bin", "corpus_train_000002.bin",
                                      "corpus_train_000003.bin"}));
  const std::vector<std::int64_t> counts = {10, 10, 5};
  std::vector<std::int64_t> all;
  for (int s = 0; s < 3; ++s) {
    const std::string path = dir.file("corpus_train_00000" + std::to_string(s + 1) + ".bin");
    EXPECT_EQ(header_of(path),
              (std::vector<std::int32_t>{20240520, 1, static_cast<std::int32_t>(counts[s])}));
    EXPECT_EQ(std::filesystem::file_size(path), 1024 + 2 * counts[s]);
    for (std::int64_t id : shard_tokens(path, 50257)) all.push_back(id);
  }
  EXPECT_EQ(all, std::vector<std::int64_t>(tokens.begin(), tokens.end()));
  // And as the dataset a run trains from: windows of T = 4 over the glob.
  LlmcShardDataset dataset(dir.file("corpus_train_*.bin"), 4, 50257);
  EXPECT_EQ(dataset.size(), 2 + 2 + 1);
}

TEST(LlmcShardWriter, Uint32ForVocabulariesPast65536) {
  EXPECT_EQ(LlmcShardWriter::token_bytes_for(65536), 2);
  EXPECT_EQ(LlmcShardWriter::token_bytes_for(65537), 4);
  ScratchDir dir;
  const std::vector<std::uint32_t> tokens = {128000, 0, 65535, 65536, 128255, 70000, 9};
  {
    LlmcShardWriter w(dir.path(), "llama", "val", 0, 100, 128256);
    EXPECT_EQ(w.token_bytes(), 4);
    for (std::uint32_t t : tokens) w.write(t);
    EXPECT_EQ(w.commit(), std::vector<std::string>{dir.file("llama_val_000000.bin")});
  }
  const std::string path = dir.file("llama_val_000000.bin");
  EXPECT_EQ(header_of(path), (std::vector<std::int32_t>{20240801, 7, 7}));
  EXPECT_EQ(std::filesystem::file_size(path), 1024u + 4 * 7);
  EXPECT_EQ(shard_tokens(path, 128256), std::vector<std::int64_t>(tokens.begin(), tokens.end()));
  EXPECT_EQ(LlmcShard(path, 128256).token_bytes(), 4);
}

TEST(LlmcShardWriter, UncommittedShardsAreRemovedAndBadIdsRefused) {
  ScratchDir dir;
  {
    LlmcShardWriter w(dir.path(), "x", "train", 1, 4, 1000);
    const std::vector<std::uint32_t> tokens(10, 5);
    w.write(tokens.data(), tokens.size());  // two complete shards and one open
    EXPECT_EQ(w.shards_started(), 3);
    EXPECT_EQ(files_in(dir.path()).size(), 3u);  // under temporary names
    for (const std::string& name : files_in(dir.path())) {
      EXPECT_NE(name.find(".bin.tmp."), std::string::npos) << name;
    }
  }  // destroyed without commit
  EXPECT_TRUE(files_in(dir.path()).empty());
  LlmcShardWriter w(dir.path(), "x", "train", 1, 4, 1000);
  expect_input_error([&] { w.write(1000); }, {"token id 1000", "vocabulary size 1000"});
  expect_input_error([&] { LlmcShardWriter(dir.path(), "x", "train", 1, 0, 1000); },
                     {"must be from 1 to 2147483647"});
}

// ---------------------------------------------------------------------------------------------
// Reading documents.

std::vector<RawDocument> read_all(TextDocumentReader& reader) {
  std::vector<RawDocument> docs;
  RawDocument d;
  while (reader.next(&d)) docs.push_back(d);
  return docs;
}

// The texts of every document, or "ERROR <message>" for a document that has none.
std::vector<std::string> texts_of(const std::vector<std::string>& inputs,
                                  const std::string& field = "text") {
  TextDocumentReader reader(expand_text_inputs(inputs));
  std::vector<std::string> out;
  for (RawDocument& d : read_all(reader)) {
    if (!d.error.empty()) {
      out.push_back("ERROR " + d.error);
      continue;
    }
    try {
      out.push_back(document_text(std::move(d), reader.files()[d.file], field));
    } catch (const InputError& e) {
      out.push_back("ERROR " + std::string(e.what()));
    }
  }
  return out;
}

TEST(TextDocuments, TxtIsOneDocumentJsonlOneALineGzipEither) {
  ScratchDir dir;
  write_text(dir.file("b.txt"), "line one\nline two\n");
  write_text(dir.file("a.txt"), "");  // an empty file: an empty document
  write_text(dir.file("c.jsonl"),
             "{\"text\": \"first\"}\n\n  \r\n{\"id\": 2, \"text\": \"caf\\u00e9\\n\"}\r\n"
             "{\"text\": \"no newline at the end\"}");
  write_gzip(dir.file("d.jsonl.gz"), "{\"text\": \"gz one\"}\n{\"text\": \"gz two\"}\n", true);
  write_gzip(dir.file("e.txt.gz"), "a gzip text\nof two lines");
  const std::vector<std::string> texts =
      texts_of({dir.file("*.txt"), dir.file("c.jsonl"), dir.file("*.gz"), dir.file("a.txt")});
  EXPECT_EQ(texts, (std::vector<std::string>{"", "line one\nline two\n", "first", "caf\xC3\xA9\n",
                                             "no newline at the end", "gz one", "gz two",
                                             "a gzip text\nof two lines"}));
  // Lines are numbered in the file, blank ones included.
  TextDocumentReader reader(expand_text_inputs({dir.file("c.jsonl")}));
  std::vector<std::int64_t> lines;
  for (const RawDocument& d : read_all(reader)) lines.push_back(d.line);
  EXPECT_EQ(lines, (std::vector<std::int64_t>{1, 4, 5}));
  // Another field.
  write_text(dir.file("f.jsonl"), "{\"content\": \"x\", \"text\": 1}\n");
  EXPECT_EQ(texts_of({dir.file("f.jsonl")}, "content"), std::vector<std::string>{"x"});
}

TEST(TextDocuments, BadInputNamesTheFileAndLine) {
  ScratchDir dir;
  write_text(dir.file("bad.txt"), "fine\nfine too\nbad \xFF byte\n");
  write_text(dir.file("bad.jsonl"),
             "{\"text\": \"ok\"}\n{\"text\": \"ok\"\n[1, 2]\n{\"body\": \"x\"}\n{\"text\": 5}\n"
             "{\"text\": \"\xC3\x28\"}\n{\"text\": \"\\ud800\"}\n");
  const std::vector<std::string> texts = texts_of({dir.file("bad.txt"), dir.file("bad.jsonl")});
  ASSERT_EQ(texts.size(), 8u);
  const auto expect_error = [&](std::size_t i, const std::vector<std::string>& fragments) {
    for (const std::string& f : fragments) {
      EXPECT_NE(texts[i].find(f), std::string::npos) << "document " << i << ": " << texts[i];
    }
  };
  expect_error(0, {"ERROR " + dir.file("bad.txt") + ":3: invalid UTF-8: byte 0xFF at column 5"});
  EXPECT_EQ(texts[1], "ok");
  expect_error(2, {dir.file("bad.jsonl") + ":2: not a JSON line"});
  expect_error(3, {dir.file("bad.jsonl") + ":3: expected a JSON object", "found an array"});
  expect_error(4, {dir.file("bad.jsonl") + ":4: no field 'text'", "has body"});
  expect_error(5, {dir.file("bad.jsonl") + ":5: field 'text' is a number, not a string"});
  expect_error(6, {dir.file("bad.jsonl") + ":6: invalid UTF-8: byte 0xC3 at column 11"});
  expect_error(7, {dir.file("bad.jsonl") + ":7: not a JSON line"});
}

TEST(TextDocuments, CorruptAndTruncatedGzipNameTheFileAndLine) {
  ScratchDir dir;
  std::string text;
  for (int i = 1; i <= 20000; ++i) text += "{\"text\": \"line " + std::to_string(i) + "\"}\n";
  write_gzip(dir.file("whole.jsonl.gz"), text);
  const std::string gz = file_bytes(dir.file("whole.jsonl.gz"));
  write_text(dir.file("cut.jsonl.gz"), gz.substr(0, gz.size() / 2));
  std::string corrupt = gz;
  for (std::size_t i = corrupt.size() / 2; i < corrupt.size() / 2 + 64; ++i) corrupt[i] ^= 0x5A;
  write_text(dir.file("corrupt.jsonl.gz"), corrupt);
  write_text(dir.file("plain.txt.gz"), "not gzip at all");
  // Cut: every line before the cut is read, then one error on the line the cut falls in.
  const std::vector<std::string> cut = texts_of({dir.file("cut.jsonl.gz")});
  ASSERT_GT(cut.size(), 100u);
  EXPECT_LT(cut.size(), 20000u);
  for (std::size_t i = 0; i + 1 < cut.size(); ++i) {
    ASSERT_EQ(cut[i], "line " + std::to_string(i + 1));
  }
  EXPECT_EQ(cut.back().rfind("ERROR " + dir.file("cut.jsonl.gz") + ":" +
                                 std::to_string(cut.size()) + ": truncated gzip stream",
                             0),
            0u)
      << cut.back();
  // Corrupt in the middle: an error naming the file and a line, before the end of the lines.
  const std::vector<std::string> corrupted = texts_of({dir.file("corrupt.jsonl.gz")});
  ASSERT_FALSE(corrupted.empty());
  EXPECT_LT(corrupted.size(), 20000u);
  EXPECT_EQ(corrupted.back().rfind("ERROR " + dir.file("corrupt.jsonl.gz") + ":", 0), 0u)
      << corrupted.back();
  EXPECT_NE(corrupted.back().find(": corrupt gzip stream: "), std::string::npos)
      << corrupted.back();
  // Not gzip at all: line 1.
  const std::vector<std::string> plain = texts_of({dir.file("plain.txt.gz")});
  ASSERT_EQ(plain.size(), 1u);
  EXPECT_EQ(plain[0].rfind("ERROR " + dir.file("plain.txt.gz") + ":1: corrupt gzip stream", 0), 0u)
      << plain[0];
}

TEST(TextDocuments, GlobsMustMatchCorpusFiles) {
  ScratchDir dir;
  expect_input_error([&] { expand_text_inputs({dir.file("*.jsonl")}); },
                     {dir.file("*.jsonl") + ": matches no file"});
  write_text(dir.file("notes.md"), "x");
  expect_input_error([&] { expand_text_inputs({dir.file("*.md")}); },
                     {dir.file("notes.md"), "not a corpus file", ".jsonl.gz"});
  write_text(dir.file("a.txt"), "x");
  // A file matched twice is read once.
  EXPECT_EQ(expand_text_inputs({dir.file("a.txt"), dir.file("*.txt")}).size(), 1u);
}

// ---------------------------------------------------------------------------------------------
// The whole: tokenize_corpus.

// A byte-level tokenizer: the 256 byte symbols, a few merges, and added tokens.
std::string tokenizer_json(bool llama) {
  return testing::byte_level_tokenizer_json(
      {{"\xC4\xA0", "t"}, {"h", "e"}, {"\xC4\xA0t", "he"}, {"i", "n"}, {"o", "n"}, {"e", "r"}},
      llama ? std::vector<std::string>{"<|begin_of_text|>", "<|end_of_text|>"}
            : std::vector<std::string>{"<|endoftext|>"});
}

HfTokenizer test_tokenizer(bool llama = false) {
  return HfTokenizer::from_json(tokenizer_json(llama), "tok.json");
}

// Every shard of `dir` in llm.c's order (val, then train), read by the reader.
std::vector<std::int64_t> tokens_of(const std::string& dir, const std::string& split,
                                    std::int64_t vocab) {
  std::vector<std::int64_t> all;
  for (const std::string& path : glob_paths(join_path(dir, "*_" + split + "_*.bin"))) {
    for (std::int64_t id : shard_tokens(path, vocab)) all.push_back(id);
  }
  return all;
}

std::vector<std::int64_t> expected_tokens(const HfTokenizer& t,
                                          const std::vector<std::string>& docs,
                                          std::int64_t separator) {
  HfTokenizer::EncodeOptions plain;
  plain.add_special_tokens = false;
  plain.split_special_tokens = true;
  std::vector<std::int64_t> ids;
  for (const std::string& doc : docs) {
    ids.push_back(separator);
    t.encode(doc, plain, nullptr, &ids);
  }
  return ids;
}

CorpusTokenizeResult run(const HfTokenizer& t, CorpusTokenizeOptions o,
                         std::vector<std::string>* skipped = nullptr) {
  return tokenize_corpus(t, o, {}, [&](const std::string& message) {
    if (skipped != nullptr) skipped->push_back(message);
  });
}

TEST(TokenizeCorpus, DocumentsInOrderWithSeparatorsAcrossShards) {
  ScratchDir dir;
  const std::vector<std::string> docs = {"the thin one", "other\nthings <|endoftext|> in",
                                         "\xE6\x97\xA5\xE6\x9C\xAC then", "", "on and on"};
  std::filesystem::create_directories(dir.file("in"));
  write_text(dir.file("in/0.txt"), docs[0]);
  write_text(dir.file("in/1.jsonl"), "{\"text\": " + JsonWriter::quote(docs[1]) +
                                         "}\n{\"text\": " + JsonWriter::quote(docs[2]) + "}\n");
  write_gzip(dir.file("in/2.jsonl.gz"), "{\"text\": \"\"}\n{\"text\": \"on and on\"}\n");
  const HfTokenizer t = test_tokenizer();
  CorpusTokenizeOptions o;
  o.inputs = {dir.file("in/*.txt"), dir.file("in/*.jsonl*")};
  o.output_dir = dir.file("out/corpus");
  o.shard_tokens = 7;
  o.val_fraction = 0;
  const CorpusTokenizeResult r = run(t, o);
  EXPECT_EQ(r.separator, "<|endoftext|>");
  EXPECT_EQ(r.separator_id, 262);
  EXPECT_EQ(r.documents, 5);
  EXPECT_EQ(r.skipped, 0);
  const std::vector<std::int64_t> want = expected_tokens(t, docs, 262);
  EXPECT_EQ(r.tokens, static_cast<std::int64_t>(want.size()));
  EXPECT_EQ(tokens_of(o.output_dir, "train", t.vocab_size()), want);
  EXPECT_TRUE(r.val_shards.empty());
  // Named after the folder, numbered from 000001, all full but the last.
  ASSERT_EQ(r.train_shards.size(), (want.size() + 6) / 7);
  EXPECT_EQ(r.train_shards[0], dir.file("out/corpus/corpus_train_000001.bin"));
  for (std::size_t s = 0; s + 1 < r.train_shards.size(); ++s) {
    EXPECT_EQ(LlmcShard(r.train_shards[s], t.vocab_size()).token_count(), 7);
  }
  // The text "<|endoftext|>" inside a document is text, not a separator.
  EXPECT_EQ(std::count(want.begin(), want.end(), 262), 5);
  // A second run into the same folder is refused: shards of two runs never mix.
  expect_input_error([&] { run(t, o); }, {"already holds", "corpus_train_*.bin"});
}

TEST(TokenizeCorpus, ValShardsTakeTheFirstAndEveryNthDocument) {
  ScratchDir dir;
  std::string jsonl;
  std::vector<std::string> val_docs, train_docs;
  for (int k = 0; k < 10; ++k) {
    const std::string doc = "doc " + std::to_string(k) + " then on";
    jsonl += "{\"text\": \"" + doc + "\"}\n";
    (k % 4 == 0 ? val_docs : train_docs).push_back(doc);  // f = 0.25: documents 0, 4, 8
  }
  write_text(dir.file("c.jsonl"), jsonl);
  const HfTokenizer t = test_tokenizer();
  CorpusTokenizeOptions o;
  o.inputs = {dir.file("c.jsonl")};
  o.output_dir = dir.file("out");
  o.name = "tiny";
  o.val_fraction = 0.25;
  const CorpusTokenizeResult r = run(t, o);
  EXPECT_EQ(r.val_documents, 3);
  EXPECT_EQ(r.val_shards, std::vector<std::string>{dir.file("out/tiny_val_000000.bin")});
  EXPECT_EQ(r.train_shards, std::vector<std::string>{dir.file("out/tiny_train_000001.bin")});
  EXPECT_EQ(tokens_of(o.output_dir, "val", t.vocab_size()), expected_tokens(t, val_docs, 262));
  EXPECT_EQ(tokens_of(o.output_dir, "train", t.vocab_size()), expected_tokens(t, train_docs, 262));
}

TEST(TokenizeCorpus, SeparatorByTokenizerOrOption) {
  std::int64_t id = -1;
  EXPECT_EQ(choose_separator(test_tokenizer(true), "", &id), "<|begin_of_text|>");
  EXPECT_EQ(id, 262);
  EXPECT_EQ(choose_separator(test_tokenizer(true), "<|end_of_text|>", &id), "<|end_of_text|>");
  EXPECT_EQ(id, 263);
  EXPECT_EQ(choose_separator(test_tokenizer(false), "", &id), "<|endoftext|>");
  EXPECT_EQ(choose_separator(test_tokenizer(false), "Ġthe", &id), "Ġthe");  // any token
  expect_input_error(
      [] {
        std::int64_t i;
        choose_separator(test_tokenizer(), "<|eot_id|>", &i);
      },
      {"--separator '<|eot_id|>'", "no such token"});
  std::string json = tokenizer_json(false);
  json.replace(json.find("<|endoftext|>"), 13, "<|something|>");
  expect_input_error(
      [&] {
        std::int64_t i;
        choose_separator(HfTokenizer::from_json(json, "none.json"), "", &i);
      },
      {"none.json", "neither <|begin_of_text|>", "<|endoftext|>", "--separator"});
  EXPECT_EQ(default_shard_name("/data/fineweb10B/"), "fineweb10B");
  EXPECT_EQ(default_shard_name("out"), "out");
}

// A corpus with bad documents among good ones, in every kind of file.
struct BadCorpus {
  std::vector<std::string> inputs;
  std::vector<std::string> good;    // the good documents' texts, in order
  std::vector<std::string> errors;  // what each bad one's message starts with, in order
};

BadCorpus bad_corpus(const ScratchDir& dir) {
  BadCorpus c;
  write_text(dir.file("a.txt"), "a good text");
  write_text(dir.file("b.txt"), "ok\n\xC0\xAF bad");
  write_text(dir.file("c.jsonl"),
             "{\"text\": \"one\"}\nnot json\n{\"text\": \"two\"}\n{\"t\": 1}\n{\"text\": null}\n");
  write_gzip(dir.file("d.jsonl.gz"), "{\"text\": \"three\"}\n");
  std::string cut;
  for (int i = 0; i < 3000; ++i) cut += "{\"text\": \"cut " + std::to_string(i) + "\"}\n";
  write_gzip(dir.file("e.jsonl.gz"), cut);
  const std::string e = file_bytes(dir.file("e.jsonl.gz"));
  write_text(dir.file("e.jsonl.gz"), e.substr(0, e.size() - 20));  // the end cut off
  c.inputs = {dir.file("*.txt"), dir.file("c.jsonl"), dir.file("*.gz")};
  c.good = {"a good text", "one", "two", "three"};
  c.errors = {dir.file("b.txt") + ":2: invalid UTF-8", dir.file("c.jsonl") + ":2: not a JSON line",
              dir.file("c.jsonl") + ":4: no field 'text'",
              dir.file("c.jsonl") + ":5: field 'text' is null"};
  return c;
}

TEST(TokenizeCorpus, SkipCountsBadDocumentsAndNamesThemInOrder) {
  ScratchDir dir;
  const BadCorpus c = bad_corpus(dir);
  const HfTokenizer t = test_tokenizer();
  CorpusTokenizeOptions o;
  o.inputs = c.inputs;
  o.output_dir = dir.file("out");
  o.val_fraction = 0;
  o.on_error = OnDocumentError::kSkip;
  std::vector<std::string> skipped;
  const CorpusTokenizeResult r = run(t, o, &skipped);
  // The cut gzip: its lines before the cut are documents, then one error for the rest.
  ASSERT_EQ(skipped.size(), c.errors.size() + 1);
  for (std::size_t i = 0; i < c.errors.size(); ++i) {
    EXPECT_EQ(skipped[i].rfind(c.errors[i], 0), 0u) << skipped[i];
  }
  EXPECT_NE(skipped.back().find(dir.file("e.jsonl.gz") + ":"), std::string::npos);
  EXPECT_NE(skipped.back().find("truncated gzip stream"), std::string::npos) << skipped.back();
  EXPECT_EQ(r.skipped, static_cast<std::int64_t>(skipped.size()));
  const std::int64_t cut_documents = r.documents - static_cast<std::int64_t>(c.good.size());
  EXPECT_GT(cut_documents, 1000);
  EXPECT_LT(cut_documents, 3000);
  std::vector<std::string> good = c.good;
  for (std::int64_t i = 0; i < cut_documents; ++i) good.push_back("cut " + std::to_string(i));
  EXPECT_EQ(tokens_of(o.output_dir, "train", t.vocab_size()), expected_tokens(t, good, 262));
}

TEST(TokenizeCorpus, StopEndsAtTheFirstBadDocumentLeavingNoShard) {
  ScratchDir dir;
  const BadCorpus c = bad_corpus(dir);
  const HfTokenizer t = test_tokenizer();
  CorpusTokenizeOptions o;
  o.inputs = c.inputs;
  o.output_dir = dir.file("new/out");  // made by the run, removed again
  o.shard_tokens = 3;                  // shards complete before the error
  o.threads = 2;
  expect_input_error([&] { run(t, o); }, {c.errors[0], "--on-error skip"});
  EXPECT_FALSE(std::filesystem::exists(dir.file("new/out")));
  // A folder that was there stays, with its files, and gains nothing.
  std::filesystem::create_directories(dir.file("kept"));
  write_text(dir.file("kept/notes.txt"), "mine");
  o.output_dir = dir.file("kept");
  o.inputs = {dir.file("c.jsonl")};
  expect_input_error([&] { run(t, o); }, {c.errors[1]});
  EXPECT_EQ(files_in(dir.file("kept")), std::vector<std::string>{"notes.txt"});
}

TEST(TokenizeCorpus, ShardsAreTheSameBytesForEveryThreadCount) {
  ScratchDir dir;
  // Enough documents for many batches (1024 documents or 256 KiB each), of uneven lengths.
  std::string jsonl, txt;
  std::uint32_t state = 12345;
  const char* words[] = {"the", "thin",         "other", "on", "in",    "\xC3\xA9t\xC3\xA9",
                         "42",  "\xE6\x97\xA5", "  ",    "\n", "don't", "<|endoftext|>",
                         "!?"};
  for (int k = 0; k < 6000; ++k) {
    std::string doc;
    state = state * 1664525u + 1013904223u;
    const int n = 1 + static_cast<int>((state >> 8) % (k % 97 == 0 ? 3000 : 40));
    for (int w = 0; w < n; ++w) {
      state = state * 1664525u + 1013904223u;
      doc += std::string(w ? " " : "") + words[(state >> 12) % 13];
    }
    jsonl += "{\"text\": " + JsonWriter::quote(doc) + "}\n";
    if (k % 1000 == 0) txt += doc + "\n";
  }
  write_gzip(dir.file("c.jsonl.gz"), jsonl);
  write_text(dir.file("a.txt"), txt);
  const HfTokenizer t = test_tokenizer();
  std::vector<std::string> reference;
  for (int threads : {1, 2, 3, 8}) {
    CorpusTokenizeOptions o;
    o.inputs = {dir.file("a.txt"), dir.file("c.jsonl.gz")};
    o.output_dir = dir.file("out" + std::to_string(threads));
    o.name = "c";
    o.shard_tokens = 50000;
    o.val_fraction = 0.05;
    o.threads = threads;
    const CorpusTokenizeResult r = run(t, o);
    EXPECT_EQ(r.documents, 6001);
    EXPECT_EQ(r.threads, threads);
    std::vector<std::string> contents;
    for (const std::string& name : files_in(o.output_dir)) {
      contents.push_back(name + "\n" + file_bytes(join_path(o.output_dir, name)));
    }
    EXPECT_GE(contents.size(), 3u);  // val and several train shards
    if (reference.empty()) {
      reference = contents;
    } else {
      EXPECT_TRUE(contents == reference) << threads << " threads differ from 1";
    }
  }
}

}  // namespace
}  // namespace kiln::data
