#include "data/file_io.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <utility>

#include "core/check.h"
#include "core/file_kind.h"

namespace kiln::data {

void throw_file_error(const std::string& path, const std::string& what) {
  throw InputError(path + ": " + what);
}

void throw_file_error(const std::string& path, std::uint64_t offset, const std::string& what) {
  throw InputError(path + ": " + what + " (at byte " + std::to_string(offset) + ")");
}

bool path_exists(const std::string& path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0;
}

bool is_directory(const std::string& path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

std::string join_path(const std::string& a, const std::string& b) {
  if (a.empty() || a.back() == '/') return a + b;
  return a + "/" + b;
}

namespace {

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};

std::string errno_text() {
  return std::strerror(errno);
}

std::vector<std::uint8_t> read_plain(const std::string& path) {
  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(path.c_str(), "rb"));
  if (!file) throw_file_error(path, "cannot open: " + errno_text());
  std::vector<std::uint8_t> bytes;
  struct stat info;
  if (::fstat(fileno(file.get()), &info) == 0 && info.st_size > 0) {
    bytes.resize(static_cast<std::size_t>(info.st_size));
  }
  std::size_t got = std::fread(bytes.data(), 1, bytes.size(), file.get());
  if (std::ferror(file.get())) throw_file_error(path, got, "read failed: " + errno_text());
  bytes.resize(got);
  return bytes;
}

std::vector<std::uint8_t> read_gzip(const std::string& path) {
  std::unique_ptr<gzFile_s, GzCloser> file(gzopen(path.c_str(), "rb"));
  if (!file) throw_file_error(path, "cannot open: " + errno_text());
  gzbuffer(file.get(), 1 << 20);
  std::vector<std::uint8_t> bytes(std::size_t{1} << 20);
  std::size_t used = 0;
  for (;;) {
    if (used == bytes.size()) bytes.resize(bytes.size() * 2);
    std::size_t want = std::min<std::size_t>(bytes.size() - used, 1u << 30);
    int got = gzread(file.get(), bytes.data() + used, static_cast<unsigned>(want));
    if (got < 0) {
      int code = Z_OK;
      const char* message = gzerror(file.get(), &code);
      throw_file_error(path, used, std::string("corrupt gzip stream: ") + message);
    }
    if (got == 0) break;
    used += static_cast<std::size_t>(got);
  }
  // A stream cut short reads as a clean end in some zlib versions: ask explicitly.
  int code = Z_OK;
  const char* message = gzerror(file.get(), &code);
  if (code != Z_OK && code != Z_STREAM_END) {
    throw_file_error(path, used, std::string("corrupt or truncated gzip stream: ") + message);
  }
  bytes.resize(used);
  return bytes;
}

}  // namespace

PositionalFile::PositionalFile(const std::string& path) : path_(path) {
  require_regular_file(path, "a data file");
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd_ < 0) throw_file_error(path, "cannot open: " + errno_text());
  struct stat info;
  if (::fstat(fd_, &info) != 0 || !S_ISREG(info.st_mode)) {
    const std::string reason = S_ISREG(info.st_mode) ? errno_text() : "not a regular file";
    close();
    throw_file_error(path, "cannot stat: " + reason);
  }
  size_ = static_cast<std::uint64_t>(info.st_size);
}

PositionalFile::~PositionalFile() {
  close();
}

PositionalFile::PositionalFile(PositionalFile&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      size_(std::exchange(other.size_, 0)) {}

PositionalFile& PositionalFile::operator=(PositionalFile&& other) noexcept {
  if (this != &other) {
    close();
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void PositionalFile::close() noexcept {
  if (fd_ >= 0) KILN_IGNORE_ERROR(::close(fd_));  // read-only: a failed close loses nothing
  fd_ = -1;
}

void PositionalFile::read_at(std::uint64_t offset, void* out, std::size_t size) const {
  auto* p = static_cast<std::uint8_t*>(out);
  std::size_t done = 0;
  while (done < size) {
    const ssize_t got = ::pread(fd_, p + done, size - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      throw_file_error(path_, offset + done,
                       "read of " + std::to_string(size) + " bytes failed: " + errno_text());
    }
    if (got == 0) {
      struct stat info;
      const std::string now = ::fstat(fd_, &info) == 0 ? std::to_string(info.st_size) + " bytes"
                                                       : "of unknown size (" + errno_text() + ")";
      throw_file_error(path_, "the file ends before bytes [" + std::to_string(offset) + ", " +
                                  std::to_string(offset + size) + "): it had " +
                                  std::to_string(size_) + " bytes when opened and is now " + now +
                                  " (truncated or rewritten while in use?)");
    }
    done += static_cast<std::size_t>(got);
  }
}

std::vector<std::string> glob_paths(const std::string& pattern) {
  glob_t found{};
  const int status = ::glob(pattern.c_str(), 0, nullptr, &found);
  const std::string reason = errno_text();  // before globfree can change errno
  std::vector<std::string> paths;
  if (status == 0) {
    for (std::size_t i = 0; i < found.gl_pathc; ++i) paths.emplace_back(found.gl_pathv[i]);
  }
  ::globfree(&found);
  if (status == GLOB_NOSPACE) throw InputError(pattern + ": glob ran out of memory");
  if (status == GLOB_ABORTED) {
    throw InputError(pattern + ": glob could not read a directory on the way: " + reason);
  }
  // glob(3) sorts by the locale's collation; bytewise order is the same on every machine.
  std::sort(paths.begin(), paths.end());
  return paths;
}

std::vector<std::uint8_t> read_file(const std::string& path) {
  require_regular_file(path, "a data file");
  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(path.c_str(), "rb"));
  if (!file) throw_file_error(path, "cannot open: " + errno_text());
  unsigned char magic[2] = {0, 0};
  std::size_t got = std::fread(magic, 1, 2, file.get());
  file.reset();
  if (got == 2 && magic[0] == 0x1f && magic[1] == 0x8b) return read_gzip(path);
  return read_plain(path);
}

void write_file(const std::string& path, const void* bytes, std::size_t size, bool gzip) {
  if (gzip) {
    std::unique_ptr<gzFile_s, GzCloser> file(gzopen(path.c_str(), "wb"));
    if (!file) throw_file_error(path, "cannot create: " + errno_text());
    const auto* p = static_cast<const std::uint8_t*>(bytes);
    std::size_t done = 0;
    while (done < size) {
      unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(size - done, 1u << 30));
      if (gzwrite(file.get(), p + done, chunk) != static_cast<int>(chunk)) {
        throw_file_error(path, done, "gzip write failed");
      }
      done += chunk;
    }
    if (gzclose(file.release()) != Z_OK) throw_file_error(path, "gzip close failed");
    return;
  }
  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(path.c_str(), "wb"));
  if (!file) throw_file_error(path, "cannot create: " + errno_text());
  if (size > 0 && std::fwrite(bytes, 1, size, file.get()) != size) {
    throw_file_error(path, "write failed: " + errno_text());
  }
  if (std::fclose(file.release()) != 0) throw_file_error(path, "close failed: " + errno_text());
}

}  // namespace kiln::data
