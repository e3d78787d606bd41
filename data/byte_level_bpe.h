#pragma once
// Byte-level BPE, the model under GPT-2's, Llama 3's and Qwen2's tokenizers: a piece of text (one
// match of the pre-tokenization pattern) becomes one symbol per byte, GPT-2's printable stand-in
// for it (bytes_to_unicode), and adjacent symbols merge by the rank of their pair in the merges
// list until no ranked pair is left; the resulting symbols are the tokens.
//
// The merge order is tokenizers' (models/bpe/word.rs, Word::merge_all): the pair of lowest rank
// first, the leftmost among equals, with the new pairs a merge makes joining the queue. For the
// merges a BPE trainer writes this is GPT-2's encoder.py's order too.

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kiln::data {

// GPT-2's reversible byte -> printable character map (bytes_to_unicode), as UTF-8 strings:
// printable Latin-1 bytes stand for themselves, the others map to U+0100, U+0101, ... in order.
const std::vector<std::string>& gpt2_byte_symbols();

// A token's characters back to the bytes they stand for; false (and `bytes` unspecified) when a
// character is not one of the 256 byte symbols.
bool byte_symbols_to_bytes(const std::string& symbols, std::string* bytes);

struct BpeOptions {
  // A piece that is itself in the vocabulary is one token, whatever the merges would make of it
  // (tokenizers' ignore_merges; Llama 3 sets it).
  bool ignore_merges = false;
  // What a byte without a symbol in the vocabulary becomes; empty: such a byte is an error.
  std::string unk_token;
  bool fuse_unk = false;  // consecutive unknown bytes make one unk_token
};

// The tokens of pieces already encoded, by the piece's bytes (tokenizers' BPE cache): text repeats
// its words, so most pieces are found here instead of merged again. One per thread; it holds at
// most `max_pieces` pieces and starts afresh when full, so memory stays bounded. Lookups cost one
// hash of the piece and no allocation.
class BpePieceCache {
 public:
  explicit BpePieceCache(std::size_t max_pieces = std::size_t{1} << 17);
  // The piece's tokens appended to `ids`; false when the piece is not here.
  bool find(std::string_view piece, std::vector<std::int64_t>* ids) const;
  void insert(std::string_view piece, const std::int64_t* ids, std::size_t n);
  std::size_t size() const { return count_; }

 private:
  struct Slot {
    std::size_t hash = 0;
    std::uint32_t key = 0, key_size = 0;  // into keys_
    std::uint32_t ids = 0, id_count = 0;  // into ids_; id_count 0: empty slot
  };
  void clear();
  void grow();
  std::size_t max_pieces_, count_ = 0;
  std::vector<Slot> slots_;  // open addressing, a power of two, at most half full, grown on need
  std::string keys_;
  std::vector<std::int64_t> ids_;
};

class ByteLevelBpe {
 public:
  // InputError naming `source`: an id negative, past 2^32 - 1 or used twice, a token given twice,
  // a merge whose parts or result are not in the vocabulary, an unk_token not in it. A pair listed
  // twice takes its last rank, as tokenizers and GPT-2's encoder.py do.
  ByteLevelBpe(const std::vector<std::pair<std::string, std::int64_t>>& vocab,
               const std::vector<std::pair<std::string, std::string>>& merges,
               const BpeOptions& options, std::string source);

  // Appends the tokens of one piece's bytes. InputError (naming the source, the symbol and the
  // piece) for a byte whose symbol the vocabulary lacks, without an unk_token.
  // With a cache: the tokens of a piece seen before come from it (the same tokens).
  void encode_piece(std::string_view piece, std::vector<std::int64_t>* ids,
                    BpePieceCache* cache = nullptr) const;

  // The token with this id, or nullptr.
  const std::string* token(std::int64_t id) const;
  // The id of this token, or -1.
  std::int64_t id(const std::string& token) const;

  std::size_t size() const { return ids_.size(); }      // tokens in the vocabulary
  std::int64_t largest_id() const { return largest_; }  // -1 for an empty vocabulary
  const std::string& source() const { return source_; }

 private:
  struct Merge {
    std::uint32_t rank;
    std::int64_t result;
  };
  static std::uint64_t pair_key(std::int64_t a, std::int64_t b) {
    return (static_cast<std::uint64_t>(a) << 32) | static_cast<std::uint64_t>(b);
  }
  void encode_uncached(std::string_view piece, std::vector<std::int64_t>* ids) const;
  void merge_all(std::vector<std::int64_t>* word) const;

  std::string source_;
  BpeOptions options_;
  std::int64_t unk_id_ = -1;
  std::int64_t largest_ = -1;
  std::unordered_map<std::string, std::int64_t> ids_;
  std::unordered_map<std::int64_t, std::string> tokens_;
  std::array<std::int64_t, 256> byte_ids_{};  // each byte's symbol's id, or -1
  std::unordered_map<std::uint64_t, Merge> merges_;
};

}  // namespace kiln::data
