// Chat data (docs/data.md, "Chat data"): loss masks beside llm.c shards read back as ignored
// targets exactly where the target token's mask is 0, every bad mask and a glob mixing masked and
// plain shards named; the shard writer's masks cut and renamed with their shards; the chat
// templates' renderings, piece by piece; conversations refused with file and line; the encoder's
// mask; and kiln tokenize --chat's shards and masks. The ids against the jinja templates and
// tokenizers themselves: chat_tokenize_check.py.

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "core/json_writer.h"
#include "data/chat_template.h"
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

constexpr std::int64_t kVocab = 50257;

std::vector<std::uint16_t> tokens_of_shard(int shard, std::int64_t count) {
  std::vector<std::uint16_t> tokens;
  for (std::int64_t i = 0; i < count; ++i) {
    tokens.push_back(static_cast<std::uint16_t>(1000 * shard + i));
  }
  return tokens;
}

// A mask that trains a run of tokens, then leaves a run out, by shard.
std::vector<std::uint8_t> mask_of_shard(int shard, std::int64_t count) {
  std::vector<std::uint8_t> mask;
  for (std::int64_t i = 0; i < count; ++i) mask.push_back((i + shard) % 5 < 2 ? 1 : 0);
  return mask;
}

void write_bytes(const std::string& path, const std::vector<std::uint8_t>& bytes) {
  write_file(path, bytes.data(), bytes.size());
}

// ---------------------------------------------------------------------------------------------
// The reader.

TEST(LlmcMask, TargetsOfUntrainedTokensAreIgnoredExactly) {
  ScratchDir dir;
  const std::vector<std::int64_t> counts = {25, 13};
  for (int s = 1; s <= 2; ++s) {
    const std::string shard = dir.file("chat_train_00000" + std::to_string(s) + ".bin");
    write_llmc_shard(shard, tokens_of_shard(s, counts[s - 1]));
    write_llmc_mask(llmc_mask_path(shard), mask_of_shard(s, counts[s - 1]));
  }
  EXPECT_EQ(llmc_mask_path(dir.file("chat_train_000001.bin")), dir.file("chat_train_000001.mask"));
  EXPECT_EQ(llmc_mask_path("x/shard"), "x/shard.mask");
  constexpr std::int64_t kT = 4;
  const LlmcShardDataset ds(dir.file("chat_train_*.bin"), kT, kVocab);
  ASSERT_TRUE(ds.masked());
  EXPECT_NE(ds.describe().find("loss masks"), std::string::npos) << ds.describe();
  ASSERT_EQ(ds.size(), 6 + 3);
  std::int64_t ignored = 0, kept = 0;
  for (std::int64_t i = 0; i < ds.size(); ++i) {
    std::int64_t input[kT], target[kT];
    ASSERT_TRUE(ds.get(i, SampleContext{}, input, target));
    const auto where = ds.position(i);
    const int s = static_cast<int>(where.shard) + 1;
    const std::vector<std::uint16_t> tokens = tokens_of_shard(s, counts[s - 1]);
    const std::vector<std::uint8_t> mask = mask_of_shard(s, counts[s - 1]);
    for (std::int64_t t = 0; t < kT; ++t) {
      const std::size_t at = static_cast<std::size_t>(where.window * kT + t);
      EXPECT_EQ(input[t], tokens[at]) << "window " << i << " position " << t;
      // The target is token at + 1; its own mask decides.
      const std::int64_t want = mask[at + 1] ? tokens[at + 1] : kIgnoreIndex;
      EXPECT_EQ(target[t], want) << "window " << i << " position " << t;
      (want == kIgnoreIndex ? ignored : kept) += 1;
    }
  }
  EXPECT_GT(ignored, 0);
  EXPECT_GT(kept, 0);
}

