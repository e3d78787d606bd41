#pragma once
// Token files and the language-model datasets built on them.
//
// File format (all little-endian), 32-byte header then the tokens:
//   offset  0  char[8]  magic "KILNTOK\0"
//   offset  8  uint32   version (1)
//   offset 12  uint32   token width in bytes (2 or 4)
//   offset 16  uint64   vocabulary size (every token id must be below it)
//   offset 24  uint64   token count
//   offset 32  tokens   count * width bytes, nothing after them
// The reader validates every field and every token id.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace kiln::data {

constexpr char kTokenFileMagic[8] = {'K', 'I', 'L', 'N', 'T', 'O', 'K', '\0'};
constexpr std::uint32_t kTokenFileVersion = 1;
constexpr std::size_t kTokenFileHeaderBytes = 32;

// A validated token file, held in memory as 32-bit ids.
struct TokenFile {
  std::string path;
  std::uint32_t token_width = 0;
  std::uint64_t vocab_size = 0;
  std::vector<std::uint32_t> tokens;
};

// Throws InputError naming the file and the offset of the bad field or token.
TokenFile read_token_file(const std::string& path);
// `token_width` 2 or 4; every token must be below vocab_size and fit the width.
void write_token_file(const std::string& path, const std::vector<std::uint32_t>& tokens,
                      std::uint64_t vocab_size, std::uint32_t token_width);

// BERT masking (Devlin et al. 2018): each position is selected with probability mask_prob; a
// selected token becomes [MASK] with probability 0.8, a random id with 0.1, stays with 0.1.
struct MaskingOptions {
  double mask_prob = 0.15;
  std::int64_t mask_token_id = -1;       // required: the [MASK] id, below the vocabulary size
  std::vector<std::int64_t> never_mask;  // special ids ([CLS], [SEP], [PAD]) never selected
};

// Sample i is the window tokens[i * T, (i + 1) * T). Input (T) int64: the window with masking
// applied; target (T) int64: the original id at selected positions, kIgnoreIndex elsewhere.
// Masking draws from the SampleContext, so it differs by epoch and is reproducible. With
// SampleContext::train false the masking is fixed by (seed, index) alone (stable evaluation).
class MaskedLmDataset : public Dataset {
 public:
  MaskedLmDataset(std::shared_ptr<const TokenFile> file, std::int64_t seq_len,
                  MaskingOptions masking);
  std::int64_t size() const override { return size_; }
  SampleSpec spec() const override;
  std::string describe() const override;
  std::int64_t num_classes() const override { return static_cast<std::int64_t>(file_->vocab_size); }
  bool get(std::int64_t index, const SampleContext& context, void* input,
           void* target) const override;

 private:
  std::shared_ptr<const TokenFile> file_;
  std::int64_t seq_len_, size_;
  MaskingOptions masking_;
};

// Next-token windows: input tokens[i * T, i * T + T), target tokens[i * T + 1, i * T + T + 1),
// both (T) int64. Windows do not overlap; the tail shorter than T + 1 is unused.
class CausalLmDataset : public Dataset {
 public:
  CausalLmDataset(std::shared_ptr<const TokenFile> file, std::int64_t seq_len);
  std::int64_t size() const override { return size_; }
  SampleSpec spec() const override;
  std::string describe() const override;
  std::int64_t num_classes() const override { return static_cast<std::int64_t>(file_->vocab_size); }
  bool get(std::int64_t index, const SampleContext& context, void* input,
           void* target) const override;

 private:
  std::shared_ptr<const TokenFile> file_;
  std::int64_t seq_len_, size_;
};

// Random token windows for benchmarks: a pure function of (seed, index), causal-LM shaped.
class SyntheticTokenDataset : public Dataset {
 public:
  SyntheticTokenDataset(std::int64_t size, std::int64_t seq_len, std::int64_t vocab_size,
                        std::uint64_t seed);
  std::int64_t size() const override { return size_; }
  SampleSpec spec() const override;
  std::string describe() const override;
  std::int64_t num_classes() const override { return vocab_size_; }
  bool get(std::int64_t index, const SampleContext& context, void* input,
           void* target) const override;

 private:
  std::int64_t size_, seq_len_, vocab_size_;
  std::uint64_t seed_;
};

}  // namespace kiln::data
