#pragma once
// llm.c's token shards (the files its data scripts write, dev/data/data_common.py
// write_datafile: fineweb.py, tinystories.py, tinyshakespeare.py) as a next-token dataset.
//
// File format (little-endian):
//   offset    0  int32[256]  header: [0] magic, [1] version, [2] token count; the rest is not
//                            read. GPT-2's shards: magic 20240520, version 1, uint16 tokens;
//                            large vocabularies (llm.c's llama3 branch, Llama 3 and Qwen2.5):
//                            magic 20240801, version 7, uint32 tokens
//   offset 1024  uint16 or uint32[count] the tokens, nothing after them
// Training shards are named like /data/fineweb10B/fineweb_train_000001.bin, validation shards
// ..._val_000000.bin; a dataset is the sorted set of files one glob matches.
//
// Shards are read in place, never copied into memory: each is validated once when opened
// (header, size, every token below the vocabulary), then get() reads its window with pread, so
// the page cache, not the process, holds what is read. Not mapped: a shard truncated while a run
// reads it would kill the process with SIGBUS; a short read is an InputError naming the shard.
//
// Loss masks (chat data, `kiln tokenize --chat`): beside shard X.bin may lie X.mask, Kiln's own
// format with the same 1024-byte header layout (magic 20261204, version 1, count) and then one
// uint8 per token, 1 where the token is trained, 0 where it is not. A dataset whose shards have
// masks gives the target kIgnoreIndex wherever the target token's mask is 0.

#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/file_io.h"

namespace kiln::data {

constexpr std::int32_t kLlmcShardMagic = 20240520;  // uint16 tokens
constexpr std::int32_t kLlmcShardVersion = 1;
constexpr std::int32_t kLlmcShard32Magic = 20240801;  // uint32 tokens
constexpr std::int32_t kLlmcShard32Version = 7;
constexpr std::size_t kLlmcShardHeaderBytes = 256 * sizeof(std::int32_t);
constexpr std::int32_t kLlmcMaskMagic = 20261204;  // Kiln's, not llm.c's: uint8 mask values
constexpr std::int32_t kLlmcMaskVersion = 1;

// Where the mask of token shard `shard_path` lies: its name with ".mask" in place of a final
// ".bin" (fineweb_train_000001.bin -> fineweb_train_000001.mask, which a glob of *.bin never
// matches), or with ".mask" appended to any other name.
std::string llmc_mask_path(const std::string& shard_path);

// One validated shard, read by offset.
class LlmcShard {
 public:
  // Throws InputError naming the file: a header shorter than 1024 bytes, an unknown magic or a
  // version other than its magic's, a size other than 1024 + (2 or 4) × count, or a token id >=
  // vocab_size (naming the token's index and byte offset).
  LlmcShard(const std::string& path, std::int64_t vocab_size);

  const std::string& path() const { return file_.path(); }
  std::int64_t token_count() const { return count_; }
  int token_bytes() const { return token_bytes_; }  // 2 (uint16) or 4 (uint32)
  // Tokens [first, first + n) into `out`, each checked against the vocabulary again. InputError
  // naming the file when it has been truncated or rewritten since it was opened.
  void read_tokens(std::int64_t first, std::int64_t n, std::int64_t* out) const;
  // Token i, 0 <= i < token_count().
  std::int64_t token(std::int64_t i) const {
    std::int64_t id = 0;
    read_tokens(i, 1, &id);
    return id;
  }

 private:
  PositionalFile file_;
  std::int64_t count_ = 0;
  std::int64_t vocab_size_ = 0;
  int token_bytes_ = 2;
};

// The loss mask of one token shard, read by offset like the shard.
class LlmcMaskShard {
 public:
  // Throws InputError naming the file: a header shorter than 1024 bytes, a magic other than
  // kLlmcMaskMagic or a version other than kLlmcMaskVersion, a count other than the token shard's
  // (naming it), a size other than 1024 + count, or a value other than 0 or 1 (naming its index
  // and byte offset).
  LlmcMaskShard(const std::string& path, const LlmcShard& tokens);

