#include "data/token_dataset.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "core/check.h"
#include "data/file_io.h"

namespace kiln::data {

namespace {

std::uint64_t read_le(const std::uint8_t* p, int bytes) {
  std::uint64_t value = 0;
  for (int i = bytes - 1; i >= 0; --i) value = (value << 8) | p[i];
  return value;
}

void put_le(std::vector<std::uint8_t>* out, std::uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<std::uint8_t>(value >> (8 * i)));
}

}  // namespace

TokenFile read_token_file(const std::string& path) {
  std::vector<std::uint8_t> bytes = read_file(path);
  if (bytes.empty()) throw_file_error(path, "empty file, expected a token file header");
  if (bytes.size() < kTokenFileHeaderBytes) {
    throw_file_error(path, bytes.size(),
                     "truncated header: " + std::to_string(bytes.size()) + " bytes, expected " +
                         std::to_string(kTokenFileHeaderBytes));
  }
  if (std::memcmp(bytes.data(), kTokenFileMagic, sizeof(kTokenFileMagic)) != 0) {
    throw_file_error(path, 0, "wrong magic, not a Kiln token file (expected \"KILNTOK\\0\")");
  }
  TokenFile file;
  file.path = path;
  std::uint64_t version = read_le(bytes.data() + 8, 4);
  if (version != kTokenFileVersion) {
    throw_file_error(path, 8,
                     "unsupported version " + std::to_string(version) +
                         " (this reader "
                         "knows version " +
                         std::to_string(kTokenFileVersion) + ")");
  }
  file.token_width = static_cast<std::uint32_t>(read_le(bytes.data() + 12, 4));
  if (file.token_width != 2 && file.token_width != 4) {
    throw_file_error(path, 12,
                     "token width " + std::to_string(file.token_width) +
                         " bytes, expected 2 (uint16) or 4 (uint32)");
  }
  file.vocab_size = read_le(bytes.data() + 16, 8);
  std::uint64_t width_limit = file.token_width == 2 ? (1ull << 16) : (1ull << 32);
  if (file.vocab_size == 0 || file.vocab_size > width_limit) {
    throw_file_error(path, 16,
                     "vocabulary size " + std::to_string(file.vocab_size) + " is not in [1, " +
                         std::to_string(width_limit) + "] for " + std::to_string(file.token_width) +
                         "-byte tokens");
  }
  std::uint64_t count = read_le(bytes.data() + 24, 8);
  std::uint64_t held = bytes.size() - kTokenFileHeaderBytes;
  if (count > held / file.token_width) {
    throw_file_error(path, bytes.size(),
                     "truncated: the header claims " + std::to_string(count) +
                         " tokens but the file holds " + std::to_string(held / file.token_width));
  }
  if (held != count * file.token_width) {
    throw_file_error(
        path, kTokenFileHeaderBytes + count * file.token_width,
        std::to_string(held - count * file.token_width) + " unexpected bytes after the last token");
  }
  if (count == 0) throw_file_error(path, 24, "holds no tokens");
  file.tokens.resize(count);
  const std::uint8_t* p = bytes.data() + kTokenFileHeaderBytes;
  for (std::uint64_t i = 0; i < count; ++i) {
    std::uint64_t id = read_le(p + i * file.token_width, static_cast<int>(file.token_width));
    if (id >= file.vocab_size) {
      throw_file_error(path, kTokenFileHeaderBytes + i * file.token_width,
                       "token " + std::to_string(i) + " has id " + std::to_string(id) +
                           ", beyond the vocabulary size " + std::to_string(file.vocab_size));
    }
    file.tokens[i] = static_cast<std::uint32_t>(id);
  }
  return file;
}

void write_token_file(const std::string& path, const std::vector<std::uint32_t>& tokens,
                      std::uint64_t vocab_size, std::uint32_t token_width) {
  KILN_CHECK(token_width == 2 || token_width == 4, "token width must be 2 or 4");
  std::vector<std::uint8_t> out(kTokenFileMagic, kTokenFileMagic + sizeof(kTokenFileMagic));
  put_le(&out, kTokenFileVersion, 4);
  put_le(&out, token_width, 4);
  put_le(&out, vocab_size, 8);
  put_le(&out, tokens.size(), 8);
  out.reserve(out.size() + tokens.size() * token_width);
  for (std::uint32_t t : tokens) {
    KILN_CHECK(t < vocab_size, "write_token_file: token beyond the vocabulary");
    put_le(&out, t, static_cast<int>(token_width));
  }
  write_file(path, out.data(), out.size());
}

// ---------------------------------------------------------------------------------------------

MaskedLmDataset::MaskedLmDataset(std::shared_ptr<const TokenFile> file, std::int64_t seq_len,
                                 MaskingOptions masking)
    : file_(std::move(file)), seq_len_(seq_len), masking_(std::move(masking)) {
  if (seq_len_ <= 0) throw InputError("seq_len must be positive, got " + std::to_string(seq_len_));
  size_ = static_cast<std::int64_t>(file_->tokens.size()) / seq_len_;
  if (size_ == 0) {
    throw InputError(file_->path + ": " + std::to_string(file_->tokens.size()) +
                     " tokens, fewer than one window of seq_len " + std::to_string(seq_len_));
  }
  if (masking_.mask_token_id < 0 ||
      masking_.mask_token_id >= static_cast<std::int64_t>(file_->vocab_size)) {
    throw InputError("masked LM needs mask_token_id in [0, " + std::to_string(file_->vocab_size) +
                     "), got " + std::to_string(masking_.mask_token_id));
  }
  if (!(masking_.mask_prob >= 0.0 && masking_.mask_prob <= 1.0)) {
    throw InputError("mask_prob must lie in [0, 1], got " + std::to_string(masking_.mask_prob));
  }
  std::sort(masking_.never_mask.begin(), masking_.never_mask.end());
}

