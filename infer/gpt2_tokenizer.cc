#include "infer/gpt2_tokenizer.h"

#include <algorithm>
#include <limits>
#include <sstream>

#include "core/check.h"
#include "core/file_kind.h"
#include "core/json_string.h"

namespace kiln::infer {
namespace {

struct CodePointRange {
  std::uint32_t first, last;
};
#include "infer/unicode_ranges.inc"

template <std::size_t N>
bool in_ranges(const CodePointRange (&ranges)[N], std::uint32_t cp) {
  const CodePointRange* end = ranges + N;
  const CodePointRange* it = std::upper_bound(
      ranges, end, cp, [](std::uint32_t c, const CodePointRange& r) { return c < r.first; });
  return it != ranges && cp <= (it - 1)->last;
}

constexpr std::uint32_t kInvalid = 0xFFFFFFFFu;  // a byte that does not start valid UTF-8
const char* const kEndOfText = "<|endoftext|>";

bool is_letter(std::uint32_t cp) {
  return cp != kInvalid && in_ranges(kLetterRanges, cp);
}
bool is_number(std::uint32_t cp) {
  return cp != kInvalid && in_ranges(kNumberRanges, cp);
}
// Unicode's White_Space property, what \s matches in the regex module GPT-2 uses.
bool is_space(std::uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}
bool is_other(std::uint32_t cp) {
  return !is_space(cp) && !is_letter(cp) && !is_number(cp);
}

// The length of the well-formed UTF-8 character at s[i] (1 to 4) and its code point; for an
// ill-formed sequence, the length of its maximal prefix that could start a character (at least 1,
// as Python's errors="replace" counts them) and kInvalid.
std::size_t utf8_next(const std::string& s, std::size_t i, std::uint32_t* cp) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char b0 = byte(i);
  *cp = kInvalid;
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  std::size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  std::uint32_t value;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
    value = b0 & 0x1Fu;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    value = b0 & 0x0Fu;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    value = b0 & 0x07u;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 1;
  }
  std::size_t k = 1;
  for (; k <= need; ++k) {
    if (i + k >= s.size()) return k;
    const unsigned char b = byte(i + k);
    if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return k;
    value = (value << 6) | (b & 0x3Fu);
  }
  *cp = value;
  return k;
}

// Bytes with every ill-formed sequence replaced by U+FFFD.
std::string replace_invalid_utf8(const std::string& bytes) {
  std::string out;
  for (std::size_t i = 0; i < bytes.size();) {
    std::uint32_t cp;
    const std::size_t n = utf8_next(bytes, i, &cp);
    if (cp == kInvalid) {
      out += "\xEF\xBF\xBD";
    } else {
      out.append(bytes, i, n);
    }
    i += n;
  }
  return out;
}

// Reverse of gpt2_byte_symbols(): symbol code point -> byte.
const std::unordered_map<std::uint32_t, unsigned char>& symbol_bytes() {
  static const std::unordered_map<std::uint32_t, unsigned char> map = [] {
    std::unordered_map<std::uint32_t, unsigned char> m;
    const auto& symbols = gpt2_byte_symbols();
    for (int b = 0; b < 256; ++b) {
      std::uint32_t cp;
      utf8_next(symbols[static_cast<std::size_t>(b)], 0, &cp);
      m[cp] = static_cast<unsigned char>(b);
    }
    return m;
  }();
  return map;
}

std::string read_file(const std::string& path, const char* what) {
  return read_regular_file(path, std::string("the ") + what);
}

class JsonObjectReader {
 public:
  JsonObjectReader(const std::string& text, const std::string& file) : text_(text), file_(file) {}

  std::vector<std::pair<std::string, std::int64_t>> parse() {
    std::vector<std::pair<std::string, std::int64_t>> out;
    expect('{', "'{' (vocab.json is one object of token -> id)");
    if (peek() == '}') {
      ++pos_;
    } else {
      while (true) {
        std::string key = string_literal();
        expect(':', "':'");
        out.emplace_back(std::move(key), integer());
        const char c = peek();
        ++pos_;
        if (c == ',') continue;
        if (c != '}') fail_at(pos_ - 1, "expected ',' or '}'");
        break;
      }
    }
    skip_space();
    if (pos_ != text_.size()) fail_at(pos_, "text after the object");
    return out;
  }

