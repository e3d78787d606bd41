#include "data/gpt2_tokenizer.h"

#include <sstream>

#include "core/check.h"
#include "core/file_kind.h"
#include "core/json_value.h"
#include "data/unicode_text.h"

namespace kiln::data {
namespace {

const char* const kEndOfText = "<|endoftext|>";

std::string read_file(const std::string& path, const char* what) {
  return read_regular_file(path, std::string("the ") + what);
}

}  // namespace

std::vector<std::pair<std::string, std::int64_t>> parse_json_string_to_int(
    const std::string& text, const std::string& file) {
  const JsonValue root = parse_json(text, json_failure_in_file(text, file));
  const auto fail = [&](const JsonValue& at, const std::string& what) {
    throw InputError(file + ": bad JSON at " + json_line_column(text, at.offset) + ": " + what);
  };
  if (root.kind != JsonValue::Kind::Object) {
    fail(root, "expected '{' (vocab.json is one object of token -> id)");
  }
  std::vector<std::pair<std::string, std::int64_t>> out;
  out.reserve(root.items.size());
  for (std::size_t i = 0; i < root.items.size(); ++i) {
    const JsonValue& id = root.items[i];
    if (!id.is_integer) {
      fail(id, std::string("expected an integer id, not ") +
                   (id.kind == JsonValue::Kind::Number ? "a fraction" : json_kind_name(id.kind)));
    }
    out.emplace_back(root.names[i], id.integer);
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> parse_bpe_merges(const std::string& text,
                                                                  const std::string& file) {
  std::vector<std::pair<std::string, std::string>> merges;
  std::istringstream in(text);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (number == 1 && line.rfind("#version", 0) == 0)) continue;
    const std::size_t space = line.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string::npos) {
      throw InputError(file + ": line " + std::to_string(number) + ": '" + line +
                       "' is not a merge of two symbols ('a b')");
    }
    merges.emplace_back(line.substr(0, space), line.substr(space + 1));
  }
  return merges;
}

Gpt2Tokenizer Gpt2Tokenizer::load(const std::string& vocab_path, const std::string& merges_path) {
  auto vocab = parse_json_string_to_int(read_file(vocab_path, "vocabulary"), vocab_path);
  auto merges = parse_bpe_merges(read_file(merges_path, "BPE merges"), merges_path);
  if (vocab.empty()) throw InputError(vocab_path + ": the vocabulary is empty");
  return Gpt2Tokenizer(vocab, merges, vocab_path);
}

Gpt2Tokenizer::Gpt2Tokenizer(const std::vector<std::pair<std::string, std::int64_t>>& vocab,
                             const std::vector<std::pair<std::string, std::string>>& merges,
                             std::string source)
    : bpe_(vocab, merges, BpeOptions{}, std::move(source)), end_of_text_(bpe_.id(kEndOfText)) {}

void Gpt2Tokenizer::encode_text(const std::string& text, std::vector<std::int64_t>* ids) const {
  for (const std::string& piece : gpt2_pretokenize(text)) bpe_.encode_piece(piece, ids);
}

std::vector<std::int64_t> Gpt2Tokenizer::encode(const std::string& text) const {
  std::vector<std::int64_t> ids;
  if (end_of_text_ < 0) {
    encode_text(text, &ids);
    return ids;
  }
  const std::string eot = kEndOfText;
  std::size_t from = 0;
  for (std::size_t at; (at = text.find(eot, from)) != std::string::npos; from = at + eot.size()) {
    encode_text(text.substr(from, at - from), &ids);
    ids.push_back(end_of_text_);
  }
  encode_text(text.substr(from), &ids);
  return ids;
}

const std::string& Gpt2Tokenizer::token(std::int64_t id) const {
  const std::string* t = bpe_.token(id);
  if (t == nullptr) {
    throw InputError(bpe_.source() + ": no token has id " + std::to_string(id) +
                     " (the vocabulary has " + std::to_string(bpe_.size()) + " tokens, ids 0.." +
                     std::to_string(bpe_.largest_id()) + ")");
  }
  return *t;
}

std::string Gpt2Tokenizer::decode(const std::vector<std::int64_t>& ids) const {
  std::string bytes;
  for (std::int64_t id : ids) {
    const std::string& t = token(id);
    if (!byte_symbols_to_bytes(t, &bytes)) {
      throw InputError(bpe_.source() + ": token " + std::to_string(id) + " ('" +
                       replace_invalid_utf8(t) +
                       "') has a character that is not one of GPT-2's byte symbols");
    }
  }
  return replace_invalid_utf8(bytes);
}

}  // namespace kiln::data
