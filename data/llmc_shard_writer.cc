#include "data/llmc_shard_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/check.h"
#include "data/file_io.h"
#include "data/llmc_shards.h"

namespace kiln::data {
namespace {

constexpr std::size_t kBufferBytes = std::size_t{4} << 20;

std::string errno_text() {
  return std::strerror(errno);
}

void put_le32(std::uint8_t* p, std::uint32_t value) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::uint8_t>(value >> (8 * i));
}

// All of [data, data + size) at `offset`, or InputError naming the file.
void write_all_at(int fd, const std::string& path, const std::uint8_t* data, std::size_t size,
                  off_t offset) {
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pwrite(fd, data + done, size - done, offset + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      throw_file_error(path, static_cast<std::uint64_t>(offset) + done,
                       "write failed: " + (n < 0 ? errno_text() : std::string("no progress")));
    }
    done += static_cast<std::size_t>(n);
  }
}

}  // namespace

// The temporary files of one kind (token shards or their masks): one open at a time, its bytes
// buffered; completed (the header's count filled in, flushed to disk, closed) when full; renamed
// or removed together.
class LlmcShardWriter::Files {
 public:
  Files(std::int32_t magic, std::int32_t version, int width)
      : magic_(magic), version_(version), width_(width) {}
  ~Files() { discard(); }
  Files(const Files&) = delete;
  Files& operator=(const Files&) = delete;

  void open(const std::string& path) {
    ::unlink(path.c_str());  // a leftover of a killed run with the same pid
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd_ < 0) throw_file_error(path, "cannot create: " + errno_text());
    temp_paths_.push_back(path);
    // The header with a count of 0 until the file is complete: a file read early is refused.
    std::uint8_t header[kLlmcShardHeaderBytes] = {};
    put_le32(header, static_cast<std::uint32_t>(magic_));
    put_le32(header + 4, static_cast<std::uint32_t>(version_));
    buffer_.assign(header, header + kLlmcShardHeaderBytes);
  }
  bool is_open() const { return fd_ >= 0; }
  std::vector<std::uint8_t>& buffer() { return buffer_; }
  // Writes the buffer; the open file then holds `items` items.
  void flush(std::int64_t items) {
    if (buffer_.empty()) return;
    const off_t end =
        static_cast<off_t>(kLlmcShardHeaderBytes) + static_cast<off_t>(items) * width_;
    write_all_at(fd_, temp_paths_.back(), buffer_.data(), buffer_.size(),
                 end - static_cast<off_t>(buffer_.size()));
    buffer_.clear();
  }
  void complete(std::int64_t items) {
    const std::string& path = temp_paths_.back();
    flush(items);
    std::uint8_t count[4];
    put_le32(count, static_cast<std::uint32_t>(items));
    write_all_at(fd_, path, count, sizeof(count), 8);
    // On disk before it is renamed: a file that has its name is whole, even after a crash.
    if (::fsync(fd_) != 0) throw_file_error(path, "fsync failed: " + errno_text());
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) throw_file_error(path, "close failed: " + errno_text());
  }
  int files_started() const { return static_cast<int>(temp_paths_.size()); }
  const std::vector<std::string>& temp_paths() const { return temp_paths_; }
  void forget() { temp_paths_.clear(); }  // renamed: nothing left to remove
  void discard() noexcept {
    if (fd_ >= 0) KILN_IGNORE_ERROR(::close(fd_));  // the file is removed next
    fd_ = -1;
    for (const std::string& path : temp_paths_) KILN_IGNORE_ERROR(::unlink(path.c_str()));
    temp_paths_.clear();
    buffer_.clear();
  }

 private:
  std::int32_t magic_, version_;
  int width_;
  std::vector<std::string> temp_paths_;  // every file started, in order
  int fd_ = -1;                          // the open file's, or -1
  std::vector<std::uint8_t> buffer_;     // bytes not yet written to the open file
};

int LlmcShardWriter::token_bytes_for(std::int64_t vocab_size) {
  return vocab_size <= 65536 ? 2 : 4;
}

LlmcShardWriter::LlmcShardWriter(std::string dir, std::string name, std::string split,
                                 int first_index, std::int64_t shard_tokens,
                                 std::int64_t vocab_size, bool masks)
    : dir_(std::move(dir)),
      name_(std::move(name)),
      split_(std::move(split)),
      first_index_(first_index),
      shard_tokens_(shard_tokens),
      vocab_size_(vocab_size),
      token_bytes_(token_bytes_for(vocab_size)) {
  if (shard_tokens_ < 1 || shard_tokens_ > 0x7fffffff) {
    throw InputError("shard size " + std::to_string(shard_tokens_) +
                     " tokens: must be from 1 to 2147483647 (an llm.c header counts tokens in an "
                     "int32)");
  }
  if (vocab_size_ < 1 || vocab_size_ > (std::int64_t{1} << 32)) {
    throw InputError("vocabulary size " + std::to_string(vocab_size_) +
                     ": an llm.c shard holds ids of at most 32 bits");
  }
  tokens_ = std::make_unique<Files>(token_bytes_ == 2 ? kLlmcShardMagic : kLlmcShard32Magic,
                                    token_bytes_ == 2 ? kLlmcShardVersion : kLlmcShard32Version,
                                    token_bytes_);
  if (masks) masks_ = std::make_unique<Files>(kLlmcMaskMagic, kLlmcMaskVersion, 1);
}

