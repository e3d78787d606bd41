#pragma once
// A Hugging Face tokenizers `tokenizer.json` of the byte-level BPE family (GPT-2, Llama 3,
// Qwen2 and what `tokenizers` trains alike), giving the ids tokenizers' Tokenizer.encode gives
// and decoding as its Tokenizer.decode does. What a file may hold (docs/sample.md):
//
//   model           BPE: vocab, merges ("a b" strings or [a, b] pairs), ignore_merges,
//                   unk_token/fuse_unk; dropout null or 0, byte_fallback false, no subword prefix
//                   or suffix
//   added_tokens    matched in the text before anything else, longest first at the leftmost
//                   position (tokenizers' AddedVocabulary): those with normalized false in the
//                   raw text, the others in the normalized text; lstrip and rstrip honoured,
//                   single_word refused
//   normalizer      null or NFC (alone or in a Sequence)
//   pre_tokenizer   ByteLevel (add_prefix_space, use_regex: GPT-2's pattern), or a Sequence of
//                   Split steps (Isolated, not inverted, with GPT-2's, Llama 3's or Qwen2's regex,
//                   recognised by its exact text: data/pretokenize.h) ending in ByteLevel
//   post_processor  null, ByteLevel, TemplateProcessing (its `single` template: Llama 3's BOS),
//                   RobertaProcessing (<s> text </s>), or a Sequence of these
//   decoder         ByteLevel
//
// Anything else (another model, normalizer, pre-tokenizer step, pattern or post-processor,
// truncation or padding) is an InputError naming the file, the field, where it is and what Kiln
// reads instead: a tokenizer that loads gives tokenizers' ids.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "data/byte_level_bpe.h"
#include "data/pretokenize.h"
#include "data/unicode_text.h"

namespace kiln::data {

class HfTokenizer {
 public:
  // Reads and checks a tokenizer.json. InputError: a missing or unreadable file, bad JSON, a
  // field of the wrong kind, anything the list above does not have.
  static HfTokenizer load(const std::string& path);
  // From the file's text; `source` names it in messages.
  static HfTokenizer from_json(const std::string& text, const std::string& source);

  // tokenizers' encode(text, add_special_tokens=...).ids: added tokens, normalization,
  // pre-tokenization, BPE, then (with add_special_tokens) the post-processor's template.
  // InputError for a byte whose symbol the vocabulary lacks (without an unk_token).
  std::vector<std::int64_t> encode(const std::string& text, bool add_special_tokens = true) const;

  struct EncodeOptions {
    bool add_special_tokens = true;
    // Special added tokens written in the text are encoded as text, never matched (tokenizers'
    // encode_special_tokens = True, transformers' split_special_tokens=True, tiktoken's
    // encode_ordinary): a document cannot forge a separator. Other added tokens still match.
    bool split_special_tokens = false;
  };
  // What a thread keeps between encode calls for speed: the tokens of the pieces it has encoded
  // (BpePieceCache) and buffers. The ids are the same with or without it. One per thread.
  class EncodeCache {
   public:
    EncodeCache() = default;

   private:
    friend class HfTokenizer;
    BpePieceCache pieces;
    std::vector<TextChar> chars;
    std::vector<std::vector<std::size_t>> ends;  // one per pre-tokenizer step
  };
  // The ids of `text` appended to `ids`; `cache` may be nullptr.
  void encode(const std::string& text, const EncodeOptions& options, EncodeCache* cache,
              std::vector<std::int64_t>* ids) const;
  // tokenizers' decode(ids, skip_special_tokens=...): each token's byte symbols back to bytes (a
  // token with other characters, such as an added one, as its own UTF-8), a character cut
  // between tokens as U+FFFD. An id that no token has is skipped, as tokenizers does (a model's
  // embedding is often padded past the tokenizer's ids).
  std::string decode(const std::vector<std::int64_t>& ids, bool skip_special_tokens = false) const;

  // The id of a token as the vocabulary or added_tokens spell it ("Ġthe", "<|eot_id|>"), or -1.
  std::int64_t token_to_id(const std::string& token) const;
  // The token with this id, or nullptr.
  const std::string* id_to_token(std::int64_t id) const;
  // One more than the largest id of the vocabulary and the added tokens.
  std::int64_t vocab_size() const;

  // The first of <|endoftext|> (GPT-2, Qwen2), <|end_of_text|> (Llama 3), <|eot_id|> (Llama 3's
  // end of turn), <|im_end|> (Qwen2's) that the tokenizer has; -1 if none.
  std::int64_t end_of_text_id() const;
  // All of those it has, in that order: the ids at which a sampler may stop.
  std::vector<std::int64_t> stop_token_ids() const;

  const std::string& source() const { return bpe_->source(); }

  // The parts of a tokenizer.json Kiln acts on, as the reader found them.
  struct AddedToken {
    std::int64_t id;
    std::string content;
    std::string pattern;  // what is matched and decoded: content, normalized when it asks to be
    bool special, normalized, lstrip, rstrip;
  };
  struct PreTokenizerStep {
    bool byte_level;  // else a Split by `pattern`
    SplitPattern pattern;
    bool use_regex;  // ByteLevel: split by GPT-2's pattern
    bool add_prefix_space;
  };
  struct TemplatePiece {
    bool sequence;                  // the text's ids, else `ids`
    std::vector<std::int64_t> ids;  // a special token's
  };

 private:
  class AddedTokenTrie;
  struct Split {
    const AddedToken* token;  // nullptr: text between added tokens
    std::string_view text;    // into the text split
  };

  HfTokenizer() = default;
  std::vector<Split> split_added(std::string_view text, bool normalized, bool split_special) const;
  void encode_pre_tokenized(std::string_view text, std::size_t step, EncodeCache* cache,
                            std::vector<std::int64_t>* ids) const;

  std::shared_ptr<const ByteLevelBpe> bpe_;
  std::vector<AddedToken> added_;
  std::unordered_map<std::string, std::int64_t> added_ids_;    // content -> id
  std::unordered_map<std::int64_t, std::size_t> added_by_id_;  // id -> index in added_
  std::unordered_set<std::string> special_contents_;
  std::shared_ptr<const AddedTokenTrie> raw_trie_, normalized_trie_;
  bool nfc_ = false;
  std::vector<PreTokenizerStep> pre_tokenizer_;
  std::vector<std::vector<TemplatePiece>> templates_;  // applied in order
};

}  // namespace kiln::data
