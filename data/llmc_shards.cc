#include "data/llmc_shards.h"

#include <algorithm>
#include <utility>

#include "core/check.h"

namespace kiln::data {

namespace {

std::int32_t read_le32(const std::uint8_t* p) {
  return static_cast<std::int32_t>(
      static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8) |
      (static_cast<std::uint32_t>(p[2]) << 16) | (static_cast<std::uint32_t>(p[3]) << 24));
}

void put_le(std::vector<std::uint8_t>* out, std::uint32_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<std::uint8_t>(value >> (8 * i)));
}

}  // namespace

LlmcShard::LlmcShard(const std::string& path, std::int64_t vocab_size)
    : file_(path), vocab_size_(vocab_size) {
  const std::uint64_t size = file_.size();
  if (size < kLlmcShardHeaderBytes) {
    throw_file_error(path, size,
                     "truncated header: " + std::to_string(size) +
                         " bytes, an llm.c token shard starts with a " +
                         std::to_string(kLlmcShardHeaderBytes) + "-byte header");
  }
  std::uint8_t header[12];
  file_.read_at(0, header, sizeof(header));
  const std::int32_t magic = read_le32(header);
  if (magic != kLlmcShardMagic && magic != kLlmcShard32Magic) {
    throw_file_error(path, 0,
                     "wrong magic " + std::to_string(magic) +
                         ", not an llm.c token shard (expected " + std::to_string(kLlmcShardMagic) +
                         " for uint16 tokens or " + std::to_string(kLlmcShard32Magic) +
                         " for uint32 tokens)");
  }
  const bool wide = magic == kLlmcShard32Magic;
  const std::int32_t known = wide ? kLlmcShard32Version : kLlmcShardVersion;
  const std::int32_t version = read_le32(header + 4);
  if (version != known) {
    throw_file_error(path, 4,
                     "unsupported version " + std::to_string(version) + " for magic " +
                         std::to_string(magic) + " (this reader knows version " +
                         std::to_string(known) + (wide ? ": uint32 tokens)" : ": uint16 tokens)"));
  }
  token_bytes_ = wide ? 4 : 2;
  const std::int32_t count = read_le32(header + 8);
  if (count <= 0) {
    throw_file_error(path, 8, "the header claims " + std::to_string(count) + " tokens");
  }
  count_ = count;
  const std::uint64_t expected =
      kLlmcShardHeaderBytes + static_cast<std::uint64_t>(token_bytes_) * count;
  if (size < expected) {
    throw_file_error(path, size,
                     "truncated: the header claims " + std::to_string(count) + " tokens (" +
                         std::to_string(expected) + " bytes with the header) but the file has " +
                         std::to_string(size) + " bytes");
  }
  if (size > expected) {
    throw_file_error(path, expected,
                     std::to_string(size - expected) +
                         " unexpected bytes after the last token (the header claims " +
                         std::to_string(count) + " tokens)");
  }
  // Every uint16 id is below a vocabulary of 65536 or more: nothing to scan then.
  if (!wide && vocab_size >= 65536) return;
  std::vector<std::int64_t> chunk(std::size_t{1} << 18);
  for (std::int64_t first = 0; first < count_; first += static_cast<std::int64_t>(chunk.size())) {
    const std::int64_t n = std::min<std::int64_t>(count_ - first, chunk.size());
    read_tokens(first, n, chunk.data());  // throws naming the first id out of range
  }
}

void LlmcShard::read_tokens(std::int64_t first, std::int64_t n, std::int64_t* out) const {
  KILN_CHECK(first >= 0 && n >= 0 && first + n <= count_, "llmc_shards: token range out of range");
  // One read per window: 2 or 4 bytes per token, staged in this thread's buffer.
  const std::uint64_t width = static_cast<std::uint64_t>(token_bytes_);
  thread_local std::vector<std::uint8_t> bytes;
  bytes.resize(width * static_cast<std::size_t>(n));
  const std::uint64_t offset = kLlmcShardHeaderBytes + width * static_cast<std::uint64_t>(first);
  file_.read_at(offset, bytes.data(), bytes.size());
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint8_t* p = bytes.data() + width * static_cast<std::uint64_t>(i);
    const std::int64_t id =
        token_bytes_ == 2 ? static_cast<std::int64_t>(p[0] | (p[1] << 8))
                          : static_cast<std::int64_t>(static_cast<std::uint32_t>(read_le32(p)));
    if (id >= vocab_size_) {
      throw_file_error(path(), offset + width * static_cast<std::uint64_t>(i),
                       "token " + std::to_string(first + i) + " has id " + std::to_string(id) +
                           ", not below the model's vocabulary size " +
                           std::to_string(vocab_size_));
    }
    out[i] = id;
  }
}