LlmcShardWriter::~LlmcShardWriter() {
  if (!committed_) discard();
}

std::string LlmcShardWriter::shard_path(int i) const {
  char number[16];
  std::snprintf(number, sizeof(number), "%06d", first_index_ + i);
  return join_path(dir_, name_ + "_" + split_ + "_" + number + ".bin");
}

int LlmcShardWriter::shards_started() const {
  return tokens_->files_started();
}

void LlmcShardWriter::complete_shard() {
  tokens_->complete(in_shard_);
  if (masks_) masks_->complete(in_shard_);
}

void LlmcShardWriter::write(const std::uint32_t* tokens, const std::uint8_t* mask, std::size_t n) {
  KILN_CHECK(!committed_, "LlmcShardWriter::write after commit");
  KILN_CHECK(!masks_ || mask != nullptr, "LlmcShardWriter::write: a writer of masks needs them");
  for (std::size_t i = 0; i < n;) {
    if (!tokens_->is_open()) {
      const std::string path = shard_path(shards_started());
      const std::string temp = ".tmp." + std::to_string(static_cast<long>(::getpid()));
      tokens_->open(path + temp);
      if (masks_) masks_->open(llmc_mask_path(path) + temp);
      in_shard_ = 0;
    }
    const std::size_t room = static_cast<std::size_t>(shard_tokens_ - in_shard_);
    const std::size_t take = std::min(room, n - i);
    std::vector<std::uint8_t>& buffer = tokens_->buffer();
    for (std::size_t k = i; k < i + take; ++k) {
      const std::uint32_t id = tokens[k];
      if (static_cast<std::int64_t>(id) >= vocab_size_) {
        throw InputError(tokens_->temp_paths().back() + ": token id " + std::to_string(id) +
                         " is not below the vocabulary size " + std::to_string(vocab_size_));
      }
      buffer.push_back(static_cast<std::uint8_t>(id));
      buffer.push_back(static_cast<std::uint8_t>(id >> 8));
      if (token_bytes_ == 4) {
        buffer.push_back(static_cast<std::uint8_t>(id >> 16));
        buffer.push_back(static_cast<std::uint8_t>(id >> 24));
      }
    }
    if (masks_) {
      for (std::size_t k = i; k < i + take; ++k) {
        KILN_CHECK(mask[k] <= 1, "LlmcShardWriter::write: a mask value is 0 or 1");
      }
      masks_->buffer().insert(masks_->buffer().end(), mask + i, mask + i + take);
    }
    in_shard_ += static_cast<std::int64_t>(take);
    total_ += static_cast<std::int64_t>(take);
    i += take;
    if (in_shard_ == shard_tokens_) {
      complete_shard();
    } else if (buffer.size() >= kBufferBytes) {
      tokens_->flush(in_shard_);
      if (masks_) masks_->flush(in_shard_);
    }
  }
}

std::vector<std::string> LlmcShardWriter::commit() {
  KILN_CHECK(!committed_, "LlmcShardWriter::commit twice");
  if (tokens_->is_open()) complete_shard();
  // The masks first: a shard under its name always has its mask.
  std::vector<std::string> renamed, paths;
  for (Files* files : {masks_.get(), tokens_.get()}) {
    if (files == nullptr) continue;
    const std::vector<std::string>& temps = files->temp_paths();
    for (std::size_t i = 0; i < temps.size(); ++i) {
      const std::string shard = shard_path(static_cast<int>(i));
      const std::string path = files == masks_.get() ? llmc_mask_path(shard) : shard;
      if (::rename(temps[i].c_str(), path.c_str()) != 0) {
        const std::string reason = errno_text();
        for (const std::string& done : renamed) KILN_IGNORE_ERROR(::unlink(done.c_str()));
        throw_file_error(temps[i], "cannot rename to " + path + ": " + reason);
      }
      renamed.push_back(path);
      if (files == tokens_.get()) paths.push_back(path);
    }
  }
  tokens_->forget();
  if (masks_) masks_->forget();
  committed_ = true;
  return paths;
}

void LlmcShardWriter::discard() noexcept {
  tokens_->discard();
  if (masks_) masks_->discard();
}

}  // namespace kiln::data