  const std::string& path() const { return file_.path(); }
  std::int64_t count() const { return count_; }
  // Mask values [first, first + n) into `out`, each checked to be 0 or 1 again. InputError naming
  // the file when it has been truncated or rewritten since it was opened.
  void read_mask(std::int64_t first, std::int64_t n, std::uint8_t* out) const;

 private:
  PositionalFile file_;
  std::int64_t count_ = 0;
};

// Writes `tokens` as an llm.c shard (for tests and benchmarks): uint16 tokens in GPT-2's format,
// uint32 ones in the large-vocabulary format. Throws InputError on failure.
void write_llmc_shard(const std::string& path, const std::vector<std::uint16_t>& tokens);
void write_llmc_shard(const std::string& path, const std::vector<std::uint32_t>& tokens);
// Writes `mask` (values as given, even bad ones, so tests can write bad masks) as a mask shard.
void write_llmc_mask(const std::string& path, const std::vector<std::uint8_t>& mask);

// The first token of the first shard (in sorted path order) a glob matches, without scanning the
// shard: the separator kiln tokenize and llm.c's scripts write before every document. InputError
// naming the pattern or the file.
std::int64_t llmc_first_token(const std::string& pattern);

// Next-token windows over every shard a glob matches. Shard s (in sorted path order) holding n
// tokens gives floor((n - 1) / T) windows that do not overlap (stride T, as llm.c's loader):
// window w is input tokens[w·T, w·T + T), target tokens[w·T + 1, w·T + T + 1), both (T) int64.
// Dataset index i counts the windows of shard 0, then those of shard 1, and so on. When every
// shard has a mask shard (llmc_mask_path), target t of a window is kIgnoreIndex where the mask of
// its token (tokens[w·T + t + 1]) is 0: only trained tokens are predicted.
//
// The dataset has no order of its own: the loader's per-epoch permutation of all indices
// (data/sampler.h) shuffles windows across shards, by seed and epoch, and splits them over the
// ranks, so resuming from a LoaderState repeats the batches exactly. That is a superset of
// llm.c's shard-order-then-window-order shuffle; its cost is 8 bytes of order per window (not
// per token), and reads that jump between shards.
class LlmcShardDataset : public Dataset {
 public:
  // Throws InputError naming the pattern when it matches nothing, naming the file for a bad
  // shard or mask shard or a shard holding fewer than T + 1 tokens, and naming a shard with a mask
  // and one without when the glob mixes them.
  LlmcShardDataset(const std::string& pattern, std::int64_t seq_len, std::int64_t vocab_size);

  std::int64_t size() const override { return first_window_.back(); }
  SampleSpec spec() const override;
  std::string describe() const override;
  std::int64_t num_classes() const override { return vocab_size_; }
  bool get(std::int64_t index, const SampleContext& context, void* input,
           void* target) const override;

  struct Position {
    std::int64_t shard = 0;   // index into the sorted shard list
    std::int64_t window = 0;  // window within the shard
  };
  Position position(std::int64_t index) const;
  std::int64_t shard_count() const { return static_cast<std::int64_t>(shards_.size()); }
  const LlmcShard& shard(std::int64_t s) const { return shards_[static_cast<std::size_t>(s)]; }
  bool masked() const { return !masks_.empty(); }  // every shard has a mask shard
  bool masks_targets() const override { return masked(); }

 private:
  std::string pattern_;
  std::int64_t seq_len_, vocab_size_;
  std::vector<LlmcShard> shards_;
  std::vector<LlmcMaskShard> masks_;        // beside shards_, or empty
  std::vector<std::int64_t> first_window_;  // shard_count() + 1 entries: where each shard starts
};

}  // namespace kiln::data
