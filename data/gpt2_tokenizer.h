#pragma once
// GPT-2's byte-level BPE tokenizer (OpenAI's encoder.py, transformers' GPT2Tokenizer), read from
// the two files transformers ships: vocab.json (token -> id) and merges.txt (one merge "a b" per
// line, by rank, after a "#version" line).
//
// encode: the text is split by GPT-2's pre-tokenization pattern (SplitPattern::Gpt2 in
// data/pretokenize.h); each piece goes through byte-level BPE (data/byte_level_bpe.h). The
// special token "<|endoftext|>", where the vocabulary has it, is recognised in the text as itself
// (as transformers does), not spelled out as characters.
// decode: ids -> symbols -> bytes; invalid UTF-8 (a multi-byte character cut between tokens) comes
// out as U+FFFD, as transformers' errors="replace".
// Every error names the file (or the text's piece) and what is wrong: InputError.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "data/byte_level_bpe.h"
#include "data/pretokenize.h"

namespace kiln::data {

class Gpt2Tokenizer {
 public:
  // Reads and checks both files. InputError: a missing or unreadable file, bad JSON, an id that is
  // negative or used twice, a merges line that is not two symbols, a merge of symbols (or to a
  // symbol) the vocabulary does not have.
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
  std::int64_t vocab_size() const { return bpe_.largest_id() + 1; }

 private:
  void encode_text(const std::string& text, std::vector<std::int64_t>* ids) const;

  ByteLevelBpe bpe_;
  std::int64_t end_of_text_ = -1;  // "<|endoftext|>"'s id, if any
};

// A JSON object of strings to integers (vocab.json), in file order. InputError naming `file`, the
// line and column, and what was expected (core/json_value.h).
std::vector<std::pair<std::string, std::int64_t>> parse_json_string_to_int(const std::string& text,
                                                                           const std::string& file);

// merges.txt's lines "a b" in rank order; a first line starting "#version" and empty lines are
// skipped. InputError naming `file` and the line.
std::vector<std::pair<std::string, std::string>> parse_bpe_merges(const std::string& text,
                                                                  const std::string& file);

}  // namespace kiln::data