TEST(LlmcMask, ShardsWithoutMasksPredictEveryToken) {
  ScratchDir dir;
  write_llmc_shard(dir.file("p_train_000001.bin"), tokens_of_shard(1, 30));
  const LlmcShardDataset ds(dir.file("p_train_*.bin"), 8, kVocab);
  EXPECT_FALSE(ds.masked());
  for (std::int64_t i = 0; i < ds.size(); ++i) {
    std::int64_t input[8], target[8];
    ASSERT_TRUE(ds.get(i, SampleContext{}, input, target));
    for (int t = 0; t < 8; ++t) EXPECT_EQ(target[t], 1000 + i * 8 + t + 1);
  }
}

// A mask's bytes with the header fields given.
std::vector<std::uint8_t> mask_bytes(const std::vector<std::uint8_t>& values,
                                     std::int32_t magic = kLlmcMaskMagic,
                                     std::int32_t version = kLlmcMaskVersion,
                                     std::int64_t claimed = -1) {
  return testing::llmc_layout_bytes(
      magic, version,
      static_cast<std::int32_t>(claimed < 0 ? static_cast<std::int64_t>(values.size()) : claimed),
      values.data(), values.size());
}

TEST(LlmcMaskErrors, EachBadMaskNamesTheFile) {
  ScratchDir dir;
  const std::string shard = dir.file("c_train_000001.bin");
  const std::string mask = llmc_mask_path(shard);
  write_llmc_shard(shard, tokens_of_shard(1, 25));
  const std::vector<std::uint8_t> good = mask_of_shard(1, 25);
  const auto opens = [&] { LlmcShardDataset(dir.file("c_train_*.bin"), 4, kVocab); };
  const auto refused = [&](const std::vector<std::uint8_t>& bytes,
                           const std::vector<std::string>& fragments) {
    write_bytes(mask, bytes);
    std::vector<std::string> all = fragments;
    all.push_back(mask + ":");
    expect_input_error(opens, all);
  };
  std::vector<std::uint8_t> short_mask(good.begin(), good.end() - 1);
  refused(mask_bytes(short_mask),
          {"the mask has 24 values but its token shard " + shard + " has 25 tokens"});
  std::vector<std::uint8_t> bad_value = good;
  bad_value[7] = 2;
  refused(mask_bytes(bad_value), {"mask value 7 is 2, not 0", "at byte 1031"});
  refused(mask_bytes(good, kLlmcShardMagic), {"wrong magic 20240520, not a Kiln loss mask"});
  refused(mask_bytes(good, kLlmcMaskMagic, 2), {"unsupported version 2 of a loss mask"});
  refused(mask_bytes(good, kLlmcMaskMagic, kLlmcMaskVersion, 30),
          {"truncated: the header claims 30"});
  refused(mask_bytes(good, kLlmcMaskMagic, kLlmcMaskVersion, 20),
          {"5 unexpected bytes after the last mask value"});
  refused(mask_bytes(good, kLlmcMaskMagic, kLlmcMaskVersion, 0),
          {"the header claims 0 mask values"});
  refused(std::vector<std::uint8_t>(100, 0), {"truncated header: 100 bytes, a Kiln loss mask"});
  // Read back in the middle of a run: a mask truncated after the dataset opened it.
  write_llmc_mask(mask, good);
  const LlmcShardDataset ds(dir.file("c_train_*.bin"), 4, kVocab);
  std::filesystem::resize_file(mask, kLlmcShardHeaderBytes + 3);
  std::int64_t input[4], target[4];
  expect_input_error([&] { ds.get(5, SampleContext{}, input, target); }, {mask, "the file ends"});
}

