#include "core/file_kind.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/check.h"

namespace kiln {
namespace {

enum class Kind { kRegular, kDirectory, kOther };

std::string describe_mode(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

Kind kind_of(const std::string& path, std::string& description) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    const int error = errno;
    struct stat link {};
    if (::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode)) {
      description = "a broken symbolic link";
    } else if (error == ENOENT || error == ENOTDIR) {
      description = "nothing (no such file or directory)";
    } else {
      description = std::string("not accessible (") + std::strerror(error) + ")";
    }
    return Kind::kOther;
  }
  description = describe_mode(info.st_mode);
  if (S_ISREG(info.st_mode)) return Kind::kRegular;
  if (S_ISDIR(info.st_mode)) return Kind::kDirectory;
  return Kind::kOther;
}

}  // namespace

std::string describe_file_kind(const std::string& path) {
  std::string description;
  kind_of(path, description);
  return description;
}

namespace {

[[noreturn]] void refuse(const std::string& path, const std::string& what, const char* wanted,
                         const std::string& description) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    throw InputError(path + ": cannot open " + what + ": " + description);
  }
  throw InputError(path + ": " + what + " must be " + wanted + ", but it is " + description);
}

}  // namespace

void require_regular_file(const std::string& path, const std::string& what) {
  std::string description;
  if (kind_of(path, description) != Kind::kRegular) {
    refuse(path, what, "a regular file", description);
  }
}

std::string read_regular_file(const std::string& path, const std::string& what) {
  require_regular_file(path, what);
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    throw InputError(path + ": cannot open " + what + ": " + std::strerror(errno));
  }
  struct Closer {
    int fd;
    ~Closer() { KILN_IGNORE_ERROR(::close(fd)); }  // read-only: a failed close loses nothing
  } closer{fd};
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    throw InputError(path + ": cannot stat " + what + ": " + std::strerror(errno));
  }
  if (!S_ISREG(info.st_mode)) {
    throw InputError(path + ": " + what + " must be a regular file, but it is " +
                     describe_mode(info.st_mode));
  }
  std::string bytes;
  bytes.resize(info.st_size > 0 ? static_cast<std::size_t>(info.st_size) : 4096);
  std::size_t used = 0;
  for (;;) {
    if (used == bytes.size()) bytes.resize(bytes.size() * 2);  // it grew while being read
    const ssize_t got = ::read(fd, &bytes[used], bytes.size() - used);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      throw InputError(path + ": cannot read " + what + " (at byte " + std::to_string(used) +
                       "): " + std::strerror(errno));
    }
    if (got == 0) break;
    used += static_cast<std::size_t>(got);
  }
  bytes.resize(used);
  return bytes;
}

void require_directory(const std::string& path, const std::string& what) {
  std::string description;
  if (kind_of(path, description) != Kind::kDirectory)
    refuse(path, what, "a directory", description);
}

void require_replaceable_file(const std::string& path, const std::string& what) {
  if (path.empty()) throw InputError(what + ": the output path is empty; name a file");
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return;  // nothing there (or a dangling link): created
  std::string description;
  if (kind_of(path, description) == Kind::kRegular) return;
  throw InputError(path + ": " + what + " would replace " + description +
                   "; Kiln writes only over regular files: name a new or regular file");
}

}  // namespace kiln
