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

// The first three fields of a shard's header (magic, version, count) after checking the file
// holds a whole header; `kind` names the file's kind in the message.
struct HeaderFields {
  std::int32_t magic = 0, version = 0, count = 0;
};

HeaderFields read_header(const PositionalFile& file, const std::string& kind) {
  const std::uint64_t size = file.size();
  if (size < kLlmcShardHeaderBytes) {
    throw_file_error(file.path(), size,
                     "truncated header: " + std::to_string(size) + " bytes, " + kind +
                         " starts with a " + std::to_string(kLlmcShardHeaderBytes) +
                         "-byte header");
  }
  std::uint8_t header[12];
  file.read_at(0, header, sizeof(header));
  return {read_le32(header), read_le32(header + 4), read_le32(header + 8)};
}

// Refuses a count <= 0 and a file size other than the header plus `width` bytes per `item`.
void check_payload(const PositionalFile& file, std::int32_t count, std::uint64_t width,
                   const std::string& item) {
  const std::string items = item + "s";
  const std::string& path = file.path();
  const std::uint64_t size = file.size();
  if (count <= 0) {
    throw_file_error(path, 8, "the header claims " + std::to_string(count) + " " + items);
  }
  const std::uint64_t expected = kLlmcShardHeaderBytes + width * static_cast<std::uint64_t>(count);
  if (size < expected) {
    throw_file_error(path, size,
                     "truncated: the header claims " + std::to_string(count) + " " + items + " (" +
                         std::to_string(expected) + " bytes with the header) but the file has " +
                         std::to_string(size) + " bytes");
  }
  if (size > expected) {
    throw_file_error(path, expected,
                     std::to_string(size - expected) + " unexpected bytes after the last " + item +
                         " (the header claims " + std::to_string(count) + " " + items + ")");
  }
}

}  // namespace

std::string llmc_mask_path(const std::string& shard_path) {
  const std::string bin = ".bin";
  if (shard_path.size() > bin.size() &&
      shard_path.compare(shard_path.size() - bin.size(), bin.size(), bin) == 0) {
    return shard_path.substr(0, shard_path.size() - bin.size()) + ".mask";
  }
  return shard_path + ".mask";
}