TEST(LlmcMaskErrors, AGlobMixingMaskedAndPlainShardsNamesOneOfEach) {
  ScratchDir dir;
  for (int s = 1; s <= 3; ++s) {
    write_llmc_shard(dir.file("m_train_00000" + std::to_string(s) + ".bin"),
                     tokens_of_shard(s, 20));
  }
  write_llmc_mask(dir.file("m_train_000002.mask"), mask_of_shard(2, 20));
  expect_input_error(
      [&] { LlmcShardDataset(dir.file("m_train_*.bin"), 4, kVocab); },
      {dir.file("m_train_*.bin"), dir.file("m_train_000002.bin") + " has a loss mask",
       "but " + dir.file("m_train_000001.bin") + " has none",
       dir.file("m_train_000001.mask") + " is missing", "all have masks"});
  // A glob that matches the masks themselves is told so.
  expect_input_error(
      [&] { LlmcShardDataset(dir.file("m_train_*"), 4, kVocab); },
      {dir.file("m_train_*") + " matches the loss mask " + dir.file("m_train_000002.mask"),
       "*.bin"});
  // So is a mask under a shard's name.
  write_llmc_mask(dir.file("n_train_000001.bin"), mask_of_shard(1, 20));
  expect_input_error(
      [&] { LlmcShardDataset(dir.file("n_train_*.bin"), 4, kVocab); },
      {dir.file("n_train_000001.bin"), "wrong magic 20261204", "it is a Kiln loss mask"});
}

// ---------------------------------------------------------------------------------------------
// The writer.

TEST(LlmcShardWriterMasks, CutWithTheirShardsAndNamedOnlyAtCommit) {
  ScratchDir dir;
  std::vector<std::uint32_t> tokens;
  std::vector<std::uint8_t> mask;
  for (std::uint32_t i = 0; i < 25; ++i) {
    tokens.push_back(100 + i);
    mask.push_back(i % 3 == 0 ? 1 : 0);
  }
  {
    LlmcShardWriter w(dir.path(), "c", "train", 1, 10, kVocab, true);
    EXPECT_TRUE(w.masks());
    w.write(tokens.data(), mask.data(), 12);
    w.write(tokens.data() + 12, mask.data() + 12, 13);
    EXPECT_TRUE(glob_paths(dir.file("*.bin")).empty());
    EXPECT_TRUE(glob_paths(dir.file("*.mask")).empty());
    EXPECT_EQ(glob_paths(dir.file("c_train_*.mask.tmp.*")).size(), 3u);
    const std::vector<std::string> shards = w.commit();
    ASSERT_EQ(shards.size(), 3u);
    std::size_t at = 0;
    for (const std::string& path : shards) {
      const LlmcShard shard(path, kVocab);
      const LlmcMaskShard m(llmc_mask_path(path), shard);
      std::vector<std::uint8_t> got(static_cast<std::size_t>(m.count()));
      m.read_mask(0, m.count(), got.data());
      EXPECT_EQ(got, std::vector<std::uint8_t>(
                         mask.begin() + static_cast<std::ptrdiff_t>(at),
                         mask.begin() + static_cast<std::ptrdiff_t>(at) + m.count()));
      EXPECT_EQ(shard.token(0), 100 + static_cast<std::int64_t>(at));
      at += static_cast<std::size_t>(m.count());
    }
    EXPECT_EQ(at, 25u);
    EXPECT_TRUE(glob_paths(dir.file("*.tmp.*")).empty());
  }
  {
    // Never committed: shards and masks removed.
    LlmcShardWriter w(dir.path(), "d", "train", 1, 10, kVocab, true);
    w.write(tokens.data(), mask.data(), 25);
  }
  EXPECT_TRUE(glob_paths(dir.file("d_*")).empty());
}

// ---------------------------------------------------------------------------------------------
// The templates.

// The pieces as the jinja template writes them: special tokens spelled out; and the trained part.
std::string spelled(const ChatTemplate& t, const std::vector<ChatPiece>& pieces,
                    bool trained_only = false) {
  const std::vector<std::string> specials = t.special_tokens();
  std::string text;
  for (const ChatPiece& p : pieces) {
    if (trained_only && !p.trained) continue;
    text += p.special >= 0 ? specials[static_cast<std::size_t>(p.special)] : p.text;
  }
  return text;
}

ChatMessage msg(ChatRole role, const std::string& content) {
  return ChatMessage{role, content};
}

