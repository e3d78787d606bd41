#pragma once
// Writes llm.c token shards (the format data/llmc_shards.h reads) from a stream of tokens, as
// llm.c's dev/data/fineweb.py does: shard after shard of `shard_tokens` tokens, the last one
// shorter, a document cut where a shard fills continuing in the next. The token width follows
// the vocabulary: uint16 (magic 20240520, version 1) when every id fits in 16 bits, else uint32
// (llm.c's llama3 branch: magic 20240801, version 7).
//
// Nothing is visible under a shard's name until commit(): each shard is written to
// "<name>.tmp.<pid>", its header's count filled in and the file flushed to disk when it is
// complete, and commit() renames them all. A writer destroyed (or discard()ed) before commit()
// removes every file it wrote, so a failed run leaves no shard, whole or half.
//
// With masks (chat data), each token shard gets a loss mask beside it (llmc_mask_path: X.bin ->
// X.mask, data/llmc_shards.h), one uint8 per token, cut at the same places; masks are written,
// completed and renamed alongside their shards, the masks first, so a shard that has its name has
// its mask.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kiln::data {

class LlmcShardWriter {
 public:
  // Shards DIR/NAME_SPLIT_000000.bin numbered from `first_index` (llm.c: val from 0, train from
  // 1), with a mask beside each when `masks`. InputError for shard_tokens outside [1, 2^31 - 1]
  // (the header's int32 count) or a vocabulary outside [1, 2^32].
  LlmcShardWriter(std::string dir, std::string name, std::string split, int first_index,
                  std::int64_t shard_tokens, std::int64_t vocab_size, bool masks = false);
  ~LlmcShardWriter();
  LlmcShardWriter(const LlmcShardWriter&) = delete;
  LlmcShardWriter& operator=(const LlmcShardWriter&) = delete;

  // Appends tokens and, with masks, their mask values (0 or 1; `mask` is ignored without masks),
  // opening and completing shards as they fill. InputError naming the file when it cannot be
  // created or written (a full disk), or for an id at or past the vocabulary size.
  void write(const std::uint32_t* tokens, const std::uint8_t* mask, std::size_t n);
  void write(const std::uint32_t* tokens, std::size_t n) { write(tokens, nullptr, n); }
  void write(std::uint32_t token, std::uint8_t mask = 0) { write(&token, &mask, 1); }
  // Completes the open shard, if any, and renames every shard (and mask) to its final name;
  // returns the shards' final paths in order. Nothing may be written after it.
  std::vector<std::string> commit();
  // Removes every file written so far (what the destructor does before commit()).
  void discard() noexcept;

  // The final path of shard i of this writer (i from 0).
  std::string shard_path(int i) const;
  int token_bytes() const { return token_bytes_; }  // 2 or 4
  bool masks() const { return masks_ != nullptr; }
  std::int64_t tokens_written() const { return total_; }
  int shards_started() const;

  // 2 for a vocabulary of at most 65536 ids, else 4.
  static int token_bytes_for(std::int64_t vocab_size);

 private:
  class Files;  // the temporary files of one kind (shards or masks)
  void complete_shard();

  std::string dir_, name_, split_;
  int first_index_;
  std::int64_t shard_tokens_, vocab_size_;
  int token_bytes_;
  std::unique_ptr<Files> tokens_, masks_;  // masks_: nullptr without masks
  std::int64_t in_shard_ = 0;              // tokens in the open shard
  std::int64_t total_ = 0;
  bool committed_ = false;
};

}  // namespace kiln::data