 private:
  [[noreturn]] void fail_at(std::size_t at, const std::string& what) const {
    std::size_t line = 1, column = 1;
    for (std::size_t i = 0; i < at && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    throw InputError(file_ + ": bad JSON at line " + std::to_string(line) + ", column " +
                     std::to_string(column) + ": " + what);
  }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' ||
                                   text_[pos_] == '\r' || text_[pos_] == '\t')) {
      ++pos_;
    }
  }
  char peek() {
    skip_space();
    if (pos_ >= text_.size()) fail_at(pos_, "unexpected end of file");
    return text_[pos_];
  }
  void expect(char c, const char* what) {
    if (peek() != c) fail_at(pos_, std::string("expected ") + what);
    ++pos_;
  }
  std::string string_literal() {
    expect('"', "a string");
    return read_json_string(text_, pos_,
                            [this](std::size_t at, const std::string& what) { fail_at(at, what); });
  }
  std::int64_t integer() {
    peek();  // skips space
    const std::size_t start = pos_;
    if (text_[pos_] == '-') ++pos_;
    const std::size_t digits = pos_;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
    if (pos_ == digits) fail_at(start, "expected an integer id");
    if (pos_ - digits > 12) fail_at(start, "id too large");
    if (pos_ < text_.size() && (text_[pos_] == '.' || text_[pos_] == 'e' || text_[pos_] == 'E')) {
      fail_at(start, "expected an integer id, not a fraction");
    }
    return std::stoll(text_.substr(start, pos_ - start));
  }

  const std::string& text_;
  const std::string& file_;
  std::size_t pos_ = 0;
};

}  // namespace

const std::vector<std::string>& gpt2_byte_symbols() {
  static const std::vector<std::string> symbols = [] {
    // Printable Latin-1 bytes stand for themselves; the others (controls, space, 0x7F-0xA0,
    // 0xAD) map to 256, 257, ... in byte order.
    std::vector<std::string> s(256);
    std::uint32_t next = 256;
    for (std::uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      append_utf8(printable ? b : next++, &s[b]);
    }
    return s;
  }();
  return symbols;
}

std::vector<std::string> gpt2_pretokenize(const std::string& text) {
  struct Char {
    std::uint32_t cp;
    std::size_t begin, end;  // bytes of text
  };
  std::vector<Char> c;
  for (std::size_t i = 0; i < text.size();) {
    std::uint32_t cp;
    const std::size_t n = utf8_next(text, i, &cp);
    if (cp == kInvalid) {  // one character per ill-formed byte
      for (std::size_t k = 0; k < n; ++k) c.push_back({kInvalid, i + k, i + k + 1});
    } else {
      c.push_back({cp, i, i + n});
    }
    i += n;
  }
  const std::size_t n = c.size();
  const auto at = [&](std::size_t j) { return j < n ? c[j].cp : kInvalid; };
  const auto run = [&](std::size_t j, bool (*in)(std::uint32_t)) {
    while (j < n && in(c[j].cp)) ++j;
    return j;
  };
  // ` ?X+` from i: the end of the match, or i for none.
  const auto optional_space_run = [&](std::size_t i, bool (*in)(std::uint32_t)) {
    const std::size_t j = at(i) == ' ' ? i + 1 : i;
    return j < n && in(c[j].cp) ? run(j, in) : i;
  };
  std::vector<std::string> pieces;
  for (std::size_t i = 0; i < n;) {
    std::size_t end = i;
    if (at(i) == '\'') {  // 's 't 're 've 'm 'll 'd (case-sensitive, as GPT-2's)
      const std::uint32_t a = at(i + 1), b = at(i + 2);
      if (a == 's' || a == 't' || a == 'm' || a == 'd') {
        end = i + 2;
      } else if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
        end = i + 3;
      }
    }
    if (end == i) end = optional_space_run(i, is_letter);
    if (end == i) end = optional_space_run(i, is_number);
    if (end == i) end = optional_space_run(i, is_other);
    if (end == i) {
      // Whitespace: \s+(?!\S) leaves the last space of a run before a non-space to start the
      // next piece (" word"); a single space there is \s+ alone.
      const std::size_t last = run(i, is_space);
      end = last == n || last - i == 1 ? last : last - 1;
    }
    pieces.push_back(text.substr(c[i].begin, c[end - 1].end - c[i].begin));
    i = end;
  }
  return pieces;
}

