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

int LlmcShardWriter::token_bytes_for(std::int64_t vocab_size) {
  return vocab_size <= 65536 ? 2 : 4;
}

LlmcShardWriter::LlmcShardWriter(std::string dir, std::string name, std::string split,
                                 int first_index, std::int64_t shard_tokens,
                                 std::int64_t vocab_size)
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
}

LlmcShardWriter::~LlmcShardWriter() {
  if (!committed_) discard();
}

std::string LlmcShardWriter::shard_path(int i) const {
  char number[16];
  std::snprintf(number, sizeof(number), "%06d", first_index_ + i);
  return join_path(dir_, name_ + "_" + split_ + "_" + number + ".bin");
}

void LlmcShardWriter::open_shard() {
  const std::string path =
      shard_path(shards_started()) + ".tmp." + std::to_string(static_cast<long>(::getpid()));
  ::unlink(path.c_str());  // a leftover of a killed run with the same pid
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd_ < 0) throw_file_error(path, "cannot create: " + errno_text());
  temp_paths_.push_back(path);
  in_shard_ = 0;
  // The header with a count of 0 until the shard is complete: a shard read early is refused.
  std::uint8_t header[kLlmcShardHeaderBytes] = {};
  put_le32(header,
           static_cast<std::uint32_t>(token_bytes_ == 2 ? kLlmcShardMagic : kLlmcShard32Magic));
  put_le32(header + 4,
           static_cast<std::uint32_t>(token_bytes_ == 2 ? kLlmcShardVersion : kLlmcShard32Version));
  buffer_.assign(header, header + kLlmcShardHeaderBytes);
}

void LlmcShardWriter::flush_buffer() {
  if (buffer_.empty()) return;
  const off_t end =
      static_cast<off_t>(kLlmcShardHeaderBytes) + static_cast<off_t>(in_shard_) * token_bytes_;
  write_all_at(fd_, temp_paths_.back(), buffer_.data(), buffer_.size(),
               end - static_cast<off_t>(buffer_.size()));
  buffer_.clear();
}

void LlmcShardWriter::complete_shard() {
  const std::string& path = temp_paths_.back();
  flush_buffer();
  std::uint8_t count[4];
  put_le32(count, static_cast<std::uint32_t>(in_shard_));
  write_all_at(fd_, path, count, sizeof(count), 8);
  // On disk before it is renamed: a shard that has its name is whole, even after a crash.
  if (::fsync(fd_) != 0) throw_file_error(path, "fsync failed: " + errno_text());
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) throw_file_error(path, "close failed: " + errno_text());
}

void LlmcShardWriter::write(const std::uint32_t* tokens, std::size_t n) {
  KILN_CHECK(!committed_, "LlmcShardWriter::write after commit");
  for (std::size_t i = 0; i < n;) {
    if (fd_ < 0) open_shard();
    const std::size_t room = static_cast<std::size_t>(shard_tokens_ - in_shard_);
    const std::size_t take = std::min(room, n - i);
    for (std::size_t k = i; k < i + take; ++k) {
      const std::uint32_t id = tokens[k];
      if (static_cast<std::int64_t>(id) >= vocab_size_) {
        throw InputError(temp_paths_.back() + ": token id " + std::to_string(id) +
                         " is not below the vocabulary size " + std::to_string(vocab_size_));
      }
      buffer_.push_back(static_cast<std::uint8_t>(id));
      buffer_.push_back(static_cast<std::uint8_t>(id >> 8));
      if (token_bytes_ == 4) {
        buffer_.push_back(static_cast<std::uint8_t>(id >> 16));
        buffer_.push_back(static_cast<std::uint8_t>(id >> 24));
      }
    }
    in_shard_ += static_cast<std::int64_t>(take);
    total_ += static_cast<std::int64_t>(take);
    i += take;
    if (in_shard_ == shard_tokens_) {
      complete_shard();
    } else if (buffer_.size() >= kBufferBytes) {
      flush_buffer();
    }
  }
}

std::vector<std::string> LlmcShardWriter::commit() {
  KILN_CHECK(!committed_, "LlmcShardWriter::commit twice");
  if (fd_ >= 0) complete_shard();
  std::vector<std::string> paths;
  for (std::size_t i = 0; i < temp_paths_.size(); ++i) {
    const std::string path = shard_path(static_cast<int>(i));
    if (::rename(temp_paths_[i].c_str(), path.c_str()) != 0) {
      const std::string reason = errno_text();
      for (const std::string& done : paths) KILN_IGNORE_ERROR(::unlink(done.c_str()));
      throw_file_error(temp_paths_[i], "cannot rename to " + path + ": " + reason);
    }
    paths.push_back(path);
  }
  committed_ = true;
  return paths;
}

void LlmcShardWriter::discard() noexcept {
  if (fd_ >= 0) KILN_IGNORE_ERROR(::close(fd_));  // the file is removed next
  fd_ = -1;
  for (const std::string& path : temp_paths_) KILN_IGNORE_ERROR(::unlink(path.c_str()));
  temp_paths_.clear();
  buffer_.clear();
}

}  // namespace kiln::data