namespace {

template <typename Token>
void write_shard(const std::string& path, const std::vector<Token>& tokens, std::int32_t magic,
                 std::int32_t version) {
  KILN_CHECK(tokens.size() <= 0x7fffffffu, "write_llmc_shard: more tokens than an int32 counts");
  constexpr int kWidth = static_cast<int>(sizeof(Token));
  std::vector<std::uint8_t> out;
  out.reserve(kLlmcShardHeaderBytes + kWidth * tokens.size());
  put_le(&out, static_cast<std::uint32_t>(magic), 4);
  put_le(&out, static_cast<std::uint32_t>(version), 4);
  put_le(&out, static_cast<std::uint32_t>(tokens.size()), 4);
  out.resize(kLlmcShardHeaderBytes, 0);
  for (Token t : tokens) put_le(&out, t, kWidth);
  write_file(path, out.data(), out.size());
}

}  // namespace

void write_llmc_shard(const std::string& path, const std::vector<std::uint16_t>& tokens) {
  write_shard(path, tokens, kLlmcShardMagic, kLlmcShardVersion);
}

void write_llmc_shard(const std::string& path, const std::vector<std::uint32_t>& tokens) {
  write_shard(path, tokens, kLlmcShard32Magic, kLlmcShard32Version);
}

// ---------------------------------------------------------------------------------------------

LlmcShardDataset::LlmcShardDataset(const std::string& pattern, std::int64_t seq_len,
                                   std::int64_t vocab_size)
    : pattern_(pattern), seq_len_(seq_len), vocab_size_(vocab_size) {
  if (seq_len_ <= 0) throw InputError("seq_len must be positive, got " + std::to_string(seq_len_));
  if (vocab_size_ <= 0) {
    throw InputError("vocab_size must be positive, got " + std::to_string(vocab_size_));
  }
  if (pattern.empty()) {
    throw InputError(
        "llmc_shards needs a glob of llm.c token shards, such as "
        "/data/fineweb10B/fineweb_train_*.bin");
  }
  const std::vector<std::string> paths = glob_paths(pattern);
  if (paths.empty()) {
    throw InputError(pattern +
                     ": matches no file (llmc_shards reads the llm.c token shards a glob "
                     "matches, such as /data/fineweb10B/fineweb_train_*.bin)");
  }
  shards_.reserve(paths.size());
  first_window_.push_back(0);
  for (const std::string& path : paths) {
    shards_.emplace_back(path, vocab_size_);
    const std::int64_t windows = (shards_.back().token_count() - 1) / seq_len_;
    if (windows == 0) {
      throw InputError(path + ": " + std::to_string(shards_.back().token_count()) +
                       " tokens, fewer than one window of seq_len " + std::to_string(seq_len_) +
                       " plus the next token");
    }
    first_window_.push_back(first_window_.back() + windows);
  }
}

SampleSpec LlmcShardDataset::spec() const {
  return SampleSpec{{seq_len_}, DType::I64, {seq_len_}, DType::I64};
}

std::string LlmcShardDataset::describe() const {
  return "llmc_shards " + pattern_ + " (" + std::to_string(shards_.size()) + " shards, " +
         std::to_string(size()) + " windows of " + std::to_string(seq_len_) + ", vocabulary " +
         std::to_string(vocab_size_) + ")";
}

LlmcShardDataset::Position LlmcShardDataset::position(std::int64_t index) const {
  KILN_CHECK(index >= 0 && index < size(), "llmc_shards: window index out of range");
  // The last shard whose first window is <= index.
  const auto after = std::upper_bound(first_window_.begin(), first_window_.end(), index);
  Position where;
  where.shard = static_cast<std::int64_t>(after - first_window_.begin()) - 1;
  where.window = index - first_window_[static_cast<std::size_t>(where.shard)];
  return where;
}

bool LlmcShardDataset::get(std::int64_t index, const SampleContext& /*context*/, void* input,
                           void* target) const {
  const Position where = position(index);
  const LlmcShard& shard = shards_[static_cast<std::size_t>(where.shard)];
  auto* ids = static_cast<std::int64_t*>(input);    // (T)
  auto* next = static_cast<std::int64_t*>(target);  // (T)
  // Tokens [start, start + T], one read: the input is the first T, the target the last T.
  thread_local std::vector<std::int64_t> window;
  window.resize(static_cast<std::size_t>(seq_len_) + 1);
  shard.read_tokens(where.window * seq_len_, seq_len_ + 1, window.data());
  std::copy(window.begin(), window.end() - 1, ids);
  std::copy(window.begin() + 1, window.end(), next);
  return true;
}

}  // namespace kiln::data