std::vector<std::pair<std::string, std::int64_t>> parse_json_string_to_int(
    const std::string& text, const std::string& file) {
  return JsonObjectReader(text, file).parse();
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
    : source_(std::move(source)) {
  std::int64_t largest = -1;
  for (const auto& [token, id] : vocab) {
    if (id < 0) {
      throw InputError(source_ + ": token '" + token + "' has the negative id " +
                       std::to_string(id));
    }
    largest = std::max(largest, id);
  }
  tokens_.resize(static_cast<std::size_t>(largest + 1));
  defined_.resize(tokens_.size(), false);
  for (const auto& [token, id] : vocab) {
    const auto slot = static_cast<std::size_t>(id);
    if (defined_[slot]) {
      throw InputError(source_ + ": id " + std::to_string(id) + " belongs to both '" +
                       tokens_[slot] + "' and '" + token + "'");
    }
    if (!ids_.emplace(token, id).second) {
      throw InputError(source_ + ": token '" + token + "' appears twice");
    }
    tokens_[slot] = token;
    defined_[slot] = true;
  }
  auto eot = ids_.find(kEndOfText);
  if (eot != ids_.end()) end_of_text_ = eot->second;
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    // The first occurrence of a pair ranks it, as a Python dict built from the list in order
    // would keep the last; GPT-2's files have no repeated pair, so either reads them alike.
    merge_ranks_.emplace(merges[rank].first + " " + merges[rank].second,
                         static_cast<std::int64_t>(rank));
  }
}

std::vector<std::string> Gpt2Tokenizer::bpe(const std::string& piece) const {
  std::vector<std::string> word;
  for (unsigned char b : piece) word.push_back(gpt2_byte_symbols()[b]);
  while (word.size() > 1) {
    std::int64_t best = std::numeric_limits<std::int64_t>::max();
    std::size_t best_at = 0;
    for (std::size_t i = 0; i + 1 < word.size(); ++i) {
      auto it = merge_ranks_.find(word[i] + " " + word[i + 1]);
      if (it != merge_ranks_.end() && it->second < best) {
        best = it->second;
        best_at = i;
      }
    }
    if (best == std::numeric_limits<std::int64_t>::max()) break;
    // Merge every occurrence of the best pair, left to right.
    const std::string first = word[best_at], second = word[best_at + 1];
    std::vector<std::string> merged;
    for (std::size_t i = 0; i < word.size();) {
      if (i + 1 < word.size() && word[i] == first && word[i + 1] == second) {
        merged.push_back(first + second);
        i += 2;
      } else {
        merged.push_back(word[i]);
        ++i;
      }
    }
    word = std::move(merged);
  }
  return word;
}

void Gpt2Tokenizer::encode_text(const std::string& text, std::vector<std::int64_t>* ids) const {
  for (const std::string& piece : gpt2_pretokenize(text)) {
    for (const std::string& symbol : bpe(piece)) {
      auto it = ids_.find(symbol);
      if (it == ids_.end()) {
        throw InputError(source_ + ": the symbol '" + symbol + "' (of the text's piece '" +
                         replace_invalid_utf8(piece) +
                         "') is not in the vocabulary; a byte-level BPE vocabulary has all 256 "
                         "byte symbols");
      }
      ids->push_back(it->second);
    }
  }
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
  if (id < 0 || id >= vocab_size() || !defined_[static_cast<std::size_t>(id)]) {
    throw InputError(source_ + ": no token has id " + std::to_string(id) + " (the vocabulary has " +
                     std::to_string(ids_.size()) + " tokens, ids 0.." +
                     std::to_string(vocab_size() - 1) + ")");
  }
  return tokens_[static_cast<std::size_t>(id)];
}

std::string Gpt2Tokenizer::decode(const std::vector<std::int64_t>& ids) const {
  const auto& bytes_of = symbol_bytes();
  std::string bytes;
  for (std::int64_t id : ids) {
    const std::string& t = token(id);
    for (std::size_t i = 0; i < t.size();) {
      std::uint32_t cp;
      i += utf8_next(t, i, &cp);
      auto it = bytes_of.find(cp);
      if (it == bytes_of.end()) {
        throw InputError(source_ + ": token " + std::to_string(id) + " ('" +
                         replace_invalid_utf8(t) +
                         "') has a character that is not one of GPT-2's byte symbols");
      }
      bytes += static_cast<char>(it->second);
    }
  }
  return replace_invalid_utf8(bytes);
}

}  // namespace kiln::infer
