#include "data/hf_tokenizer.h"

#include <algorithm>
#include <array>
#include <map>

#include "core/check.h"
#include "core/file_kind.h"
#include "core/json_value.h"
#include "data/unicode_text.h"

namespace kiln::data {

// Added tokens (by their index in added_) by their bytes: the longest that starts at a position
// (tokenizers' Aho-Corasick automaton with MatchKind::LeftmostLongest, walked one start position
// at a time).
class HfTokenizer::AddedTokenTrie {
 public:
  void add(const std::string& pattern, std::size_t token) {
    if (!pattern.empty()) first_bytes_[static_cast<unsigned char>(pattern[0])] = true;
    std::size_t node = 0;
    for (unsigned char b : pattern) {
      auto [it, fresh] = nodes_[node].next.emplace(b, nodes_.size());
      if (fresh) nodes_.emplace_back();
      node = it->second;
    }
    nodes_[node].token = static_cast<std::ptrdiff_t>(token);
  }
  // The longest pattern at text[pos]: its token (-1 for none) and its length.
  std::ptrdiff_t longest_at(std::string_view text, std::size_t pos, std::size_t* length) const {
    std::ptrdiff_t found = -1;
    if (!first_bytes_[static_cast<unsigned char>(text[pos])]) return found;
    for (std::size_t node = 0, i = pos; i < text.size(); ++i) {
      auto it = nodes_[node].next.find(static_cast<unsigned char>(text[i]));
      if (it == nodes_[node].next.end()) break;
      node = it->second;
      if (nodes_[node].token >= 0) {
        found = nodes_[node].token;
        *length = i + 1 - pos;
      }
    }
    return found;
  }

 private:
  struct Node {
    std::map<unsigned char, std::size_t> next;
    std::ptrdiff_t token = -1;
  };
  std::vector<Node> nodes_{1};
  std::array<bool, 256> first_bytes_{};  // the bytes a pattern starts with: most text skips fast
};

namespace {

const char* const kEndOfTextTokens[] = {"<|endoftext|>", "<|end_of_text|>", "<|eot_id|>",
                                        "<|im_end|>"};

// The fields of a tokenizer.json, each read with its path for messages:
// "<file>: pre_tokenizer.pretokenizers[0].pattern.Regex (line 40, column 18): <what>".
class TokenizerJson {
 public:
  TokenizerJson(const std::string& text, const std::string& source)
      : text_(text), source_(source), root_(parse_json(text, json_failure_in_file(text, source))) {}

  const JsonValue& root() const { return root_; }
  const std::string& source() const { return source_; }

  [[noreturn]] void fail(const JsonValue& at, const std::string& path,
                         const std::string& what) const {
    throw InputError(source_ + ": " + path + " (" + json_line_column(text_, at.offset) +
                     "): " + what);
  }
  void expect(const JsonValue& v, JsonValue::Kind kind, const std::string& path) const {
    if (v.kind != kind) {
      fail(v, path,
           std::string("expected ") + json_kind_name(kind) + ", found " + json_kind_name(v.kind));
    }
  }
  // A member that may be missing or null: nullptr then.
  const JsonValue* optional(const JsonValue& object, const std::string& name) const {
    const JsonValue* v = object.find(name);
    return v == nullptr || v->kind == JsonValue::Kind::Null ? nullptr : v;
  }
  const JsonValue& required(const JsonValue& object, const std::string& path,
                            const std::string& name) const {
    const JsonValue* v = optional(object, name);
    if (v == nullptr) fail(object, path, "has no '" + name + "' (or it is null)");
    return *v;
  }
  std::string string(const JsonValue& object, const std::string& path,
                     const std::string& name) const {
    const JsonValue& v = required(object, path, name);
    expect(v, JsonValue::Kind::String, path + "." + name);
    return v.string;
  }
  bool flag(const JsonValue& object, const std::string& path, const std::string& name,
            bool fallback) const {
    const JsonValue* v = optional(object, name);
    if (v == nullptr) return fallback;
    expect(*v, JsonValue::Kind::Bool, path + "." + name);
    return v->boolean;
  }
  static bool is_id(const JsonValue& v) {
    return v.is_integer && v.integer >= 0 && v.integer <= 0xFFFFFFFFll;
  }
  [[noreturn]] void fail_id(const JsonValue& v, const std::string& path) const {
    fail(v, path, "expected a token id (an integer from 0 to 4294967295)");
  }
  std::int64_t id(const JsonValue& v, const std::string& path) const {
    if (!is_id(v)) fail_id(v, path);
    return v.integer;
  }
  // An object's "type", which must be one of `known` (named in the message).
  std::string type(const JsonValue& v, const std::string& path,
                   const std::vector<std::string>& known) const {
    expect(v, JsonValue::Kind::Object, path);
    const std::string t = string(v, path, "type");
    if (std::find(known.begin(), known.end(), t) == known.end()) {
      std::string list;
      for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
      fail(v, path, "type '" + t + "' is not supported (Kiln reads " + list + ")");
    }
    return t;
  }
  // A Sequence's members, or the one value itself.
  std::vector<std::pair<const JsonValue*, std::string>> steps(const JsonValue& v,
                                                              const std::string& path,
                                                              const std::string& list) const {
    std::vector<std::pair<const JsonValue*, std::string>> out;
    if (v.kind == JsonValue::Kind::Object && v.find("type") != nullptr &&
        v.find("type")->kind == JsonValue::Kind::String && v.find("type")->string == "Sequence") {
      const JsonValue& items = required(v, path, list);
      expect(items, JsonValue::Kind::Array, path + "." + list);
      for (std::size_t i = 0; i < items.items.size(); ++i) {
        out.emplace_back(&items.items[i], path + "." + list + "[" + std::to_string(i) + "]");
      }
    } else {
      out.emplace_back(&v, path);
    }
    return out;
  }

