#pragma once
// The pre-tokenization patterns of the byte-level BPE tokenizers Kiln reads, hand-written over
// UTF-8 code points (std::regex has no \p{L}): each splits a text into the pieces that BPE then
// merges within. Every character of a text falls in some match of these patterns, so the pieces
// are exactly the matches, and they concatenate back to the text. \p{L} and \p{N} are Unicode's
// general categories L* and N*, \s is White_Space (data/unicode_text.h); ill-formed UTF-8 bytes
// count as characters that are none of these. The matches are those of a backtracking regex
// engine (Oniguruma in tokenizers, Python's regex in tiktoken): the first alternative that
// matches at a position wins, quantifiers are greedy.

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "data/unicode_text.h"

namespace kiln::data {

enum class SplitPattern {
  // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  // GPT-2's (OpenAI's encoder.py; tokenizers' ByteLevel pre-tokenizer with use_regex).
  Gpt2,
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
  // \s*[\r\n]+|\s+(?!\S)|\s+   (one line): Llama 3's (tiktoken's cl100k_base).
  Llama3,
  // Llama 3's with \p{N} in place of \p{N}{1,3}: Qwen2's, numbers split into single digits.
  Qwen2,
};

// The regex as tokenizer.json writes it (after JSON unescaping).
const char* split_pattern_regex(SplitPattern pattern);
// "GPT-2's", "Llama 3's", "Qwen2's".
const char* split_pattern_name(SplitPattern pattern);

// The pattern whose regex is exactly `regex`; false for any other regex.
bool find_split_pattern(const std::string& regex, SplitPattern* pattern);

// The pattern's matches in `text`, in order, as byte strings whose concatenation is `text`.
std::vector<std::string> split_by_pattern(const std::string& text, SplitPattern pattern);
// The same as the byte offsets where the matches end, into `ends` (cleared first), without a
// string per match; `chars` is scratch for the text's characters. For encoding many texts.
void split_by_pattern(std::string_view text, SplitPattern pattern, std::vector<TextChar>* chars,
                      std::vector<std::size_t>* ends);

inline std::vector<std::string> gpt2_pretokenize(const std::string& text) {
  return split_by_pattern(text, SplitPattern::Gpt2);
}

}  // namespace kiln::data
