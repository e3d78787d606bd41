#include "data/pretokenize.h"

namespace kiln::data {
namespace {

struct KnownPattern {
  SplitPattern pattern;
  const char* name;
  const char* regex;
};
const KnownPattern kPatterns[] = {
    {SplitPattern::Gpt2, "GPT-2's",
     R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)"},
    {SplitPattern::Llama3, "Llama 3's",
     R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
    {SplitPattern::Qwen2, "Qwen2's",
     R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
};

const KnownPattern& known(SplitPattern pattern) {
  for (const KnownPattern& k : kPatterns) {
    if (k.pattern == pattern) return k;
  }
  return kPatterns[0];  // not reached: the table has every SplitPattern
}

bool is_other(std::uint32_t cp) {
  return !is_space(cp) && !is_letter(cp) && !is_number(cp);
}
bool is_line_break(std::uint32_t cp) {
  return cp == '\r' || cp == '\n';
}

// The end of each pattern's match at a position of a text's characters.
class Matcher {
 public:
  explicit Matcher(const std::vector<TextChar>& c) : c_(c), n_(c.size()) {}

  std::size_t gpt2(std::size_t i) const {
    std::size_t end = contraction(i, false);
    if (end == i) end = optional_space_run(i, is_letter);
    if (end == i) end = optional_space_run(i, is_number);
    if (end == i) end = optional_space_run(i, is_other);
    return end != i ? end : trailing_space(i);
  }

  // Llama 3's pattern with \p{N}{1,max_digits}.
  std::size_t llama3(std::size_t i, std::size_t max_digits) const {
    std::size_t end = contraction(i, true);
    if (end != i) return end;
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (is_letter(at(i))) return run(i, is_letter);
    if (!is_line_break(at(i)) && !is_number(at(i)) && is_letter(at(i + 1))) {
      return run(i + 1, is_letter);
    }
    if (is_number(at(i))) {
      for (end = i; end < n_ && end - i < max_digits && is_number(c_[end].cp);) ++end;
      return end;
    }
    //  ?[^\s\p{L}\p{N}]+[\r\n]*
    end = optional_space_run(i, is_other);
    if (end != i) return run(end, is_line_break);
    // \s*[\r\n]+: the space run up to and including its last line break, if it has one.
    const std::size_t spaces = run(i, is_space);
    for (std::size_t k = spaces; k > i; --k) {
      if (is_line_break(c_[k - 1].cp)) return k;
    }
    return trailing_space(i);
  }

 private:
  std::uint32_t at(std::size_t j) const { return j < n_ ? c_[j].cp : kInvalidCodePoint; }
  std::size_t run(std::size_t j, bool (*in)(std::uint32_t)) const {
    while (j < n_ && in(c_[j].cp)) ++j;
    return j;
  }
  // ` ?X+` from i: the end of the match, or i for none.
  std::size_t optional_space_run(std::size_t i, bool (*in)(std::uint32_t)) const {
    const std::size_t j = at(i) == ' ' ? i + 1 : i;
    return j < n_ && in(c_[j].cp) ? run(j, in) : i;
  }
  // 's|'t|'re|'ve|'m|'ll|'d, or (?i:...) of them: the end of the match, or i for none.
  std::size_t contraction(std::size_t i, bool ignore_case) const {
    if (at(i) != '\'') return i;
    const auto fold = [&](std::uint32_t cp) -> std::uint32_t {
      if (!ignore_case) return cp;
      if (cp >= 'A' && cp <= 'Z') return cp - 'A' + 'a';
      return cp == 0x17F ? 's' : cp;  // Unicode case folding: LONG S is s (Oniguruma's (?i))
    };
    const std::uint32_t a = fold(at(i + 1)), b = fold(at(i + 2));
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    return i;
  }
  // \s+(?!\S)|\s+ from i (a space): a run of spaces leaves its last one to start the next piece
  // (" word") unless the run ends the text or is a single space.
  std::size_t trailing_space(std::size_t i) const {
    const std::size_t last = run(i, is_space);
    if (last == i) return i + 1;  // not reached: every character matches an earlier alternative
    return last == n_ || last - i == 1 ? last : last - 1;
  }

  const std::vector<TextChar>& c_;
  std::size_t n_;
};

}  // namespace

const char* split_pattern_regex(SplitPattern pattern) {
  return known(pattern).regex;
}

const char* split_pattern_name(SplitPattern pattern) {
  return known(pattern).name;
}

bool find_split_pattern(const std::string& regex, SplitPattern* pattern) {
  for (const KnownPattern& k : kPatterns) {
    if (regex == k.regex) {
      *pattern = k.pattern;
      return true;
    }
  }
  return false;
}

void split_by_pattern(std::string_view text, SplitPattern pattern, std::vector<TextChar>* chars,
                      std::vector<std::size_t>* ends) {
  text_chars(text, chars);
  const std::vector<TextChar>& c = *chars;
  const Matcher match(c);
  ends->clear();
  for (std::size_t i = 0; i < c.size();) {
    const std::size_t end = pattern == SplitPattern::Gpt2    ? match.gpt2(i)
                            : pattern == SplitPattern::Qwen2 ? match.llama3(i, 1)
                                                             : match.llama3(i, 3);
    ends->push_back(c[end - 1].end);
    i = end;
  }
}

std::vector<std::string> split_by_pattern(const std::string& text, SplitPattern pattern) {
  std::vector<TextChar> chars;
  std::vector<std::size_t> ends;
  split_by_pattern(text, pattern, &chars, &ends);
  std::vector<std::string> pieces;
  pieces.reserve(ends.size());
  std::size_t begin = 0;
  for (std::size_t end : ends) {
    pieces.push_back(text.substr(begin, end - begin));
    begin = end;
  }
  return pieces;
}

}  // namespace kiln::data