 private:
  const std::string& text_;
  const std::string& source_;
  JsonValue root_;
};

std::unique_ptr<ByteLevelBpe> read_model(const TokenizerJson& j, const JsonValue& model) {
  const std::string path = "model";
  j.type(model, path, {"BPE"});
  const JsonValue* dropout = j.optional(model, "dropout");
  if (dropout != nullptr && !(dropout->kind == JsonValue::Kind::Number && dropout->number == 0)) {
    j.fail(*dropout, path + ".dropout", "BPE dropout samples merges at random; Kiln reads null");
  }
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const JsonValue* v = j.optional(model, affix);
    if (v != nullptr && !(v->kind == JsonValue::Kind::String && v->string.empty())) {
      j.fail(*v, path + "." + affix, "byte-level BPE has none; Kiln reads null or \"\"");
    }
  }
  if (j.flag(model, path, "byte_fallback", false)) {
    j.fail(*model.find("byte_fallback"), path + ".byte_fallback",
           "byte fallback (<0xNN> tokens, SentencePiece's BPE) is not supported: Kiln reads "
           "byte-level BPE, whose vocabulary has every byte");
  }
  BpeOptions options;
  options.ignore_merges = j.flag(model, path, "ignore_merges", false);
  options.fuse_unk = j.flag(model, path, "fuse_unk", false);
  if (const JsonValue* unk = j.optional(model, "unk_token")) {
    j.expect(*unk, JsonValue::Kind::String, path + ".unk_token");
    options.unk_token = unk->string;
  }
  const JsonValue& vocab = j.required(model, path, "vocab");
  j.expect(vocab, JsonValue::Kind::Object, path + ".vocab");
  std::vector<std::pair<std::string, std::int64_t>> tokens;
  tokens.reserve(vocab.items.size());
  for (std::size_t i = 0; i < vocab.items.size(); ++i) {
    // (The paths of messages are made only for a message: a vocabulary has 10^5 entries.)
    if (!TokenizerJson::is_id(vocab.items[i])) {
      j.fail_id(vocab.items[i], path + ".vocab." + vocab.names[i]);
    }
    tokens.emplace_back(vocab.names[i], vocab.items[i].integer);
  }
  const JsonValue& merge_list = j.required(model, path, "merges");
  j.expect(merge_list, JsonValue::Kind::Array, path + ".merges");
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(merge_list.items.size());
  for (std::size_t i = 0; i < merge_list.items.size(); ++i) {
    const JsonValue& m = merge_list.items[i];
    const std::size_t space = m.string.find(' ');
    if (m.kind == JsonValue::Kind::Array && m.items.size() == 2 &&
        m.items[0].kind == JsonValue::Kind::String && m.items[1].kind == JsonValue::Kind::String) {
      merges.emplace_back(m.items[0].string, m.items[1].string);
    } else if (m.kind == JsonValue::Kind::String && m.string.rfind("#version", 0) == 0) {
      continue;  // as tokenizers reads merges.txt's first line
    } else if (m.kind == JsonValue::Kind::String && space != std::string::npos &&
               m.string.find(' ', space + 1) == std::string::npos) {
      merges.emplace_back(m.string.substr(0, space), m.string.substr(space + 1));
    } else {
      j.fail(m, path + ".merges[" + std::to_string(i) + "]",
             "expected a merge: \"a b\" or [\"a\", \"b\"]");
    }
  }
  return std::make_unique<ByteLevelBpe>(tokens, merges, options, j.source());
}

bool read_normalizer(const TokenizerJson& j, const JsonValue* normalizer) {
  if (normalizer == nullptr) return false;
  bool nfc = false;
  for (const auto& [step, path] : j.steps(*normalizer, "normalizer", "normalizers")) {
    if (j.type(*step, path, {"NFC", "Sequence"}) == "Sequence") {
      j.fail(*step, path, "a Sequence in a Sequence");
    }
    nfc = true;
  }
  return nfc;
}

std::vector<HfTokenizer::PreTokenizerStep> read_pre_tokenizer(const TokenizerJson& j,
                                                              const JsonValue* pre) {
  if (pre == nullptr) {
    j.fail(j.root(), "pre_tokenizer",
           "is null: Kiln reads byte-level BPE, whose pre-tokenizer ends in ByteLevel");
  }
  std::vector<HfTokenizer::PreTokenizerStep> steps;
  const auto list = j.steps(*pre, "pre_tokenizer", "pretokenizers");
  for (std::size_t k = 0; k < list.size(); ++k) {
    const JsonValue& step = *list[k].first;
    const std::string& path = list[k].second;
    const std::string type = j.type(step, path, {"ByteLevel", "Split"});
    HfTokenizer::PreTokenizerStep s{type == "ByteLevel", SplitPattern::Gpt2, false, false};
    if (s.byte_level) {
      if (k + 1 != list.size()) {
        j.fail(step, path,
               "ByteLevel must be the last pre-tokenizer step (Kiln reads Split steps "
               "followed by ByteLevel)");
      }
      s.use_regex = j.flag(step, path, "use_regex", true);
      s.add_prefix_space = j.flag(step, path, "add_prefix_space", true);
    } else {
      const JsonValue& pattern = j.required(step, path, "pattern");
      j.expect(pattern, JsonValue::Kind::Object, path + ".pattern");
      const JsonValue* regex = j.optional(pattern, "Regex");
      if (regex == nullptr || regex->kind != JsonValue::Kind::String) {
        j.fail(pattern, path + ".pattern",
               "Kiln reads a {\"Regex\": ...} pattern (GPT-2's, Llama 3's or Qwen2's)");
      }
      if (!find_split_pattern(regex->string, &s.pattern)) {
        j.fail(*regex, path + ".pattern.Regex",
               "the pattern '" + regex->string +
                   "' is not one Kiln has: it reads GPT-2's, Llama 3's and Qwen2's exactly, "
                   "hand-written over code points (data/pretokenize.h)");
      }
      if (j.string(step, path, "behavior") != "Isolated") {
        j.fail(*step.find("behavior"), path + ".behavior", "Kiln reads \"Isolated\" only");
      }
      if (j.flag(step, path, "invert", false)) {
        j.fail(*step.find("invert"), path + ".invert", "Kiln reads false only");
      }
    }
    steps.push_back(s);
  }
  if (steps.empty() || !steps.back().byte_level) {
    j.fail(*pre, "pre_tokenizer",
           "has no ByteLevel step: Kiln reads byte-level BPE (Split steps, then ByteLevel)");
  }
  return steps;
}

std::vector<HfTokenizer::TemplatePiece> read_template(const TokenizerJson& j, const JsonValue& t,
                                                      const std::string& path) {
  const JsonValue& single = j.required(t, path, "single");
  j.expect(single, JsonValue::Kind::Array, path + ".single");
  const JsonValue* specials = j.optional(t, "special_tokens");
  std::vector<HfTokenizer::TemplatePiece> pieces;
  for (std::size_t i = 0; i < single.items.size(); ++i) {
    const JsonValue& piece = single.items[i];
    const std::string at = path + ".single[" + std::to_string(i) + "]";
    j.expect(piece, JsonValue::Kind::Object, at);
    if (const JsonValue* seq = piece.find("Sequence")) {
      j.expect(*seq, JsonValue::Kind::Object, at + ".Sequence");
      if (j.string(*seq, at + ".Sequence", "id") != "A") {
        j.fail(*seq, at + ".Sequence", "a single sequence's template names sequence A only");
      }
      pieces.push_back({true, {}});
      continue;
    }
    const JsonValue* special = piece.find("SpecialToken");
    if (special == nullptr) {
      j.fail(piece, at, "expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
    }
    j.expect(*special, JsonValue::Kind::Object, at + ".SpecialToken");
    const std::string name = j.string(*special, at + ".SpecialToken", "id");
    const JsonValue* entry = specials != nullptr ? specials->find(name) : nullptr;
    if (entry == nullptr) {
      j.fail(*special, at + ".SpecialToken",
             "'" + name + "' is not in " + path + ".special_tokens");
    }
    const std::string entry_path = path + ".special_tokens." + name;
    j.expect(*entry, JsonValue::Kind::Object, entry_path);
    const JsonValue& ids = j.required(*entry, entry_path, "ids");
    j.expect(ids, JsonValue::Kind::Array, entry_path + ".ids");
    HfTokenizer::TemplatePiece p{false, {}};
    for (const JsonValue& id : ids.items) p.ids.push_back(j.id(id, entry_path + ".ids"));
    pieces.push_back(std::move(p));
  }
  return pieces;
}

// RobertaProcessing's "cls" or "sep": ["<s>", 0].
HfTokenizer::TemplatePiece special_token_piece(const TokenizerJson& j, const JsonValue& roberta,
                                               const std::string& path, const std::string& name) {
  const JsonValue& token = j.required(roberta, path, name);
  if (token.kind != JsonValue::Kind::Array || token.items.size() != 2 ||
      token.items[0].kind != JsonValue::Kind::String) {
    j.fail(token, path + "." + name, "expected [\"token\", id]");
  }
  return {false, {j.id(token.items[1], path + "." + name + "[1]")}};
}

std::vector<std::vector<HfTokenizer::TemplatePiece>> read_post_processor(const TokenizerJson& j,
                                                                         const JsonValue* post) {
  std::vector<std::vector<HfTokenizer::TemplatePiece>> templates;
  if (post == nullptr) return templates;
  for (const auto& [step, path] : j.steps(*post, "post_processor", "processors")) {
    // ByteLevel's post-processing moves offsets only.
    const std::string type =
        j.type(*step, path, {"ByteLevel", "TemplateProcessing", "RobertaProcessing", "Sequence"});
    if (type == "TemplateProcessing") {
      templates.push_back(read_template(j, *step, path));
    } else if (type == "RobertaProcessing") {
      templates.push_back({special_token_piece(j, *step, path, "cls"),
                           {true, {}},
                           special_token_piece(j, *step, path, "sep")});
    } else if (type == "Sequence") {
      j.fail(*step, path, "a Sequence in a Sequence");
    }
  }
  return templates;
}

}  // namespace

HfTokenizer HfTokenizer::load(const std::string& path) {
  return from_json(read_regular_file(path, "the tokenizer"), path);
}

HfTokenizer HfTokenizer::from_json(const std::string& text, const std::string& source) {
  const TokenizerJson j(text, source);
  const JsonValue& root = j.root();
  j.expect(root, JsonValue::Kind::Object, "the file");
  if (const JsonValue* version = j.optional(root, "version")) {
    if (version->kind != JsonValue::Kind::String || version->string != "1.0") {
      j.fail(*version, "version", "Kiln reads tokenizer.json version \"1.0\"");
    }
  }
  for (const char* unsupported : {"truncation", "padding"}) {
    if (const JsonValue* v = j.optional(root, unsupported)) {
      j.fail(*v, unsupported, "Kiln's tokenizer encodes one text whole; set it to null");
    }
  }
  HfTokenizer t;
  t.bpe_ = read_model(j, j.required(root, "the file", "model"));
  t.nfc_ = read_normalizer(j, j.optional(root, "normalizer"));
  t.pre_tokenizer_ = read_pre_tokenizer(j, j.optional(root, "pre_tokenizer"));
  j.type(j.required(root, "the file", "decoder"), "decoder", {"ByteLevel"});
  t.templates_ = read_post_processor(j, j.optional(root, "post_processor"));

  // Added tokens take the ids tokenizers gives them (AddedVocabulary::add_tokens): a content the
  // vocabulary has keeps its id there, a new one takes the next id past the vocabulary's count.
  // The file's ids must agree: one that does not is a file tokenizers would read otherwise.
  std::int64_t next_id = static_cast<std::int64_t>(t.bpe_->size());
  if (const JsonValue* added = j.optional(root, "added_tokens")) {
    j.expect(*added, JsonValue::Kind::Array, "added_tokens");
    for (std::size_t i = 0; i < added->items.size(); ++i) {
      const JsonValue& a = added->items[i];
      const std::string path = "added_tokens[" + std::to_string(i) + "]";
      j.expect(a, JsonValue::Kind::Object, path);
      AddedToken token{j.id(j.required(a, path, "id"), path + ".id"),
                       j.string(a, path, "content"),
                       "",
                       j.flag(a, path, "special", false),
                       false,
                       j.flag(a, path, "lstrip", false),
                       j.flag(a, path, "rstrip", false)};
      token.normalized = j.flag(a, path, "normalized", !token.special);
      token.pattern = token.normalized && t.nfc_ ? nfc(token.content) : token.content;
      if (j.flag(a, path, "single_word", false)) {
        j.fail(a, path,
               "single_word is not supported (Kiln reads added tokens that match anywhere)");
      }
      if (token.content.empty()) continue;  // tokenizers ignores it
      if (t.added_ids_.count(token.content) != 0) {
        j.fail(a, path, "'" + token.content + "' is added twice");
      }
      std::int64_t expected = t.bpe_->id(token.content);
      if (expected < 0) expected = next_id++;
      if (token.id != expected) {
        j.fail(a, path,
               "'" + token.content + "' has id " + std::to_string(token.id) +
                   " here, but tokenizers gives it id " + std::to_string(expected) +
                   (t.bpe_->id(token.content) >= 0
                        ? " (its id in model.vocab)"
                        : " (added tokens outside model.vocab are numbered from its size on)"));
      }
      t.added_ids_[token.content] = token.id;
      if (token.special) t.special_contents_.insert(token.content);
      t.added_.push_back(std::move(token));
    }
  }
  auto raw = std::make_shared<AddedTokenTrie>(), normalized = std::make_shared<AddedTokenTrie>();
  for (std::size_t i = 0; i < t.added_.size(); ++i) {
    const AddedToken& a = t.added_[i];
    t.added_by_id_[a.id] = i;
    (a.normalized ? normalized : raw)->add(a.pattern, i);
  }
  t.raw_trie_ = raw;
  t.normalized_trie_ = normalized;
  return t;
}

std::vector<HfTokenizer::Split> HfTokenizer::split_added(std::string_view text, bool normalized,
                                                         bool split_special) const {
  const AddedTokenTrie& trie = normalized ? *normalized_trie_ : *raw_trie_;
  std::vector<Split> out;
  // tokenizers' AddedVocabulary::find_matches: lstrip and rstrip take in the white space
  // beside a match, never what an earlier match took.
  std::size_t done = 0;
  for (std::size_t pos = 0; pos < text.size();) {
    std::size_t length = 0;
    const std::ptrdiff_t found = trie.longest_at(text, pos, &length);
    if (found < 0) {
      ++pos;
      continue;
    }
    const AddedToken* token = &added_[static_cast<std::size_t>(found)];
    std::size_t start = pos, stop = pos + length;
    pos = stop;
    // tokenizers finds the match, then drops it: its bytes stay in the text around them.
    if (split_special && token->special) continue;
    if (token->lstrip) {
      const std::vector<TextChar> before = text_chars(text.substr(done, start - done));
      std::size_t k = before.size();
      while (k > 0 && is_space(before[k - 1].cp)) --k;
      start = done + (k < before.size() ? before[k].begin : start - done);
    }
    if (token->rstrip) {
      const std::vector<TextChar> after = text_chars(text.substr(stop));
      std::size_t k = 0;
      while (k < after.size() && is_space(after[k].cp)) ++k;
      stop += k > 0 ? after[k - 1].end : 0;
    }
    if (done < start) out.push_back({nullptr, text.substr(done, start - done)});
    out.push_back({token, text.substr(start, stop - start)});
    done = stop;
  }
  if (done < text.size()) out.push_back({nullptr, text.substr(done)});
  return out;
}

// Step `step` of the pre-tokenizer on `text`, then the later steps on each piece, then BPE.
void HfTokenizer::encode_pre_tokenized(std::string_view text, std::size_t step, EncodeCache* cache,
                                       std::vector<std::int64_t>* ids) const {
  if (text.empty()) return;
  if (step == pre_tokenizer_.size()) {
    bpe_->encode_piece(text, ids, cache != nullptr ? &cache->pieces : nullptr);
    return;
  }
  const PreTokenizerStep& s = pre_tokenizer_[step];
  std::string prefixed;
  if (s.byte_level && s.add_prefix_space && text[0] != ' ') {
    prefixed = " " + std::string(text);
    text = prefixed;
  }
  if (s.byte_level && !s.use_regex) {
    encode_pre_tokenized(text, step + 1, cache, ids);
    return;
  }
  EncodeCache& c = *cache;  // encode() always passes one
  if (c.ends.size() < pre_tokenizer_.size()) c.ends.resize(pre_tokenizer_.size());
  // This step's piece ends live in c.ends[step] while the later steps use their own.
  std::vector<std::size_t>& ends = c.ends[step];
  split_by_pattern(text, s.byte_level ? SplitPattern::Gpt2 : s.pattern, &c.chars, &ends);
  std::size_t begin = 0;
  for (std::size_t k = 0; k < ends.size(); ++k) {
    const std::size_t end = ends[k];
    encode_pre_tokenized(text.substr(begin, end - begin), step + 1, &c, ids);
    begin = end;
  }
}

std::vector<std::int64_t> HfTokenizer::encode(const std::string& text,
                                              bool add_special_tokens) const {
  std::vector<std::int64_t> ids;
  EncodeOptions options;
  options.add_special_tokens = add_special_tokens;
  encode(text, options, nullptr, &ids);
  return ids;
}

void HfTokenizer::encode(const std::string& text, const EncodeOptions& options, EncodeCache* cache,
                         std::vector<std::int64_t>* out) const {
  std::unique_ptr<EncodeCache> local;  // made only for a caller without a cache
  if (cache == nullptr) local = std::make_unique<EncodeCache>();
  EncodeCache* c = cache != nullptr ? cache : local.get();
  const bool templated = !templates_.empty();
  std::vector<std::int64_t> own;
  std::vector<std::int64_t>* ids = templated ? &own : out;
  for (const Split& outer : split_added(text, false, options.split_special_tokens)) {
    if (outer.token != nullptr) {
      ids->push_back(outer.token->id);
      continue;
    }
    std::string normalized;
    std::string_view text_normalized = outer.text;
    if (nfc_) {
      normalized = nfc(std::string(outer.text));
      text_normalized = normalized;
    }
    for (const Split& inner : split_added(text_normalized, true, options.split_special_tokens)) {
      if (inner.token != nullptr) {
        ids->push_back(inner.token->id);
      } else {
        encode_pre_tokenized(inner.text, 0, c, ids);
      }
    }
  }
  if (!templated) return;
  for (const std::vector<TemplatePiece>& pieces : templates_) {
    std::vector<std::int64_t> next;
    for (const TemplatePiece& p : pieces) {
      if (p.sequence) {
        next.insert(next.end(), own.begin(), own.end());
      } else if (options.add_special_tokens) {
        next.insert(next.end(), p.ids.begin(), p.ids.end());
      }
    }
    own = std::move(next);
  }
  out->insert(out->end(), own.begin(), own.end());
}

const std::string* HfTokenizer::id_to_token(std::int64_t id) const {
  auto it = added_by_id_.find(id);
  return it != added_by_id_.end() ? &added_[it->second].pattern : bpe_->token(id);
}

std::string HfTokenizer::decode(const std::vector<std::int64_t>& ids,
                                bool skip_special_tokens) const {
  std::string bytes;
  for (std::int64_t id : ids) {
    const std::string* token = id_to_token(id);
    if (token == nullptr) continue;
    if (skip_special_tokens && special_contents_.count(*token) != 0) continue;
    std::string token_bytes;
    bytes += byte_symbols_to_bytes(*token, &token_bytes) ? token_bytes : *token;
  }
  return replace_invalid_utf8(bytes);
}

std::int64_t HfTokenizer::token_to_id(const std::string& token) const {
  auto it = added_ids_.find(token);
  return it != added_ids_.end() ? it->second : bpe_->id(token);
}

std::int64_t HfTokenizer::vocab_size() const {
  std::int64_t largest = bpe_->largest_id();
  for (const AddedToken& a : added_) largest = std::max(largest, a.id);
  return largest + 1;
}

std::vector<std::int64_t> HfTokenizer::stop_token_ids() const {
  std::vector<std::int64_t> ids;
  for (const char* name : kEndOfTextTokens) {
    const std::int64_t id = token_to_id(name);
    if (id >= 0) ids.push_back(id);
  }
  return ids;
}

std::int64_t HfTokenizer::end_of_text_id() const {
  const std::vector<std::int64_t> ids = stop_token_ids();
  return ids.empty() ? -1 : ids.front();
}

}  // namespace kiln::data