TEST(ChatTemplate, ChatMlIsQwen25sWithItsDefaultSystemMessage) {
  const ChatMlTemplate t;
  std::vector<ChatPiece> pieces;
  t.render({msg(ChatRole::kUser, "Hi"), msg(ChatRole::kAssistant, "Yo")}, &pieces);
  EXPECT_EQ(spelled(t, pieces),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
            "assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
            "Yo<|im_end|>\n");
  EXPECT_EQ(spelled(t, pieces, true), "Yo<|im_end|>");
  t.render({msg(ChatRole::kSystem, " Be brief. "), msg(ChatRole::kUser, ""),
            msg(ChatRole::kAssistant, " a\n"), msg(ChatRole::kSystem, "later"),
            msg(ChatRole::kAssistant, "b")},
           &pieces);
  EXPECT_EQ(spelled(t, pieces),
            "<|im_start|>system\n Be brief. <|im_end|>\n<|im_start|>user\n<|im_end|>\n"
            "<|im_start|>assistant\n a\n<|im_end|>\n<|im_start|>system\nlater<|im_end|>\n"
            "<|im_start|>assistant\nb<|im_end|>\n");
  EXPECT_EQ(spelled(t, pieces, true), " a\n<|im_end|>b<|im_end|>");
}

// What every Llama 3.1 conversation begins with, up to the system message's content.
const std::string kLlama3System =
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: "
    "December 2023\nToday Date: 26 Jul 2024\n\n";