LlmcShard::LlmcShard(const std::string& path, std::int64_t vocab_size)
    : file_(path), vocab_size_(vocab_size) {
  const HeaderFields header = read_header(file_, "an llm.c token shard");
  const std::int32_t magic = header.magic;
  if (magic != kLlmcShardMagic && magic != kLlmcShard32Magic) {
    throw_file_error(path, 0,
                     "wrong magic " + std::to_string(magic) +
                         ", not an llm.c token shard (expected " + std::to_string(kLlmcShardMagic) +
                         " for uint16 tokens or " + std::to_string(kLlmcShard32Magic) +
                         " for uint32 tokens)" +
                         (magic == kLlmcMaskMagic
                              ? ": it is a Kiln loss mask; the glob must match the token shards "
                                "only (*.bin), their masks are found beside them"
                              : ""));
  }
  const bool wide = magic == kLlmcShard32Magic;
  const std::int32_t known = wide ? kLlmcShard32Version : kLlmcShardVersion;
  if (header.version != known) {
    throw_file_error(path, 4,
                     "unsupported version " + std::to_string(header.version) + " for magic " +
                         std::to_string(magic) + " (this reader knows version " +
                         std::to_string(known) + (wide ? ": uint32 tokens)" : ": uint16 tokens)"));
  }
  token_bytes_ = wide ? 4 : 2;
  check_payload(file_, header.count, static_cast<std::uint64_t>(token_bytes_), "token");
  count_ = header.count;
  // Every id of the width is below a vocabulary of 2^16 (2^32) or more: nothing to scan then.
  if (vocab_size >= (wide ? std::int64_t{1} << 32 : std::int64_t{1} << 16)) return;
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

LlmcMaskShard::LlmcMaskShard(const std::string& path, const LlmcShard& tokens) : file_(path) {
  const HeaderFields header = read_header(file_, "a Kiln loss mask");
  if (header.magic != kLlmcMaskMagic) {
    throw_file_error(path, 0,
                     "wrong magic " + std::to_string(header.magic) +
                         ", not a Kiln loss mask (expected " + std::to_string(kLlmcMaskMagic) +
                         ", written by kiln tokenize --chat beside " + tokens.path() + ")");
  }
  if (header.version != kLlmcMaskVersion) {
    throw_file_error(path, 4,
                     "unsupported version " + std::to_string(header.version) +
                         " of a loss mask (this reader knows version " +
                         std::to_string(kLlmcMaskVersion) + ")");
  }
  check_payload(file_, header.count, 1, "mask value");
  count_ = header.count;
  if (count_ != tokens.token_count()) {
    throw_file_error(path, 8,
                     "the mask has " + std::to_string(count_) + " values but its token shard " +
                         tokens.path() + " has " + std::to_string(tokens.token_count()) +
                         " tokens (a mask holds one value per token)");
  }
  std::vector<std::uint8_t> chunk(std::size_t{1} << 20);
  for (std::int64_t first = 0; first < count_; first += static_cast<std::int64_t>(chunk.size())) {
    const std::int64_t n = std::min<std::int64_t>(count_ - first, chunk.size());
    read_mask(first, n, chunk.data());  // throws naming the first bad value
  }
}

void LlmcMaskShard::read_mask(std::int64_t first, std::int64_t n, std::uint8_t* out) const {
  KILN_CHECK(first >= 0 && n >= 0 && first + n <= count_, "llmc_shards: mask range out of range");
  const std::uint64_t offset = kLlmcShardHeaderBytes + static_cast<std::uint64_t>(first);
  file_.read_at(offset, out, static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    if (out[i] > 1) {
      throw_file_error(path(), offset + static_cast<std::uint64_t>(i),
                       "mask value " + std::to_string(first + i) + " is " + std::to_string(out[i]) +
                           ", not 0 (not trained) or 1 (trained)");
    }
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

void write_llmc_mask(const std::string& path, const std::vector<std::uint8_t>& mask) {
  write_shard(path, mask, kLlmcMaskMagic, kLlmcMaskVersion);
}

// ---------------------------------------------------------------------------------------------

std::int64_t llmc_first_token(const std::string& pattern) {
  const std::vector<std::string> paths = glob_paths(pattern);
  if (paths.empty()) throw InputError(pattern + ": matches no file (llm.c token shards expected)");
  return LlmcShard(paths.front(), std::int64_t{1} << 32).token(0);
}

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
  const std::string mask_suffix = ".mask";
  for (const std::string& path : paths) {
    if (path.size() > mask_suffix.size() &&
        path.compare(path.size() - mask_suffix.size(), mask_suffix.size(), mask_suffix) == 0) {
      throw InputError(pattern + " matches the loss mask " + path +
                       ": the glob must match the token shards only (such as *.bin); each "
                       "shard's mask is found beside it");
    }
  }
  // A glob is chat data (every shard has its mask) or not (none has): a mix would train some
  // shards on every token and others on the assistant's only, which no one means.
  const auto has_mask = [](const std::string& path) { return path_exists(llmc_mask_path(path)); };
  const auto masked = std::find_if(paths.begin(), paths.end(), has_mask);
  const bool use_masks = masked != paths.end();
  const auto unmasked = std::find_if_not(paths.begin(), paths.end(), has_mask);
  if (use_masks && unmasked != paths.end()) {
    throw InputError(pattern + ": " + *masked + " has a loss mask (" + llmc_mask_path(*masked) +
                     ") but " + *unmasked + " has none (" + llmc_mask_path(*unmasked) +
                     " is missing): the shards of one glob must all have masks (chat data from "
                     "kiln tokenize --chat) or none");
  }
  shards_.reserve(paths.size());
  first_window_.push_back(0);
  for (const std::string& path : paths) {
    shards_.emplace_back(path, vocab_size_);
    if (use_masks) masks_.emplace_back(llmc_mask_path(path), shards_.back());
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
         std::to_string(vocab_size_) + (masked() ? ", loss masks" : "") + ")";
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
  if (masked()) {
    // The mask of the targets' tokens, [start + 1, start + T + 1): an untrained one is ignored.
    thread_local std::vector<std::uint8_t> mask;
    mask.resize(static_cast<std::size_t>(seq_len_));
    masks_[static_cast<std::size_t>(where.shard)].read_mask(where.window * seq_len_ + 1, seq_len_,
                                                            mask.data());
    for (std::int64_t t = 0; t < seq_len_; ++t) {
      if (mask[static_cast<std::size_t>(t)] == 0) next[t] = kIgnoreIndex;
    }
  }
  return true;
}

}  // namespace kiln::data