SampleSpec MaskedLmDataset::spec() const {
  return SampleSpec{{seq_len_}, DType::I64, {seq_len_}, DType::I64};
}

std::string MaskedLmDataset::describe() const {
  return "tokens_mlm " + file_->path + " (" + std::to_string(size_) + " windows of " +
         std::to_string(seq_len_) + ", vocabulary " + std::to_string(file_->vocab_size) + ")";
}

bool MaskedLmDataset::get(std::int64_t index, const SampleContext& context, void* input,
                          void* target) const {
  auto* ids = static_cast<std::int64_t*>(input);
  auto* labels = static_cast<std::int64_t*>(target);
  SampleContext ctx = context;
  if (!ctx.train) ctx.epoch = 0;  // evaluation masks the same way every epoch
  const std::uint32_t* window = file_->tokens.data() + index * seq_len_;
  const auto vocab = static_cast<std::uint64_t>(file_->vocab_size);
  for (std::int64_t t = 0; t < seq_len_; ++t) {
    std::int64_t token = window[t];
    ids[t] = token;
    labels[t] = kIgnoreIndex;
    // Three words per position: selection, the 80/10/10 choice, the random replacement.
    std::uint64_t w = 3 * static_cast<std::uint64_t>(t);
    if (ctx.uniform(w) >= masking_.mask_prob) continue;
    if (std::binary_search(masking_.never_mask.begin(), masking_.never_mask.end(), token)) {
      continue;
    }
    labels[t] = token;
    double choice = ctx.uniform(w + 1);
    if (choice < 0.8) {
      ids[t] = masking_.mask_token_id;
    } else if (choice < 0.9) {
      ids[t] = static_cast<std::int64_t>(ctx.below(w + 2, vocab));
    }
  }
  return true;
}

// ---------------------------------------------------------------------------------------------

CausalLmDataset::CausalLmDataset(std::shared_ptr<const TokenFile> file, std::int64_t seq_len)
    : file_(std::move(file)), seq_len_(seq_len) {
  if (seq_len_ <= 0) throw InputError("seq_len must be positive, got " + std::to_string(seq_len_));
  size_ = (static_cast<std::int64_t>(file_->tokens.size()) - 1) / seq_len_;
  if (size_ <= 0) {
    throw InputError(file_->path + ": " + std::to_string(file_->tokens.size()) +
                     " tokens, fewer than one window of seq_len " + std::to_string(seq_len_) +
                     " plus the next token");
  }
}

SampleSpec CausalLmDataset::spec() const {
  return SampleSpec{{seq_len_}, DType::I64, {seq_len_}, DType::I64};
}

std::string CausalLmDataset::describe() const {
  return "tokens_clm " + file_->path + " (" + std::to_string(size_) + " windows of " +
         std::to_string(seq_len_) + ", vocabulary " + std::to_string(file_->vocab_size) + ")";
}

bool CausalLmDataset::get(std::int64_t index, const SampleContext& /*context*/, void* input,
                          void* target) const {
  auto* ids = static_cast<std::int64_t*>(input);
  auto* next = static_cast<std::int64_t*>(target);
  const std::uint32_t* window = file_->tokens.data() + index * seq_len_;
  for (std::int64_t t = 0; t < seq_len_; ++t) {
    ids[t] = window[t];
    next[t] = window[t + 1];
  }
  return true;
}

// ---------------------------------------------------------------------------------------------

SyntheticTokenDataset::SyntheticTokenDataset(std::int64_t size, std::int64_t seq_len,
                                             std::int64_t vocab_size, std::uint64_t seed)
    : size_(size), seq_len_(seq_len), vocab_size_(vocab_size), seed_(seed) {
  if (size <= 0 || seq_len <= 0 || vocab_size <= 0) {
    throw InputError("synthetic tokens need positive size, seq_len and vocab_size");
  }
}

SampleSpec SyntheticTokenDataset::spec() const {
  return SampleSpec{{seq_len_}, DType::I64, {seq_len_}, DType::I64};
}

std::string SyntheticTokenDataset::describe() const {
  return "synthetic_tokens (" + std::to_string(size_) + " windows of " + std::to_string(seq_len_) +
         ", vocabulary " + std::to_string(vocab_size_) + ", seed " + std::to_string(seed_) + ")";
}

bool SyntheticTokenDataset::get(std::int64_t index, const SampleContext& /*context*/, void* input,
                                void* target) const {
  auto* ids = static_cast<std::int64_t*>(input);
  auto* next = static_cast<std::int64_t*>(target);
  std::uint64_t offset = static_cast<std::uint64_t>(index) << 28;
  const auto vocab = static_cast<std::uint64_t>(vocab_size_);
  auto token = [&](std::int64_t t) {
    std::uint64_t word = philox_word(seed_, offset, static_cast<std::uint64_t>(t));
    return static_cast<std::int64_t>((word * vocab) >> 32);
  };
  std::int64_t current = token(0);
  for (std::int64_t t = 0; t < seq_len_; ++t) {
    ids[t] = current;
    current = token(t + 1);
    next[t] = current;
  }
  return true;
}

}  // namespace kiln::data