TEST(ChatTemplate, Llama3IsLlama31sWithDatesAndTrimmedContent) {
  const Llama3Template t;
  std::vector<ChatPiece> pieces;
  t.render({msg(ChatRole::kSystem, " Be brief.\n"), msg(ChatRole::kUser, "Hi"),
            msg(ChatRole::kAssistant, "\xC2\xA0Yo\n\x1C")},
           &pieces);
  EXPECT_EQ(spelled(t, pieces),
            kLlama3System +
                "Be brief.<|eot_id|>"
                "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\nYo<|eot_id|>");
  EXPECT_EQ(spelled(t, pieces, true), "Yo<|eot_id|>");
  t.render({msg(ChatRole::kUser, "Hi"), msg(ChatRole::kAssistant, "")}, &pieces);
  EXPECT_EQ(spelled(t, pieces), kLlama3System +
                                    "<|eot_id|>"
                                    "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                                    "<|start_header_id|>assistant<|end_header_id|>\n\n<|eot_id|>");
  EXPECT_EQ(spelled(t, pieces, true), "<|eot_id|>");
}

TEST(ChatTemplate, PythonStripIsJinjasTrim) {
  EXPECT_EQ(python_strip("  a b \n"), "a b");
  EXPECT_EQ(python_strip("\xC2\xA0x\xE3\x80\x80"), "x");      // U+00A0, U+3000
  EXPECT_EQ(python_strip("\x1Cx\x1F\xE2\x80\xA8"), "x");      // U+001C, U+001F, U+2028
  EXPECT_EQ(python_strip("\xE2\x80\x8Bx"), "\xE2\x80\x8Bx");  // U+200B is not whitespace
  EXPECT_EQ(python_strip(" \t\r\n\x0B\x0C"), "");
  EXPECT_EQ(python_strip(""), "");
}

HfTokenizer chat_tokenizer(const std::vector<std::string>& specials) {
  // "\n\n" is one token, so that a reply starting with a newline joins the header's.
  return HfTokenizer::from_json(
      testing::byte_level_tokenizer_json({{"\xC4\x8A", "\xC4\x8A"}, {"o", "k"}}, specials),
      "chat.json");
}

const std::vector<std::string> kChatMlTokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
const std::vector<std::string> kLlama3Tokens = {"<|begin_of_text|>", "<|start_header_id|>",
                                                "<|end_header_id|>", "<|eot_id|>"};

TEST(ChatTemplate, PickedByNameOrByTheTokenizersTokens) {
  EXPECT_EQ(make_chat_template("", chat_tokenizer(kChatMlTokens))->name(), "chatml");
  EXPECT_EQ(make_chat_template("", chat_tokenizer(kLlama3Tokens))->name(), "llama3");
  EXPECT_EQ(make_chat_template("llama3", chat_tokenizer(kChatMlTokens))->name(), "llama3");
  expect_input_error(
      [] { make_chat_template("", chat_tokenizer({"<|endoftext|>"})); },
      {"chat.json: the tokenizer has neither <|im_start|>", "pass --chat-template chatml|llama3"});
  expect_input_error([] { make_chat_template("zephyr", chat_tokenizer(kChatMlTokens)); },
                     {"--chat-template 'zephyr': unknown", "chatml", "llama3"});
  const HfTokenizer chatml = chat_tokenizer(kChatMlTokens);
  const Llama3Template llama3;
  expect_input_error([&] { ChatEncoder(chatml, llama3); },
                     {"chat.json: the tokenizer has no <|begin_of_text|>", "llama3"});
}

TEST(ChatTemplate, BadConversationsNameWhereAndWhat) {
  const auto refused = [](const std::string& line, const std::vector<std::string>& fragments) {
    const JsonValue object = parse_json(line, [](std::size_t, const std::string& what) {
      throw InputError("bad test JSON: " + what);
    });
    std::vector<std::string> all = fragments;
    all.push_back("f.jsonl:7");
    expect_input_error([&] { parse_conversation(object, "f.jsonl:7", "messages"); }, all);
  };
  refused(R"({"text": "x"})", {"no field 'messages' (the object has text"});
  refused(R"({"messages": {}})", {"field 'messages' is an object, not an array of messages"});
  refused(R"({"messages": []})", {"field 'messages' holds no message"});
  refused(R"({"messages": ["hi"]})", {"messages[0] is a string, not an object"});
  refused(R"({"messages": [{"content": "x"}]})", {"messages[0] has no \"role\""});
  refused(R"({"messages": [{"role": "user"}]})", {"messages[0] has no \"content\""});
  refused(R"({"messages": [{"role": 1, "content": "x"}]})", {"messages[0].role is a number"});
  refused(R"({"messages": [{"role": "user", "content": null}]})",
          {"messages[0].content is null, not a string"});
  refused(R"({"messages": [{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}]})",
          {"messages[1].role 'tool': unknown", "system, user and assistant"});
  refused(R"({"messages": [{"role": "assistant", "content": "", "tool_calls": []}]})",
          {"messages[0] has tool_calls"});
  refused(R"({"messages": [{"role": "system", "content": "a"}, {"role": "user", "content": "b"}]})",
          {"no assistant message"});
  const JsonValue good =
      parse_json(R"({"messages": [{"role": "user", "content": "a", "name": "x"},)"
                 R"( {"role": "assistant", "content": "b"}]})",
                 [](std::size_t, const std::string& what) { throw InputError(what); });
  const std::vector<ChatMessage> messages = parse_conversation(good, "f:1", "messages");
  ASSERT_EQ(messages.size(), 2u);
  EXPECT_EQ(messages[1].role, ChatRole::kAssistant);
  EXPECT_EQ(messages[1].content, "b");
}

TEST(ChatEncoder, TrainsTheRepliesTheirEndTokensAndATokenJoiningHeaderAndReply) {
  const HfTokenizer tokenizer = chat_tokenizer(kChatMlTokens);
  const ChatMlTemplate chatml;
  const ChatEncoder encoder(tokenizer, chatml);
  // "assistant\n" + "\n\nok": GPT-2's pattern makes "\n\n" of the header's newline and the
  // reply's first one; it holds a byte of the reply, so it is trained.
  const std::vector<ChatMessage> conversation = {msg(ChatRole::kUser, "a<|im_end|>b"),
                                                 msg(ChatRole::kAssistant, "\n\nok")};
  std::vector<std::int64_t> ids;
  std::vector<std::uint8_t> mask;
  encoder.encode(conversation, nullptr, &ids, &mask);
  ASSERT_EQ(ids.size(), mask.size());
  // The ids are the rendering's, with the template's special tokens matched and the user's
  // "<|im_end|>" text.
  std::vector<ChatPiece> pieces;
  chatml.render(conversation, &pieces);
  const std::string text = spelled(chatml, pieces);
  const std::int64_t im_end = tokenizer.token_to_id("<|im_end|>");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), im_end), 3);  // system, user, assistant
  EXPECT_EQ(tokenizer.decode(ids), text);
  // Trained: one run at the end, the "\n\n" token, "\n", "ok", <|im_end|>; then the last "\n".
  const auto first = std::find(mask.begin(), mask.end(), 1) - mask.begin();
  const std::vector<std::int64_t> trained(ids.begin() + first, ids.end() - 1);
  EXPECT_EQ(tokenizer.decode(trained), "\n\n\nok<|im_end|>");
  EXPECT_EQ(*tokenizer.id_to_token(trained[0]), "\xC4\x8A\xC4\x8A");
  EXPECT_EQ(std::count(mask.begin(), mask.end(), 1), static_cast<std::ptrdiff_t>(trained.size()));
  EXPECT_EQ(mask.back(), 0);
}

