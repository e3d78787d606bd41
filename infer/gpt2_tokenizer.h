#pragma once
// GPT-2's byte-level BPE tokenizer (OpenAI's encoder.py, transformers' GPT2Tokenizer), read from
// the two files transformers ships: vocab.json (token -> id) and merges.txt (one merge "a b" per
// line, by rank, after a "#version" line).
//
// encode: the text is split by GPT-2's pre-tokenization pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// (hand-written over UTF-8 code points: std::regex has no \p{L}; letters and numbers are Unicode's
// general categories L* and N* from infer/unicode_ranges.inc, \s is Unicode's White_Space); each
// piece's bytes become printable characters (bytes_to_unicode), which merge pairwise by rank until
// no ranked pair is left; each resulting symbol is looked up in the vocabulary. The special token
// "<|endoftext|>", where the vocabulary has it, is recognised in the text as itself (as
// transformers does), not spelled out as characters.
// decode: ids -> symbols -> bytes; invalid UTF-8 (a multi-byte character cut between tokens) comes
// out as U+FFFD, as transformers' errors="replace".
// Every error names the file (or the text's piece) and what is wrong: InputError.

#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kiln::infer {

class Gpt2Tokenizer {
 public:
  // Reads and checks both files. InputError: a missing or unreadable file, bad JSON, an id that is
  // negative or used twice, a merges line that is not two symbols.
  static Gpt2Tokenizer load(const std::string& vocab_path, const std::string& merges_path);
  // From parsed contents; `source` names them in messages.
  Gpt2Tokenizer(const std::vector<std::pair<std::string, std::int64_t>>& vocab,
                const std::vector<std::pair<std::string, std::string>>& merges,
                std::string source = "the vocabulary");

  // InputError when a piece's symbol is not in the vocabulary (a vocabulary without the 256
  // byte symbols).
  std::vector<std::int64_t> encode(const std::string& text) const;
  // InputError for an id that no token of the vocabulary has.
  std::string decode(const std::vector<std::int64_t>& ids) const;
  // One id's symbol as vocab.json spells it ("Ġthe"); InputError as decode.
  const std::string& token(std::int64_t id) const;

  // One more than the largest id.
  std::int64_t vocab_size() const { return static_cast<std::int64_t>(tokens_.size()); }

 private:
  std::vector<std::string> bpe(const std::string& piece) const;
  void encode_text(const std::string& text, std::vector<std::int64_t>* ids) const;

  std::string source_;
  std::unordered_map<std::string, std::int64_t> ids_;
  std::vector<std::string> tokens_;  // by id; "" where no token has the id
  std::vector<bool> defined_;        // by id
  std::unordered_map<std::string, std::int64_t> merge_ranks_;  // "a b" -> rank
  std::int64_t end_of_text_ = -1;                              // "<|endoftext|>"'s id, if any
};

// GPT-2's pre-tokenization of UTF-8 text (the pattern above), as byte strings whose concatenation
// is `text`. Bytes that are not valid UTF-8 count as characters that are neither letters, numbers
// nor space.
std::vector<std::string> gpt2_pretokenize(const std::string& text);

// GPT-2's reversible byte -> printable character map (bytes_to_unicode), as UTF-8 strings.
const std::vector<std::string>& gpt2_byte_symbols();

// A JSON object of strings to integers (vocab.json), in file order. InputError naming `file`, the
// line and column, and what was expected.
std::vector<std::pair<std::string, std::int64_t>> parse_json_string_to_int(const std::string& text,
                                                                           const std::string& file);

// merges.txt's lines "a b" in rank order; a first line starting "#version" and empty lines are
// skipped. InputError naming `file` and the line.
std::vector<std::pair<std::string, std::string>> parse_bpe_merges(const std::string& text,
                                                                  const std::string& file);

}  // namespace kiln::infer