// ---------------------------------------------------------------------------------------------
// kiln tokenize --chat.

std::string chat_line(const std::vector<std::pair<std::string, std::string>>& messages) {
  std::string line = "{\"messages\": [";
  for (std::size_t i = 0; i < messages.size(); ++i) {
    line += std::string(i ? ", " : "") + "{\"role\": \"" + messages[i].first +
            "\", \"content\": " + JsonWriter::quote(messages[i].second) + "}";
  }
  return line + "]}\n";
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

CorpusTokenizeResult run_chat(const HfTokenizer& t, CorpusTokenizeOptions o,
                              std::vector<std::string>* skipped = nullptr) {
  o.chat = true;
  return tokenize_corpus(t, o, {}, [&](const std::string& message) {
    if (skipped != nullptr) skipped->push_back(message);
  });
}

TEST(TokenizeCorpusChat, ShardsAndMasksOneSeparatorPerConversation) {
  ScratchDir dir;
  const std::string a = chat_line({{"user", "hi"}, {"assistant", "ok"}});
  const std::string b = chat_line({{"system", "s"}, {"user", "x"}, {"assistant", "ok ok"}});
  write_text(dir.file("c.jsonl"), a + b + a);
  for (const bool llama : {false, true}) {
    const HfTokenizer t = chat_tokenizer(llama ? kLlama3Tokens : kChatMlTokens);
    const std::unique_ptr<ChatTemplate> tmpl = make_chat_template("", t);
    const ChatEncoder encoder(t, *tmpl);
    CorpusTokenizeOptions o;
    o.inputs = {dir.file("c.jsonl")};
    o.output_dir = dir.file(llama ? "llama" : "chatml");
    o.shard_tokens = 16;
    o.val_fraction = 0;
    const CorpusTokenizeResult r = run_chat(t, o);
    EXPECT_EQ(r.chat_template, llama ? "llama3" : "chatml");
    // The expected stream: each conversation after the separator, unless it begins with it.
    const std::int64_t sep = r.separator_id;
    std::vector<std::int64_t> want_ids;
    std::vector<std::uint8_t> want_mask;
    for (const auto& conv :
         {std::vector<ChatMessage>{msg(ChatRole::kUser, "hi"), msg(ChatRole::kAssistant, "ok")},
          std::vector<ChatMessage>{msg(ChatRole::kSystem, "s"), msg(ChatRole::kUser, "x"),
                                   msg(ChatRole::kAssistant, "ok ok")},
          std::vector<ChatMessage>{msg(ChatRole::kUser, "hi"), msg(ChatRole::kAssistant, "ok")}}) {
      std::vector<std::int64_t> ids;
      std::vector<std::uint8_t> mask;
      encoder.encode(conv, nullptr, &ids, &mask);
      EXPECT_EQ(ids[0] == sep, llama);  // Llama 3's template begins with <|begin_of_text|>
      if (ids[0] != sep) {
        want_ids.push_back(sep);
        want_mask.push_back(0);
      }
      want_ids.insert(want_ids.end(), ids.begin(), ids.end());
      want_mask.insert(want_mask.end(), mask.begin(), mask.end());
    }
    std::vector<std::int64_t> got_ids;
    std::vector<std::uint8_t> got_mask;
    for (const std::string& path : r.train_shards) {
      const LlmcShard shard(path, t.vocab_size());
      const LlmcMaskShard mask(llmc_mask_path(path), shard);
      std::vector<std::int64_t> ids(static_cast<std::size_t>(shard.token_count()));
      std::vector<std::uint8_t> values(ids.size());
      shard.read_tokens(0, shard.token_count(), ids.data());
      mask.read_mask(0, mask.count(), values.data());
      got_ids.insert(got_ids.end(), ids.begin(), ids.end());
      got_mask.insert(got_mask.end(), values.begin(), values.end());
    }
    EXPECT_EQ(got_ids, want_ids);
    EXPECT_EQ(got_mask, want_mask);
    EXPECT_EQ(r.tokens, static_cast<std::int64_t>(want_ids.size()));
    EXPECT_EQ(r.trained, std::count(want_mask.begin(), want_mask.end(), 1));
    EXPECT_GT(r.train_shards.size(), 1u);
    // The dataset reads them back masked; a second run into the folder is refused, also when only
    // masks remain there (they would attach themselves to the new shards).
    EXPECT_TRUE(LlmcShardDataset(r.train_shards[0], 4, t.vocab_size()).masked());
    for (const std::string& path : r.train_shards) std::filesystem::remove(path);
    expect_input_error([&] { run_chat(t, o); }, {"already holds", "mask(s) named", ".mask"});
  }
}

TEST(TokenizeCorpusChat, BadLinesStopOrAreSkippedAndOptionsAreChecked) {
  ScratchDir dir;
  const std::string good = chat_line({{"user", "hi"}, {"assistant", "ok"}});
  write_text(dir.file("c.jsonl"), good +
                                      "{\"messages\": [{\"role\": \"user\", \"content\": "
                                      "\"no reply\"}]}\nnot json\n" +
                                      good);
  const HfTokenizer t = chat_tokenizer(kChatMlTokens);
  CorpusTokenizeOptions o;
  o.inputs = {dir.file("c.jsonl")};
  o.output_dir = dir.file("out");
  expect_input_error([&] { run_chat(t, o); },
                     {dir.file("c.jsonl") + ":2: the conversation has no assistant message"});
  EXPECT_FALSE(std::filesystem::exists(o.output_dir));
  o.on_error = OnDocumentError::kSkip;
  std::vector<std::string> skipped;
  const CorpusTokenizeResult r = run_chat(t, o, &skipped);
  EXPECT_EQ(r.documents, 2);
  EXPECT_EQ(r.skipped, 2);
  ASSERT_EQ(skipped.size(), 2u);
  EXPECT_NE(skipped[1].find(dir.file("c.jsonl") + ":3: not a JSON line"), std::string::npos);
  // Conversations come from .jsonl only; a template needs --chat.
  write_text(dir.file("a.txt"), "text");
  o.inputs = {dir.file("a.txt")};
  o.output_dir = dir.file("out2");
  expect_input_error([&] { run_chat(t, o); }, {dir.file("a.txt"), "--chat reads conversations"});
  o.inputs = {dir.file("c.jsonl")};
  o.chat_template = "chatml";
  expect_input_error([&] { tokenize_corpus(t, o, {}, {}); }, {"--chat-template chatml", "--chat"});
}

}  // namespace
}  // namespace kiln::data
